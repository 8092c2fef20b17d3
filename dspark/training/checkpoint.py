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
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dspark.errors import BadInputError
from dspark.fileio import apply_umask

_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class Progress:
    """Where the loop is; saved with the Accelerate state so resume skips seen batches."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    train_seconds: float = 0.0  # training wall time up to here, over every job of the run

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def checkpoints_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def finished_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Finished checkpoint dirs (`step_*` with `DONE`), newest first."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    done: dict[Path, int] = {}  # finished checkpoint dir -> its step
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "DONE").exists():
            done[p] = int(m[1])
    return sorted(done, key=done.__getitem__, reverse=True)


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    found = finished_checkpoints(output_dir)
    return found[0] if found else None


def nonfinite_parameters(model) -> list[str]:
    """Names of `model`'s parameters holding a NaN or an infinity."""
    import torch  # light module: defers torch

    return [n for n, p in model.named_parameters() if not torch.isfinite(p.detach()).all()]


class NonFiniteWeightsError(RuntimeError):
    """Weights about to be saved, or just loaded, hold NaN / inf."""


def checkpoint_damage(ckpt: Path) -> str | None:
    """Why the finished checkpoint `ckpt` cannot be resumed (None: it can), read from its
    files alone, before anything is loaded into the live model: its weights cannot be read
    (cut off, garbage) or hold NaN / inf, or its optimizer state cannot be read."""
    import torch  # light module: defers torch
    from safetensors import SafetensorError  # light module: defers safetensors
    from safetensors.torch import load_file  # light module: defers safetensors

    weights = sorted(ckpt.glob("model*.safetensors"))
    if not weights:
        return "no model*.safetensors in it"
    for path in weights:
        try:
            state = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            return f"{path.name} cannot be read: {str(e).strip().splitlines()[0]}"
        bad = [k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
        if bad:
            return f"{path.name} holds non-finite weights ({', '.join(bad[:3])})"
    for path in ckpt.glob("optimizer*.bin"):
        try:
            torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - pickle's and torch's errors for a cut-off file
            return f"{path.name} cannot be read: {str(e).strip().splitlines()[0][:120]}"
    return None


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resume_latest(accelerator, draft, output_dir, log=_warn) -> Path | None:
    """Load the newest checkpoint that is whole (`checkpoint_damage`); return it (None: none).

    A damaged one is renamed `corrupt-step_*` (kept for inspection, ignored from then on) with
    a warning, and the previous one is tried; each is checked before it is loaded, so the live
    model never holds a damaged checkpoint's weights. One that still fails to load (made for
    another draft shape) is a `BadInputError`, and so is a run none of whose checkpoints is
    whole (starting over would publish a new run over its draft). Every rank reads the same files, so every rank
    takes the same path."""
    set_aside: list[Path] = []
    for ckpt in finished_checkpoints(output_dir):
        damage = checkpoint_damage(ckpt)
        if damage is not None:
            set_aside.append(ckpt.with_name(f"corrupt-{ckpt.name}"))
            accelerator.wait_for_everyone()
            aside = ckpt.with_name(f"corrupt-{ckpt.name}")
            if accelerator.is_main_process:
                os.replace(ckpt, aside)
            accelerator.wait_for_everyone()
            log(f"warning: checkpoint {ckpt} is damaged ({damage}); moved to {aside}, "
                "trying the previous one")  # fmt: skip
            continue
        try:
            accelerator.load_state(str(ckpt))
        except Exception as e:  # noqa: BLE001 - whole files that do not fit this run
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadInputError(
                f"checkpoint {ckpt} does not fit this run ({reason[:200]}): pass a new "
                "trainer.output_dir, or the run's own draft.* settings"
            ) from None
        return ckpt
    if set_aside:  # a fresh start would publish a new run over the damaged one's draft
        raise BadInputError(
            f"every checkpoint of the run in {output_dir} is damaged (kept as "
            f"{', '.join(p.name for p in set_aside)}): it cannot be resumed, and starting over "
            "there would replace its draft. Pass a new trainer.output_dir"
        )
    return None


def save_checkpoint(accelerator, draft, progress: Progress, output_dir, keep_last: int) -> Path:
    """Collective: every rank calls it (Accelerate writes per-rank RNG state). Refuses
    non-finite weights, so every checkpoint on disk (and the one pruning keeps) is finite."""
    bad = nonfinite_parameters(accelerator.unwrap_model(draft))
    if bad:
        raise NonFiniteWeightsError(f"refusing to checkpoint non-finite weights ({bad[0]}, ...)")
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
    """The draft alone, in the serving layout (`save_pretrained`), gathered across ranks,
    with the modes of the user's umask (transformers writes its safetensors 0600)."""
    state = accelerator.get_state_dict(draft)  # collective under FSDP / DeepSpeed
    if accelerator.is_main_process:
        accelerator.unwrap_model(draft).save_pretrained(
            path, state_dict=state, safe_serialization=True
        )
        apply_umask(path)


def publish_draft(accelerator, draft, output_dir) -> Path:
    """Atomically (re)place `output_dir/draft` with the current weights (finite ones only: a
    published draft is what users serve)."""
    bad = nonfinite_parameters(accelerator.unwrap_model(draft))
    if bad:
        raise NonFiniteWeightsError(f"refusing to publish non-finite weights ({bad[0]}, ...)")
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
