"""Where a data build that answers a prompt mix in steps stands, and the time left to N rows.

A long build (`make smollm2-large-data`) alternates steps: its target-written prompt sets grow
(Magpie, `magpie_prompts.py`), the mix extends at its end (`mix_prompts.py`, which writes the
sources it mixed to `<mix>.sources.json`), and the answering step answers the mix in order
(`regenerate.py`). N answered rows need the mix's first N rows, so that many rows of each source
(`mix_shares`: a growing set counted as unbounded, the length it will reach), enough samples in
each growing set to keep them (at the set's keep rate so far), and the answers. Each step's pace
is its recorded CPU seconds per unit (its runs.jsonl) over its threads: the wall time of a step
that has the cores to itself, not the time a paused or shared step took.
"""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path

from dspark.data.outputs import read_json_object, read_json_rows
from dspark.data.prompts.mix import interleave
from dspark.errors import BadInputError
from dspark.locking import describe, lock_file_for

SOURCES_SUFFIX = ".sources.json"


def mix_sources_path(mix: Path) -> Path:
    """The file `mix_prompts.py` writes beside a mix: the sources, weights and rows it mixed."""
    return mix.with_name(mix.stem + SOURCES_SUFFIX)


def runs_cpu_s(runs: Path, unit: str, rows_key: str) -> float | None:
    """CPU seconds per row (`rows_key`) over every run in a data step's runs.jsonl.

    A run's CPU seconds are its own process CPU time (`cpu_s`) where recorded. A run without it
    is priced by its work (`unit`: its tokens, or rows) at the fastest rate per thread of the
    step's runs, a lower bound: its wall time would also count the time it sat paused or shared
    the cores. Rows: those of the runs on record (a set may predate its runs.jsonl).
    """
    return _cpu_s_per_row(read_json_rows(runs), unit, rows_key)


def _cpu_s_per_row(steps: list[dict], unit: str, rows_key: str) -> float | None:
    def thread_s(s: dict) -> float:
        return s.get("elapsed_s", 0.0) * (s.get("threads") or 1)

    fastest = max((s[unit] / thread_s(s) for s in steps if s.get(unit) and thread_s(s)), default=0)

    def cpu_s(s: dict) -> float:
        if "cpu_s" in s:
            return s["cpu_s"]
        return s[unit] / fastest if s.get(unit) and fastest else thread_s(s)

    rows = sum(s.get(rows_key, 0) for s in steps)
    return sum(map(cpu_s, steps)) / rows if rows else None


def _wall_per_unit(steps: list[dict], unit: str, rows_key: str) -> float | None:
    """Wall seconds per row of a step alone on its cores (`steps`: its runs.jsonl): CPU per row
    over the last run's threads (None before the step's first run)."""
    per_row = _cpu_s_per_row(steps, unit, rows_key)
    threads = (steps[-1].get("threads") or 1) if steps else 1
    return None if per_row is None else per_row / threads


def mix_shares(sources: list[dict], n: int) -> dict[str, int]:
    """How many of the mix's first n rows each source gives: a growing source (`growing`) as if
    unbounded, since the build grows it until the mix has n rows; a finished one its `rows`."""
    fake: list[tuple[str, list[dict], float]] = [
        (s["name"], [{}] * (n if s["growing"] else s["rows"]), s["weight"]) for s in sources
    ]
    shares = dict.fromkeys((s["name"] for s in sources), 0)
    for row in interleave(fake)[:n]:
        shares[row["mix_source"]] += 1
    return shares


def _read_json(path: Path, fix: str) -> dict:
    value = read_json_object(path)
    if value is None:
        raise BadInputError(f"cannot read a JSON object from {path}; {fix}")
    return value


def _running(output: Path) -> str | None:
    """Who writes `output` now, from its writer lock's record: read, never locked, so a poll
    cannot refuse a step that takes the lock at that instant. A writer removes the file when it
    ends; a killed one leaves it, so a record whose process is gone on this host is no writer."""
    try:
        record = json.loads(lock_file_for(output).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    pid = record.get("pid") if isinstance(record, dict) else None
    if not isinstance(pid, int) or pid <= 0:
        return None
    if record.get("host") == socket.gethostname():
        try:
            os.kill(pid, 0)  # signal 0: whether the process exists
        except OSError:
            return None
    return describe(record)


def build_status(answers: Path, rows: int) -> dict:
    """Each step of the build that answers into `answers` (regenerate.py's output folder),
    what it has done, what `rows` answered rows need of it, its pace and the time left."""
    if rows < 1:
        raise BadInputError(f"--rows {rows}: ask for at least one answered row")
    if not (answers / "run.json").is_file():
        raise BadInputError(
            f"{answers} holds no answering run (run.json): pass regenerate.py's --output "
            "folder of the build, or start the build first (make smollm2-large-data; make "
            "smollm2-served for a served draft's answers)"
        )
    run = _read_json(answers / "run.json", "pass regenerate.py's --output folder")
    mix = Path(run.get("source", ""))
    listed = mix_sources_path(mix)
    if not listed.is_file():
        raise BadInputError(
            f"{listed} is missing: the mix's sources are listed there by data_scripts/"
            "mix_prompts.py; rerun the build's mix step (the next build step writes it)"
        )
    sources = _read_json(listed, "rerun data_scripts/mix_prompts.py").get("sources")
    if not isinstance(sources, list) or not sources:
        raise BadInputError(f"{listed} lists no sources; rerun data_scripts/mix_prompts.py")
    shares = mix_shares(sources, rows)
    steps = []
    for s in sources:
        if not s.get("prompt_set"):
            continue  # a named set or a plain file: nothing to build
        folder = Path(s["prompt_set"])
        summary = _read_json(folder / "summary.json", "a growing set is magpie_prompts.py's")
        generated, kept = summary.get("generated", 0), summary.get("kept", 0)
        keep = kept / generated if generated else None
        need = math.ceil(shares[s["name"]] / keep) if keep else None
        pace = _wall_per_unit(
            read_json_rows(folder / "runs.jsonl"), "generated_this_run", "generated_this_run"
        )
        left = None if need is None else max(0, need - generated)
        steps.append({
            "step": f"{s['name']} prompts", "unit": "sample", "done": generated,
            "needed": need, "target": summary.get("num"), "kept": kept,
            "rows_in_mix": shares[s["name"]], "wall_s_per_unit": pace,
            "left_s": None if left is None or pace is None else left * pace,
            "target_left_s": None if pace is None or summary.get("num") is None
            else max(0, summary["num"] - generated) * pace,
            "running": _running(folder),
        })  # fmt: skip
    answered = len(read_json_rows(answers / "regenerated.jsonl"))
    runs = read_json_rows(answers / "runs.jsonl")
    pace = _wall_per_unit(runs, "generated_tokens", "rows_done")
    left = max(0, rows - answered)
    tokens = sum(r.get("generated_tokens", 0) for r in runs)
    done_rows = sum(r.get("rows_done", 0) for r in runs)
    steps.append({
        "step": "answers", "unit": "row", "done": answered, "needed": rows, "target": None,
        "wall_s_per_unit": pace, "left_s": None if pace is None else left * pace,
        "tokens_per_row": tokens / done_rows if done_rows else None,
        "running": _running(answers),
    })  # fmt: skip
    known = [s["left_s"] for s in steps if s["left_s"] is not None]
    return {
        "rows": rows,
        "mix": str(mix),
        "mix_shares": shares,
        "steps": steps,
        "left_s": sum(known) if len(known) == len(steps) else None,
    }


def _hours(s: float | None) -> str:
    return "?" if s is None else f"{s / 3600:.2f} h"


def render(status: dict) -> str:
    """The status as Markdown: one row per step, then the time left."""
    n = status["rows"]
    lines = [
        f"# The data build, towards {n:,} answered rows",
        "",
        f"The mix's first {n:,} rows: "
        + ", ".join(f"{k} {v:,}" for k, v in status["mix_shares"].items()),
        "",
        f"| step | done | needed for {n:,} | the set's target | pace (s a unit, alone) "
        f"| time left for {n:,} |",
        "|---|---|---|---|---|---|",
    ]
    for s in status["steps"]:
        pace = "?" if s["wall_s_per_unit"] is None else f"{s['wall_s_per_unit']:.3f} / {s['unit']}"
        need = "?" if s["needed"] is None else f"{s['needed']:,}"
        target = "" if s["target"] is None else f"{s['target']:,}"
        lines.append(f"| {s['step']} | {s['done']:,} | {need} | {target} | {pace} "
                     f"| {_hours(s['left_s'])} |")  # fmt: skip
    extra = sum(max(0.0, (s.get("target_left_s") or 0.0) - (s["left_s"] or 0.0))
                for s in status["steps"])  # fmt: skip
    lines += [
        f"\nRunning now: {s['step']}, {s['running']}" for s in status["steps"] if s["running"]
    ]
    lines += ["", f"Time left for {n:,} rows at these paces: {_hours(status['left_s'])}"
              + (f"; the prompt sets' own targets add {_hours(extra)}" if extra else "")
              + ". Paces are CPU seconds per unit over the step's threads, from its runs.jsonl "
              "(a step sharing its cores takes longer)."]  # fmt: skip
    return "\n".join(lines) + "\n"
