"""The files of a regeneration's output directory, and the checks a resume makes on them.

`regenerated.jsonl` (one row per line, appended), `failures.jsonl` (one line per failed
attempt), `rejected.jsonl` (input rows that could not be normalised), `run.json` (the
settings; a rerun with other settings is refused, naming the flags that differ) and
`summary.json`. A directory holding any of these names without a regeneration's `run.json`
is another tool's and is refused rather than overwritten (`check_output`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from dspark.data.outputs import (
    read_json_object,
    refuse_foreign,
    require_output_dir,
    require_writable_files,
)
from dspark.data.regeneration.sampling import SamplingConfig
from dspark.errors import BadInputError

OUTPUT = "regenerated.jsonl"
FAILURES = "failures.jsonl"
REJECTED = "rejected.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"
AGREEMENT = "agreement.json"  # llama-cpp: how far its greedy answers follow the bundled target's
RUNS = "runs.jsonl"  # one line per run (a build in steps): its counters, seconds and threads


def repair_and_read(path: Path) -> set[int]:
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
    path = require_output_dir(out)
    old = read_run(path) if path.is_dir() else None
    if old is None:
        refuse_foreign(
            path, (OUTPUT, FAILURES, REJECTED, SUMMARY, RUNS), marker=RUN, what="a regeneration"
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
