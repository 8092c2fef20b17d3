"""Atomic, resumable checkpoints: Accelerate state (model, optimizer, scheduler, RNG, data
position) plus the draft in its serving layout, written to a temp dir and renamed into place.

A run killed mid-write leaves only a `.tmp-*` directory, which `latest_checkpoint` ignores
and the next save removes, so what was already written is never lost or half-trusted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class Progress:
    """Where the loop is; saved with the Accelerate state so resume skips seen batches."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def checkpoints_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return None
    done: dict[Path, int] = {}  # finished checkpoint dir -> its step
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "DONE").exists():
            done[p] = int(m[1])
    return max(done, key=done.__getitem__, default=None)


def save_checkpoint(accelerator, draft, progress: Progress, output_dir, keep_last: int) -> Path:
    """Collective: every rank calls it (Accelerate writes per-rank RNG state)."""
    root = checkpoints_dir(output_dir)
    final = root / f"step_{progress.step:08d}"
    tmp = root / f".tmp-step_{progress.step:08d}"
    if accelerator.is_main_process:
        for stale in root.glob(".tmp-*") if root.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    save_draft(accelerator, draft, tmp / "draft")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / "DONE").write_text(json.dumps(progress.state_dict()))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _prune(root, keep_last)
    accelerator.wait_for_everyone()
    return final


def save_draft(accelerator, draft, path: Path) -> None:
    """The draft alone, in the serving layout (`save_pretrained`), gathered across ranks."""
    state = accelerator.get_state_dict(draft)  # collective under FSDP / DeepSpeed
    if accelerator.is_main_process:
        accelerator.unwrap_model(draft).save_pretrained(
            path, state_dict=state, safe_serialization=True
        )


def publish_draft(accelerator, draft, output_dir) -> Path:
    """Atomically (re)place `output_dir/draft` with the current weights."""
    final = Path(output_dir) / "draft"
    tmp = Path(output_dir) / ".tmp-draft"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    save_draft(accelerator, draft, tmp)
    if accelerator.is_main_process:
        old = Path(output_dir) / ".old-draft"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _prune(root: Path, keep_last: int) -> None:
    steps = sorted((p for p in root.iterdir() if _STEP_DIR.match(p.name)), key=lambda p: p.name)
    for old in steps[: max(0, len(steps) - max(1, keep_last))]:
        shutil.rmtree(old, ignore_errors=True)
