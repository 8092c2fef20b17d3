"""Regenerate every assistant turn with the target itself (on-policy data).

Multi-turn prompts are answered turn by turn: the target's own earlier answers are fed back
as the history. Backends (`generate(convs, seeds, sampling) -> [Reply | exception]`):
`DecoderBackend` (decoder_backend.py, the default: dspark's static-cache batched decoder, rows
grouped by prompt length), `HFBackend` (here: batched HF `generate`, left padding, the
fallback) and `OpenAIBackend` (openai_backend.py: any OpenAI-compatible server, vLLM/SGLang).
All render prompts with the chat template and `add_generation_prompt`.

Resumable: `regenerated.jsonl` is appended row by row with the source row `index`; a rerun
skips indices already there (a half-written last line from a kill is cut off first), so kill
and rerun gives no duplicated and no lost rows. Sampling is per row: each row's random stream
is seeded from `(seed, row index, turn)`, and batches are the fixed groups of `batch_size`
consecutive rows of the prompt list, so a resumed run equals an uninterrupted one (with the
same batch size; a different batch composition changes padding, which can flip near-ties in
floating point). `batch_size` here is the rows handed to the backend per call (a chunk, written
when it is done); `DecoderBackend` decodes a chunk in length-sorted groups of its own size.

Files in the output directory: `regenerated.jsonl`, `failures.jsonl` (one line per failed
attempt with its reason; failed rows are retried by the next run), `rejected.jsonl` (input
rows that could not be normalised), `run.json` (the settings; a rerun with other settings is
refused) and `summary.json`. A directory holding any of these names without a regeneration's
`run.json` is another tool's and is refused rather than overwritten (`check_output`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from dspark.errors import BadInputError
from dspark.fileio import write_text_atomic

OUTPUT = "regenerated.jsonl"
FAILURES = "failures.jsonl"
REJECTED = "rejected.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    seed: int = 0


@dataclass
class Reply:
    text: str
    tokens: int
    finish_reason: str  # "stop" | "length"
    reasoning: str | None = None  # a server's reasoning_content, kept on request


class GenerationFailed(RuntimeError):
    pass


def row_seed(seed: int, index: int, turn: int) -> int:
    """The per-row, per-turn sampling seed (63 bits, the same on every machine)."""
    digest = hashlib.sha256(f"{seed}:{index}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class _RowSampler:
    """A logits processor that samples each row from its own generator.

    It returns scores that are -inf everywhere except the sampled token, so HF's greedy step
    picks it: each row's draws depend only on its own seed, never on its batch neighbours.
    """

    def __init__(self, seeds, sampling: SamplingConfig, device):
        self.gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.s = sampling

    def __call__(self, input_ids, scores):
        logits = scores.float() / self.s.temperature
        if self.s.top_k and self.s.top_k > 0:
            k = min(self.s.top_k, logits.shape[-1])
            kth = torch.topk(logits, k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.s.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop = cum - sorted_logits.softmax(-1) >= self.s.top_p  # keep the first past top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        probs = logits.softmax(-1)
        out = torch.full_like(scores, float("-inf"))
        for i, g in enumerate(self.gens):
            tok = torch.multinomial(probs[i], 1, generator=g)
            out[i, tok] = 0.0
        return out


def stop_token_ids(tokenizer, chat_template_kwargs=None) -> list[int]:
    """The ids that end an answer: the chat template's end-of-turn marker(s) and EOS."""
    from dspark.data.masks import end_of_turn_ids

    stop = set(end_of_turn_ids(tokenizer, chat_template_kwargs or {}))
    if tokenizer.eos_token_id is not None:
        stop.add(tokenizer.eos_token_id)
    return sorted(stop)


def prompt_texts(tokenizer, convs, chat_template_kwargs=None) -> list[str]:
    """Each conversation rendered by the chat template, ready for the assistant's answer."""
    kw = chat_template_kwargs or {}
    return [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True, **kw)
        for c in convs
    ]


def reply_from_tokens(tokenizer, tokens: list[int], stop_ids) -> Reply:
    """A `Reply` from generated ids: cut at the first stop id (counted, not decoded)."""
    cut = next((j for j, t in enumerate(tokens) if t in stop_ids), None)
    body = tokens if cut is None else tokens[:cut]
    text = tokenizer.decode(body, skip_special_tokens=True)
    return Reply(text, len(body) + (cut is not None), "length" if cut is None else "stop")


class HFBackend:
    """Batched `model.generate` with left padding and the target's chat template."""

    name = "hf"

    def __init__(self, model, tokenizer, chat_template_kwargs=None):
        self.model, self.tok = model, tokenizer
        self.kw = chat_template_kwargs or {}
        self.stop_ids = stop_token_ids(tokenizer, self.kw)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        )

    @property
    def device(self):
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, convs, seeds, sampling: SamplingConfig):
        from transformers import GenerationConfig, LogitsProcessorList

        texts = prompt_texts(self.tok, convs, self.kw)
        side = self.tok.padding_side
        self.tok.padding_side = "left"
        try:
            enc = self.tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        finally:
            self.tok.padding_side = side
        enc = {k: v.to(self.device) for k, v in enc.items()}
        cfg = GenerationConfig(
            do_sample=False,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
        )
        procs = LogitsProcessorList()
        if sampling.temperature > 0:
            procs.append(_RowSampler(seeds, sampling, self.device))
        out = self.model.generate(**enc, generation_config=cfg, logits_processor=procs)
        new = out[:, enc["input_ids"].shape[1] :].tolist()
        stop = set(self.stop_ids)
        return [reply_from_tokens(self.tok, row, stop) for row in new]


# ---------------------------------------------------------------------------------------------


def _repair_and_read(path: Path) -> set[int]:
    """Indices already in the output; cut off a half-written last line left by a kill."""
    done: set[int] = set()
    if not path.exists():
        return done
    good = 0
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # no newline: the line was cut by a kill
        line = data[pos:nl]
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError):
            break
        pos = good = nl + 1
    if good != len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
    return done


LOCAL_BACKENDS = ("hf", "decoder")


def _comparable(settings: dict) -> dict:
    """Settings as a resume compares them: at T = 0 the local backends are interchangeable
    (their greedy answers are equal token for token), so `hf:X` and `decoder:X` match; a run
    without `keep_reasoning` is one that did not keep it."""
    s = dict(settings)
    name, _, rest = str(s.get("generator", "")).partition(":")
    greedy = (s.get("sampling") or {}).get("temperature", 0) <= 0
    if greedy and name in LOCAL_BACKENDS and rest:
        s["generator"] = f"local:{rest}"
    s["keep_reasoning"] = bool(s.get("keep_reasoning", False))
    return s


# The command-line option behind each setting, for the message that refuses a resume.
SETTING_FLAGS = {
    "source": "--input/--skip/--where",
    "target": "--target",
    "generator": "--backend/--server/--target",
    "split": "--split",
    "chat_template_kwargs": "--chat-template-kwargs",
    "keep_reasoning": "--keep-reasoning",
    "sampling.temperature": "--temperature",
    "sampling.top_p": "--top-p",
    "sampling.top_k": "--top-k",
    "sampling.max_new_tokens": "--max-new-tokens",
    "sampling.seed": "--seed",
}


def _differences(old: dict, new: dict) -> list[str]:
    """`key was OLD, now NEW (--flag)` for each setting of `new` that `old` does not match
    (the sampling dict key by key; `keep_reasoning` also when only the old run had it)."""
    cmp_old, cmp_new = _comparable(old), _comparable(new)
    keys = list(new) + (["keep_reasoning"] if "keep_reasoning" not in new else [])
    out = []
    for k in keys:
        if cmp_old.get(k) == cmp_new.get(k):
            continue
        a, b = (cmp_old[k], cmp_new[k]) if k == "keep_reasoning" else (old.get(k), new.get(k))
        if isinstance(a, dict) and isinstance(b, dict) and k == "sampling":
            parts = [(f"{k}.{j}", a.get(j), b.get(j)) for j in b if a.get(j) != b.get(j)]
        else:
            parts = [(k, a, b)]
        for name, was, now in parts:
            flag = SETTING_FLAGS.get(name)
            out.append(f"{name} was {was!r}, now {now!r}" + (f" ({flag})" if flag else ""))
    return out


def read_run(out: Path) -> dict | None:
    """The settings in `out/run.json` when a regeneration wrote it, None when there is none;
    a `run.json` that is not a regeneration's is refused (it would be overwritten)."""
    from dspark.data.outputs import read_json_object

    run = out / RUN
    if not run.exists():
        return None
    old = read_json_object(run)
    if old is None or not {"source", "sampling"} <= set(old):
        raise BadInputError(
            f"--output {out}: {run} was not written by a regeneration (it is not a JSON object "
            "with `source` and `sampling`); pass a new --output directory, or move that file away"
        )
    return old


def check_output(out: str | os.PathLike, settings: dict | None = None) -> Path:
    """Refuse an output directory a regeneration cannot use, before anything is written: a
    file, an unwritable directory, one holding another tool's files of the same names, or an
    earlier regeneration with other `settings` (when given; `run.json` holds the old ones)."""
    from dspark.data.outputs import refuse_foreign, require_output_dir, require_writable_files

    path = require_output_dir(out)
    old = read_run(path) if path.is_dir() else None
    if old is None:
        refuse_foreign(
            path, (OUTPUT, FAILURES, REJECTED, SUMMARY), marker=RUN, what="a regeneration"
        )
    elif settings is not None:
        diff = _differences(old, settings)
        if diff:
            raise BadInputError(
                f"--output {path} holds a regeneration made with other settings: "
                + "; ".join(diff)
                + ". Rerun with the same settings to resume it, or pass a new --output directory"
            )
    require_writable_files(path, (OUTPUT, FAILURES, REJECTED, SUMMARY))
    return path


def run_settings(prompts, sampling: SamplingConfig, settings: dict | None = None) -> dict:
    """What `run.json` records and a resume compares: the source, the sampling, `settings`."""
    return {"source": prompts.source, "sampling": asdict(sampling), **(settings or {})}


def _split_turns(messages):
    system = [m for m in messages[:1] if m["role"] == "system"]
    users = [m for m in messages if m["role"] == "user"]
    return system, users


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
) -> dict:
    """Answer every user turn of `prompts` (a `PromptSet`) with `backend`; return the summary.

    Existing assistant turns in the prompts are dropped and regenerated. See the module
    docstring for the files written and the resume guarantees.
    """
    from tqdm.auto import tqdm

    sampling = sampling or SamplingConfig()
    run = run_settings(prompts, sampling, settings)
    out = check_output(output_dir, run)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / RUN).exists():
        write_text_atomic(out / RUN, json.dumps(run, indent=2) + "\n")
    prompts.write_rejected(out / REJECTED)
    done = _repair_and_read(out / OUTPUT)
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
    }
    t0 = time.monotonic()
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
    bar.close()
    elapsed = time.monotonic() - t0
    stats.update(
        elapsed_s=round(elapsed, 3),
        tokens_per_s=round(stats["generated_tokens"] / max(elapsed, 1e-9), 2),
        rows_in_output=len(_repair_and_read(out / OUTPUT)),
        output=str(out / OUTPUT),
    )
    write_text_atomic(out / SUMMARY, json.dumps(stats, indent=2) + "\n")
    if log:
        log(
            f"regenerate: {stats['rows_done']} rows done, {stats['rows_failed']} failed, "
            f"{stats['rows_skipped']} skipped (already done), {stats['rows_rejected']} rejected "
            f"inputs; {stats['generated_tokens']} tokens in {elapsed:.1f}s "
            f"({stats['tokens_per_s']} tok/s) -> {out / OUTPUT}"
        )
    return stats


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
