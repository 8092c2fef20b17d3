"""One run per output directory: what a run directory holds, and the checks that keep two runs
from mixing in it.

A run directory (`trainer.output_dir`) holds `run_config.json`, `metrics.jsonl`,
`checkpoints/step_*` and the published `draft/`. A second run started in it would overwrite
the draft, append its metrics to the first run's and, since pruning keeps the highest step
numbers, delete its own checkpoints; a resumed run with other draft settings would load
weights of another shape. So:
- `refuse_restart`: `trainer.resume=false` in a directory that holds a run is an error;
- `check_resume_config`: a resumed run must ask for the draft and target it was started with;
- `supersede_metrics`: on resume, the log rows past the checkpoint (steps a killed run logged
  and the resumed one repeats) move to `metrics.superseded.jsonl`, so `metrics.jsonl` holds
  one value per step and nothing logged is lost.
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark.errors import BadInputError
from dspark.fileio import write_text_atomic

RUN_CONFIG = "run_config.json"
METRICS = "metrics.jsonl"
SUPERSEDED = "metrics.superseded.jsonl"
# The run-config sections a resumed run must share with the run it continues: they decide the
# draft's shape and what its weights mean, and (optim.name) what its optimizer state holds
# (AdamW's moments, or Muon's momentum for the hidden matrices as well). Data, the other
# optimizer settings and the step budget may change.
RESUME_KEYS = ("draft", "target.name", "optim.name")
# What a run directory recorded before a key of RESUME_KEYS existed ran with.
RECORDED_BEFORE = {"optim.name": "adamw"}


def run_contents(out: Path) -> list[str]:
    """What of a training run `out` holds (empty when it holds none)."""
    found = []
    ckpts = out / "checkpoints"
    if ckpts.is_dir() and any(p.name.startswith("step_") for p in ckpts.iterdir()):
        found.append("checkpoints")
    for name in ("draft", RUN_CONFIG, METRICS):
        if (out / name).exists():
            found.append(name)
    return found


def refuse_restart(out: Path) -> None:
    """`trainer.resume=false` must not start a second run over a first one."""
    found = run_contents(out)
    if found:
        raise BadInputError(
            f"trainer.output_dir={out} already holds a training run ({', '.join(found)}): "
            "trainer.resume=false would mix a new run into it. Pass a new trainer.output_dir, "
            "or trainer.resume=true to continue that run"
        )


def _select(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _flat(value, prefix: str) -> dict:
    if isinstance(value, dict):
        out: dict = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}"))
        return out
    return {prefix: value}


def check_resume_config(out: Path, run_config: dict) -> None:
    """A resumed run asks for the draft and target (`RESUME_KEYS`) its run directory holds."""
    path = out / RUN_CONFIG
    if not path.is_file():
        return
    try:
        before = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInputError(
            f"{path} is not valid JSON ({e}): the run directory is damaged; pass a new "
            "trainer.output_dir"
        ) from None
    changed = []
    for key in RESUME_KEYS:
        old_value = _select(before, key)
        if old_value is None:  # a run recorded before the key existed
            old_value = RECORDED_BEFORE.get(key)
        old, new = _flat(old_value, key), _flat(_select(run_config, key), key)
        changed += [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
                    if old.get(k) != new.get(k)]  # fmt: skip
    if changed:
        raise BadInputError(
            f"trainer.output_dir={out} holds a run with other settings ({'; '.join(changed)}): "
            "resuming would load weights and optimizer state made for them. Pass a new "
            "trainer.output_dir, or the run's own settings to continue it"
        )


def supersede_metrics(out: Path, step: int) -> int:
    """Move `metrics.jsonl` rows past `step` (the checkpoint a run resumes from) to
    `metrics.superseded.jsonl`; returns how many moved."""
    path = out / METRICS
    if not path.is_file():
        return 0
    keep: list[str] = []
    moved: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row_step = json.loads(line).get("step", 0)
        except json.JSONDecodeError:  # a line cut by a kill mid-write: nothing to plot
            moved.append(line)
            continue
        (moved if isinstance(row_step, int) and row_step > step else keep).append(line)
    if moved:
        with (out / SUPERSEDED).open("a") as f:
            f.write("".join(f"{line}\n" for line in moved))
        write_text_atomic(path, "".join(f"{line}\n" for line in keep))
    return len(moved)
