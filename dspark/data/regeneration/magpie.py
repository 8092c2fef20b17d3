"""Chat prompts the target writes itself (Magpie): sample the user's turn, keep the good ones.

The target's chat template is rendered up to where a user's message begins (the pre-query
template, e.g. SmolLM2's `<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n`), and the
target samples what follows until its end-of-turn token: an instruction tuned model writes
the kind of request it was tuned on. Those messages become `{"turns": [message]}` prompts,
which `regenerate.py --input` answers with the same target.

Pure parts: `pre_query_template` (derived from the tokenizer's template by rendering a
conversation whose user message is a sentinel and cutting at it, checked with a second
sentinel; no per-family strings), `magpie_seed` and `select_prompts` (filters, bench overlap,
deduplication; dspark/data/prompts/prompt_filter.py). Generation: `sample_messages` on any
`generate_ids(ids, seeds, sampling)` backend (`DecoderBackend`, the decoder's batched AR path).

Files in the output directory: `samples.jsonl` (every sampled message with its row index and
seed, appended one chunk at a time and fsynced; a half-written last line from a kill is cut
off, so a rerun continues where it stopped and never writes a row twice), `run.json` (the
settings a rerun must match), and, rebuilt from the samples after every run (atomic
replacement, a pure function of them): `prompts.jsonl` (the kept prompts), `rejected.jsonl`
(index, reason, and what it duplicated) and `summary.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dspark.data.masks import template_of
from dspark.data.outputs import read_json_object, refuse_foreign, require_output_dir
from dspark.data.prompts.diversity import prompt_diversity
from dspark.data.prompts.prompt_filter import (
    NEAR_THRESHOLD,
    BenchOverlap,
    NearDuplicateIndex,
    junk_reason,
    normalize,
    shingles,
)
from dspark.data.regeneration.sampling import SamplingConfig
from dspark.errors import BadInputError
from dspark.fileio import write_text_atomic
from dspark.locking import writes_output

SAMPLES = "samples.jsonl"
PROMPTS = "prompts.jsonl"
REJECTED = "rejected.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"
RUNS = "runs.jsonl"  # a line per run: counts, seconds, generator, engine
_SENTINELS = ("DSPARKUSERSENTINEL7q", "DSPARKUSERSENTINEL9z")


@dataclass(frozen=True)
class PreQuery:
    text: str  # the rendered template up to the first character of the user's message
    stop_ids: list[int]  # ids that end the user's turn (its end-of-turn marker, and eos)
    markers: list[str]  # special-token strings that must not be left in a sampled message


def special_strings(tokenizer) -> list[str]:
    """Every special token's text: a sampled message holding one has leaked template."""
    out = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(tok, "special", False):
            out.add(str(tok.content))
    return sorted(s for s in out if s)


def pre_query_template(
    tokenizer, system_prompt: str | None = None, chat_template_kwargs: dict | None = None
) -> PreQuery:
    """The template text before a user's first message, and the ids that end that message.

    Raises `BadInputError` naming the reason when the template cannot give one: no chat
    template, a template that refuses the conversation, drops or repeats the message, renders
    a different prefix for another message, or ends a user turn with no special token."""
    template_of(tokenizer)  # no chat template: its own one-line error
    name = getattr(tokenizer, "name_or_path", "?")
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    prefixes, suffix = [], ""
    for sentinel in _SENTINELS:
        try:
            text = tokenizer.apply_chat_template(
                system + [{"role": "user", "content": sentinel}],
                tokenize=False,
                add_generation_prompt=False,
                **(chat_template_kwargs or {}),
            )
        except Exception as e:  # e.g. a template without a system role
            raise BadInputError(
                f"the chat template of {name!r} refuses a conversation of "
                f"{'a system and ' if system else ''}one user message ({type(e).__name__}: "
                f"{str(e)[:200]}); {'drop --system-prompt, or ' if system else ''}use a chat "
                "target whose template renders a lone user turn"
            ) from None
        if text.count(sentinel) != 1:
            raise BadInputError(
                f"the chat template of {name!r} renders a user message {text.count(sentinel)} "
                "times, so there is no single place where the user's text begins; use a chat "
                "target whose template writes each message once"
            )
        at = text.index(sentinel)
        prefixes.append(text[:at])
        suffix = text[at + len(sentinel) :]
    if prefixes[0] != prefixes[1]:
        raise BadInputError(
            f"the chat template of {name!r} renders a different prefix for another user "
            "message, so there is no fixed pre-query template; use another chat target"
        )
    if not prefixes[0].strip():
        raise BadInputError(
            f"the chat template of {name!r} puts nothing before a user's message, so the "
            "target cannot tell it is to write one; use an instruct/chat target"
        )
    first = tokenizer(suffix, add_special_tokens=False)["input_ids"][:1]
    specials = set(tokenizer.all_special_ids) | {
        i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special
    }
    if not first or first[0] not in specials:
        raise BadInputError(
            f"the chat template of {name!r} ends a user turn with {suffix[:20]!r}, not a "
            "special token, so a sampled message has no token to stop at; use a chat target "
            "with an end-of-turn token"
        )
    stop = {first[0]} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    return PreQuery(prefixes[0], sorted(stop), special_strings(tokenizer))


def magpie_seed(seed: int, index: int) -> int:
    """Row `index`'s sampling seed (63 bits). Its own namespace: regenerating the answer of
    prompt row i uses `row_seed(seed, i, turn)`, which must not replay the question's draws."""
    digest = hashlib.sha256(f"magpie:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass
class Filters:
    min_chars: int = 12
    max_chars: int = 4000
    min_words: int = 3
    language: str | None = None
    near_threshold: float = NEAR_THRESHOLD


@dataclass
class Selection:
    kept: list[dict] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def select_prompts(
    samples: list[dict],
    pre: PreQuery,
    filters: Filters,
    bench: BenchOverlap | None,
    provenance: dict[str, Any],
) -> Selection:
    """Keep the samples (in index order) that pass the junk filters, copy no bench prompt
    and duplicate no earlier kept one; the first of a group of duplicates is the one kept.

    Reasons: the `junk_reason`s, `bench_exact` / `bench_near`, `duplicate_exact`,
    `duplicate_near`."""
    samples = sorted(samples, key=lambda r: r["index"])
    out = Selection()
    sets = {r["index"]: shingles(r["text"]) for r in samples}
    freq: Counter = Counter(g for s in sets.values() for g in s)
    near = NearDuplicateIndex(freq, filters.near_threshold)
    exact: dict[str, int] = {}
    kept_index: list[int] = []
    for r in samples:
        text = r["text"].strip()
        detail: dict[str, Any] = {}
        reason = junk_reason(
            text,
            finished=r["finished"],
            markers=pre.markers,
            min_chars=filters.min_chars,
            max_chars=filters.max_chars,
            min_words=filters.min_words,
            language=filters.language,
        )
        if reason is None and bench is not None:
            hit = bench.match(text)
            if hit is not None:
                reason = "bench_exact" if hit[1] == "exact" else "bench_near"
                detail = {"bench": hit[0], "measure": hit[1], "score": round(hit[2], 3)}
        key = normalize(text)
        if reason is None and key in exact:
            reason, detail = "duplicate_exact", {"of": exact[key]}
        if reason is None:
            found = near.find(sets[r["index"]])
            if found is not None:
                reason = "duplicate_near"
                detail = {"of": kept_index[found[0]], "jaccard": round(found[1], 3)}
        if reason is not None:
            out.counts[reason] += 1
            out.rejected.append({"index": r["index"], "reason": reason, **detail, "text": text})
            continue
        exact[key] = r["index"]
        near.add(sets[r["index"]])
        kept_index.append(r["index"])
        out.kept.append({"turns": [text], "index": r["index"], "seed": r["seed"], **provenance})
    return out


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# -- generation and the output directory ------------------------------------------------------


def read_samples(path: Path) -> dict[int, dict]:
    """Rows already sampled, by index; a half-written last line left by a kill is cut off."""
    done: dict[int, dict] = {}
    if not path.exists():
        return done
    data = path.read_bytes()
    pos = good = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # no newline: the chunk's write was cut by a kill
        try:
            row = json.loads(data[pos:nl])
            done[int(row["index"])] = row
        except (ValueError, KeyError, TypeError):
            break
        pos = good = nl + 1
    if good != len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
    return done


def magpie_settings(
    target: str, sampling: SamplingConfig, system_prompt: str | None, pre: PreQuery
) -> dict:
    """What `run.json` records and a rerun must match (not --num, the batch or chunk size:
    a row's text depends on its seed alone)."""
    return {
        "kind": "magpie",
        "target": target,
        "seed": sampling.seed,
        "sampling": {k: v for k, v in asdict(sampling).items() if k != "seed"},
        "system_prompt": system_prompt,
        "pre_query": pre.text,
    }


def check_run(out: Path, settings: dict) -> None:
    """Refuse a directory holding another tool's files or a run with other settings."""
    require_output_dir(out)
    run = out / RUN
    if not run.exists():
        refuse_foreign(out, (SAMPLES, PROMPTS, REJECTED, SUMMARY), marker=RUN, what="magpie")
        return
    old = read_json_object(run)
    if old is None or old.get("kind") != "magpie":
        raise BadInputError(
            f"--output {out}: {run} was not written by magpie_prompts.py; pass a new --output "
            "directory, or move that file away"
        )
    diff = [f"{k} was {old.get(k)!r}, now {v!r}" for k, v in settings.items() if old.get(k) != v]
    if diff:
        raise BadInputError(
            f"--output {out} holds prompts sampled with other settings: {'; '.join(diff)}. "
            "Rerun with the same settings to continue it, or pass a new --output directory"
        )


def sample_messages(
    backend, tokenizer, pre: PreQuery, indices: list[int], seed: int, sampling: SamplingConfig
) -> list[dict | None]:
    """One sampled user message per row index (None where the backend failed the row).

    `backend.generate_ids(ids, seeds, sampling)` must sample row i from `seeds[i]` alone
    (DecoderBackend: one generator per row), so a row's text depends only on its seed."""
    if hasattr(backend, "stop_ids"):
        # DecoderBackend stops at the assistant's end-of-turn ids; here the user's turn ends.
        backend.stop_ids = list(pre.stop_ids)
    ids = tokenizer(pre.text, add_special_tokens=False)["input_ids"]
    seeds = [magpie_seed(seed, i) for i in indices]
    outs = backend.generate_ids([list(ids) for _ in indices], seeds, sampling)
    stop = set(pre.stop_ids)
    rows: list[dict | None] = []
    for i, s, toks in zip(indices, seeds, outs):
        if isinstance(toks, BaseException):
            rows.append(None)
            continue
        cut = next((j for j, t in enumerate(toks) if t in stop), None)
        body = toks if cut is None else toks[:cut]
        # Special tokens are kept in the text so the filter can see a leaked template.
        text = tokenizer.decode(body, skip_special_tokens=False)
        rows.append(
            {"index": i, "seed": s, "text": text, "tokens": len(body), "finished": cut is not None}
        )
    return rows


@writes_output("output_dir", "the Magpie prompt set")
def generate_prompts(
    backend,
    tokenizer,
    output_dir: str | os.PathLike,
    *,
    num: int,
    target: str,
    sampling: SamplingConfig,
    chunk_rows: int = 128,
    system_prompt: str | None = None,
    filters: Filters | None = None,
    bench: BenchOverlap | None = None,
    bench_dir: str | None = None,
    log=print,
    stop_after_s: float | None = None,
    generator: str | None = None,
    conditions: dict | None = None,
) -> dict:
    """Sample rows 0..num-1 not yet in `samples.jsonl`, then rebuild the prompt set. `stop_after_s`:
    stop at the first chunk boundary past it (`complete` false; a rerun continues). `generator`
    goes into each new sample, `conditions` (engine, threads, quant) into `runs.jsonl`."""
    if num < 1 or chunk_rows < 1:
        raise BadInputError(f"--num {num} / chunk rows {chunk_rows}: must be >= 1")
    filters = filters or Filters()
    out = Path(output_dir)
    pre = pre_query_template(tokenizer, system_prompt)
    settings = magpie_settings(target, sampling, system_prompt, pre)
    sampled = settings["sampling"]
    check_run(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / RUN).exists():
        write_text_atomic(out / RUN, json.dumps(settings, indent=2) + "\n")
    done = read_samples(out / SAMPLES)
    t0, cpu0, failed, new, tokens = time.monotonic(), time.process_time(), 0, 0, 0
    with open(out / SAMPLES, "a", encoding="utf-8") as f:
        # Fixed chunks of consecutive indices, as in regeneration: a resumed run hands the
        # backend the same groups an uninterrupted one would have.
        for start in range(0, num, chunk_rows):
            todo = [i for i in range(start, min(start + chunk_rows, num)) if i not in done]
            if not todo:
                continue
            rows = sample_messages(backend, tokenizer, pre, todo, sampling.seed, sampling)
            good = [r if generator is None else {**r, "generator": generator}
                    for r in rows if r is not None]  # fmt: skip
            failed += len(rows) - len(good)
            # One write per chunk, then fsync: a kill leaves whole chunks (and at most one
            # cut line, which read_samples removes).
            f.write(_jsonl(good))
            f.flush()
            os.fsync(f.fileno())
            done.update({r["index"]: r for r in good})
            new += len(good)
            tokens += sum(r["tokens"] for r in good)
            if log:
                dt, left = max(time.monotonic() - t0, 1e-9), max(0, num - len(done))
                log(f"magpie: {len(done)}/{num} sampled, {new / dt:.2f} rows/s, {tokens / dt:.1f} "
                    f"tok/s, ~{left * dt / max(new, 1) / 3600:.1f} h left")  # fmt: skip
            if stop_after_s is not None and time.monotonic() - t0 >= stop_after_s:
                break
    provenance = {"source": f"magpie:{target}", "run_seed": sampling.seed, "sampling": sampled}
    sel = select_prompts([r for i, r in done.items() if i < num], pre, filters, bench, provenance)
    write_text_atomic(out / PROMPTS, _jsonl(sel.kept))
    write_text_atomic(out / REJECTED, _jsonl(sel.rejected))
    summary = {
        "source": f"magpie:{target}",
        "num": num,
        "generated": sum(1 for i in done if i < num),
        "generated_this_run": new,
        "complete": sum(1 for i in done if i < num) + failed >= num,
        "failed_this_run": failed,
        "kept": len(sel.kept),
        "rejected": dict(sorted(sel.counts.items())),
        "duplicates": {k: sel.counts.get(f"duplicate_{k}", 0) for k in ("exact", "near")},
        "bench_overlap": {k: sel.counts.get(f"bench_{k}", 0) for k in ("exact", "near")},
        "bench_dir": bench_dir,
        "bench_prompts": len(bench) if bench is not None else 0,
        "diversity": prompt_diversity([r["turns"][0] for r in sel.kept]),
        "filters": asdict(filters),
        "elapsed_s": round(time.monotonic() - t0, 3),
        "cpu_s": round(time.process_time() - cpu0, 3),  # all threads; wall time counts pauses
        "output": str(out / PROMPTS),
    }
    write_text_atomic(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    keys = "generated generated_this_run failed_this_run elapsed_s cpu_s complete"
    run = {k: summary[k] for k in keys.split()} | {"generated_tokens_this_run": tokens}
    run.update(generator=generator, **(conditions or {}))
    with open(out / RUNS, "a", encoding="utf-8") as f:  # every run's cost: a build's CPU-hours
        f.write(json.dumps(run) + "\n")
    if log:
        log(f"magpie: {summary['kept']} of {summary['generated']} prompts kept (rejected: "
            f"{summary['rejected'] or 'none'}) -> {out / PROMPTS}")  # fmt: skip
    return summary
