"""Where a training run stands, read from its directory alone: the last finished checkpoint's
step of the run's total, the pace of a step, and the time left.

Read-only, so it may run beside the run. The pace is the logged train rows' time per step
(`metrics.jsonl`: a row every `trainer.log_every` steps, held-out evals and checkpoint saves
included), over the stretches where the run was stepping: a gap far longer than the usual one
(a job's start, which loads the target and may pass the head over the cache, a kill, a pause)
is left out. The run's total is recorded at its start (run_config.json's `schedule`); a run
that has not started yet has none.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from dspark.data.outputs import read_json_object, read_json_rows
from dspark.training.checkpoint import latest_checkpoint
from dspark.training.run_dir import METRICS, RUN_CONFIG

# A gap between two train rows longer than this many times the median gap per step is not
# stepping time (a job's start, a kill, a pause).
GAP_FACTOR = 5.0


def step_pace(rows: list[dict]) -> float | None:
    """Seconds per optimizer step over the logged train rows (`{"time", "step", "train/..."}`),
    gaps that are not stepping left out; None with fewer than two rows a step apart."""
    train = sorted((r["step"], r["time"]) for r in rows if "train/loss" in r and "time" in r)
    pairs = [(t1 - t0, s1 - s0) for (s0, t0), (s1, t1) in zip(train, train[1:]) if s1 > s0]
    if not pairs:
        return None
    usual = statistics.median(dt / ds for dt, ds in pairs)
    kept = [(dt, ds) for dt, ds in pairs if dt <= GAP_FACTOR * usual * ds]
    return sum(dt for dt, _ in kept) / sum(ds for _, ds in kept)


def last_held_out(rows: list[dict], metric: str = "eval/tau_greedy") -> dict | None:
    """`{"step", "value"}` of the newest logged held-out `metric` (a periodic or the final
    eval); None before the first."""
    evals = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None and "step" in r]
    if not evals:
        return None
    step, value = max(evals, key=lambda e: e[0])
    return {"step": step, "value": value}


def run_status(output_dir: str | os.PathLike) -> dict:
    """The run in `output_dir` (`trainer.output_dir`): `started`, `finished` (its results.json),
    `step` (the last finished checkpoint's, 0 before one), `total_steps`, `s_per_step` and
    `left_s` (None where unknown), and `held_out_tau_greedy` (`last_held_out`)."""
    out = Path(output_dir)
    config = read_json_object(out / RUN_CONFIG) or {}
    total = (config.get("schedule") or {}).get("total_steps")
    checkpoint = latest_checkpoint(out)
    step = int(checkpoint.name.removeprefix("step_")) if checkpoint else 0
    finished = (out / "results.json").is_file()
    rows = read_json_rows(out / METRICS)
    pace = step_pace(rows)
    left = 0.0 if finished else None
    if not finished and total is not None and pace is not None:
        left = max(0, total - step) * pace
    return {
        "run": str(out),
        "started": bool(config),
        "finished": finished,
        "step": total if finished and total else step,
        "total_steps": total,
        "s_per_step": pace,
        "left_s": left,
        "held_out_tau_greedy": last_held_out(rows),
    }


def _hours(s: float | None) -> str:
    return "?" if s is None else f"{s / 3600:.2f} h"


def render_training(cache: dict | None, run: dict, head: dict | None = None) -> str:
    """A run's long stages as Markdown: its feature cache (`cache_progress`, None where the
    cache is not there), the target head's pass over it (`summary_progress`, None where not
    known) and its training (`run_status`), each with its pace and time left."""
    lines = ["| stage | done | of | pace | time left |", "|---|---|---|---|---|"]
    if run["finished"]:
        cache_row = "| feature cache | done |  |  | 0.00 h |"  # a finished run may delete it
    elif cache is None:
        cache_row = "| feature cache | not started |  |  | ? |"
    else:
        pace = "?" if cache["s_per_row"] is None else f"{cache['s_per_row']:.3f} s / row"
        cache_row = (f"| feature cache | {cache['rows_done']:,} rows ({cache['shards_done']} "
                     f"shards) | {cache['rows']:,} rows ({cache['shards']} shards) | {pace} "
                     f"| {_hours(cache['left_s'])} |")  # fmt: skip
    lines.append(cache_row)
    head_left = 0.0 if run["finished"] or head is None else head["left_s"]
    if head is not None and not run["finished"]:
        pace = "?" if head["s_per_shard"] is None else f"{head['s_per_shard']:.1f} s / shard"
        lines.append(f"| target head's pass | {head['shards_done']} shards | {head['shards']} "
                     f"shards | {pace} | {_hours(head['left_s'])} |")  # fmt: skip
    total = "?" if run["total_steps"] is None else f"{run['total_steps']:,} steps"
    pace = "?" if run["s_per_step"] is None else f"{run['s_per_step']:.3f} s / step"
    state = f"step {run['step']:,}" if run["started"] else "not started"
    lines.append(f"| training | {state} | {total} | {pace} | {_hours(run['left_s'])} |")
    parts = [run["left_s"], head_left, 0.0 if run["finished"] else cache and cache["left_s"]]
    known = None if any(p is None for p in parts) else sum(p for p in parts if p)
    held = run.get("held_out_tau_greedy")
    if held:
        lines += ["", f"Held-out tau_greedy: {held['value']:.3f} at step {held['step']:,} (the "
                  "run's newest held-out evaluation)."]  # fmt: skip
    lines += ["", f"Time left for these stages at these paces: {_hours(known)} (a job's start, "
              "which loads the target, not counted)."]  # fmt: skip
    return "\n".join(lines) + "\n"
