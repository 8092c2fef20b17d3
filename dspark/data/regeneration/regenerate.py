"""Regenerate every assistant turn with the target itself (on-policy data).

Multi-turn prompts are answered turn by turn: the target's own earlier answers are fed back
as the history. Backends (`generate(convs, seeds, sampling) -> [Reply | exception]`, the
contract in sampling.py): `DecoderBackend` (decoder_backend.py, the default: dspark's
static-cache decoder, batched continuously in prompt-length order), `HFBackend` (hf_backend.py:
batched HF `generate`, left padding, the fallback), `LlamaCppBackend` (llama_cpp_backend.py:
llama.cpp's server on the target's GGUF, its slots batching concurrent requests) and
`OpenAIBackend` (openai_backend.py: any OpenAI-compatible server, vLLM/SGLang). All render prompts with the chat template and
`add_generation_prompt`.

Resumable: `regenerated.jsonl` is appended row by row with the source row `index`; a rerun
skips indices already there (a half-written last line from a kill is cut off first), so kill
and rerun gives no duplicated and no lost rows. Sampling is per row: each row's random stream
is seeded from `(seed, row index, turn)`, and chunks are the fixed groups of `batch_size`
consecutive rows of the prompt list, so a resumed run equals an uninterrupted one (with the
same batch size; a different batch composition changes padding, which can flip near-ties in
floating point). `batch_size` here is the rows handed to the backend per call (a chunk, written
when it is done); `DecoderBackend` decodes a chunk `--batch-size` rows at a time, continuously.

The output directory's files (`regenerated.jsonl`, `failures.jsonl`, `rejected.jsonl`,
`run.json`, `summary.json`) and the resume checks: run_files.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from dspark.data.regeneration.run_files import (
    FAILURES,
    OUTPUT,
    REJECTED,
    RUN,
    RUNS,
    SUMMARY,
    check_output,
    repair_and_read,
    run_settings,
)
from dspark.data.regeneration.sampling import SamplingConfig, row_seed
from dspark.fileio import write_text_atomic
from dspark.locking import writes_output


def _torch_threads() -> int | None:
    """The CPU threads a local backend decodes with (torch, which it has loaded); None for a
    server backend. Read from the loaded module so the command line's --help stays light."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _split_turns(messages):
    system = [m for m in messages[:1] if m["role"] == "system"]
    users = [m for m in messages if m["role"] == "user"]
    return system, users


@writes_output("output_dir", "the regeneration output")
def regenerate(
    prompts,
    backend,
    output_dir,
    *,
    sampling: SamplingConfig | None = None,
    batch_size: int = 8,
    settings: dict | None = None,
    progress: bool = True,
    log=print,
    stop_after_s: float | None = None,
) -> dict:
    """Answer every user turn of `prompts` (a `PromptSet`) with `backend`; return the summary.

    Existing assistant turns in the prompts are dropped and regenerated. See the module
    docstring for the files written and the resume guarantees. One writer at a time: a second
    job on the same `output_dir` gets `OutputBusyError` (dspark/locking.py).

    `stop_after_s`: stop at the first chunk boundary past that many seconds, after one chunk
    at least (a long build in bounded steps; a rerun continues). `summary.json` says `"complete": false` while a run is
    under way, after a kill and after such a stop, so a reader can tell a finished set.
    """
    from tqdm.auto import tqdm  # start-up: keeps the data command lines' --help instant

    sampling = sampling or SamplingConfig()
    run = run_settings(prompts, sampling, settings)
    out = check_output(output_dir, run)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / RUN).exists():
        write_text_atomic(out / RUN, json.dumps(run, indent=2) + "\n")
    prompts.write_rejected(out / REJECTED)
    done = repair_and_read(out / OUTPUT)
    rows = prompts.rows
    todo = [r for r in rows if r["index"] not in done]
    stats: dict[str, Any] = {  # counters; the timing and output keys join at the end
        "batch_size": batch_size,
        "rows_total": len(rows),
        "rows_skipped": len(rows) - len(todo),
        "rows_done": 0,
        "rows_failed": 0,
        "rows_rejected": len(prompts.rejected),
        "generated_tokens": 0,
        "turns": 0,
        "complete": False,
    }
    write_text_atomic(out / SUMMARY, json.dumps(stats, indent=2) + "\n")  # until it ends
    t0, cpu0, server0 = time.monotonic(), time.process_time(), _server_cpu_s(backend)
    bar = tqdm(
        total=len(todo), unit="row", disable=not progress, dynamic_ncols=True, desc="regenerate"
    )
    with (
        open(out / OUTPUT, "a", encoding="utf-8") as fout,
        open(out / FAILURES, "a", encoding="utf-8") as ffail,
    ):
        for start in range(0, len(rows), batch_size):
            batch = [r for r in rows[start : start + batch_size] if r["index"] not in done]
            if not batch:
                continue
            results = _answer_batch(batch, backend, sampling)
            for row, res in zip(batch, results):
                if isinstance(res, dict):
                    fout.write(json.dumps(res, ensure_ascii=False) + "\n")
                    stats["rows_done"] += 1
                    stats["generated_tokens"] += res["generated_tokens"]
                    stats["turns"] += len(res["finish_reasons"])
                else:
                    turn, reason = res
                    ffail.write(
                        json.dumps(
                            {"index": row["index"], "turn": turn, "reason": reason},
                            ensure_ascii=False,
                        )
                        + "\n"
                    )
                    stats["rows_failed"] += 1
            fout.flush()
            ffail.flush()
            os.fsync(fout.fileno())
            bar.update(len(batch))
            dt = max(time.monotonic() - t0, 1e-9)
            bar.set_postfix(
                tok_s=f"{stats['generated_tokens'] / dt:.1f}", failed=stats["rows_failed"]
            )
            if stop_after_s is not None and dt >= stop_after_s:  # each run does >= 1 chunk
                break
    bar.close()
    elapsed = time.monotonic() - t0
    server1 = _server_cpu_s(backend)
    if server0 is not None and server1 is not None:
        # this process's CPU seconds and its engine server's, all threads: a paused or crowded
        # run's wall time overstates them (unknown where a server's cannot be read: left out)
        stats["cpu_s"] = round(time.process_time() - cpu0 + server1 - server0, 3)
    stats.update(
        elapsed_s=round(elapsed, 3),
        tokens_per_s=round(stats["generated_tokens"] / max(elapsed, 1e-9), 2),
        rows_in_output=len(repair_and_read(out / OUTPUT)),
        output=str(out / OUTPUT),
        # every row attempted (a failed row is retried by a rerun, and counted here)
        complete=stats["rows_done"] + stats["rows_failed"] == len(todo),
    )
    write_text_atomic(out / SUMMARY, json.dumps(stats, indent=2) + "\n")
    with open(out / RUNS, "a", encoding="utf-8") as f:  # every run's cost: a build's CPU-hours
        # the backend names its engine: dtype and live batch (DecoderBackend), or quant,
        # threads and slots (LlamaCppBackend)
        engine = backend.conditions() if hasattr(backend, "conditions") else {}
        f.write(json.dumps({**stats, "threads": _torch_threads(), **engine}) + "\n")
    if log:
        log(
            f"regenerate: {stats['rows_done']} rows done, {stats['rows_failed']} failed, "
            f"{stats['rows_skipped']} skipped (already done), {stats['rows_rejected']} rejected "
            f"inputs; {stats['generated_tokens']} tokens in {elapsed:.1f}s "
            f"({stats['tokens_per_s']} tok/s) -> {out / OUTPUT}"
        )
        if not stats["complete"]:
            left = len(todo) - stats["rows_done"] - stats["rows_failed"]
            log(f"regenerate: stopped with {left} of {len(rows)} rows left; rerun the same "
                "command to continue")  # fmt: skip
    return stats


def _server_cpu_s(backend) -> float | None:
    """CPU seconds a backend's engine spent in a process of its own (a native llama-server);
    0.0 for a backend that decodes in this process."""
    read = getattr(backend, "server_cpu_s", None)
    return 0.0 if read is None else read()


def _answer_batch(batch, backend, sampling):
    """Per row: the output dict, or `(turn, reason)` when a turn failed."""
    state = []
    for row in batch:
        system, users = _split_turns(row["messages"])
        state.append(
            {
                "row": row,
                "history": list(system),
                "users": users,
                "finish": [],
                "tokens": 0,
                "error": None,
            }
        )
    turn = 0
    while True:
        active = [s for s in state if s["error"] is None and turn < len(s["users"])]
        if not active:
            break
        convs = [s["history"] + [s["users"][turn]] for s in active]
        seeds = [row_seed(sampling.seed, s["row"]["index"], turn) for s in active]
        replies = _generate_safely(backend, convs, seeds, sampling)
        for s, conv, rep in zip(active, convs, replies):
            if isinstance(rep, BaseException):
                s["error"] = (turn, f"{type(rep).__name__}: {rep}")
            elif not rep.text.strip():
                s["error"] = (
                    turn,
                    f"empty answer from the target ({rep.tokens} tokens, "
                    f"finish={rep.finish_reason})",
                )
            else:
                answer = {"role": "assistant", "content": rep.text}
                if rep.reasoning:
                    answer["reasoning_content"] = rep.reasoning
                s["history"] = conv + [answer]
                s["finish"].append(rep.finish_reason)
                s["tokens"] += rep.tokens
        turn += 1
    results = []
    for s in state:
        if s["error"] is not None:
            results.append(s["error"])
        else:
            results.append(
                {
                    "index": s["row"]["index"],
                    "messages": s["history"],
                    "finish_reasons": s["finish"],
                    "generated_tokens": s["tokens"],
                }
            )
    return results


def _generate_safely(backend, convs, seeds, sampling):
    """Run a batch; when the whole batch fails, retry its rows one by one to isolate bad ones."""
    try:
        return backend.generate(convs, seeds, sampling)
    except Exception as e:
        if len(convs) == 1:
            return [e]
        print(
            f"regenerate: batch of {len(convs)} failed ({type(e).__name__}: {e}); "
            "retrying its rows one by one",
            file=sys.stderr,
        )
        out = []
        for c, s in zip(convs, seeds):
            try:
                out.extend(backend.generate([c], [s], sampling))
            except Exception as e1:
                out.append(e1)
        return out
