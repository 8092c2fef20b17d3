"""Library-backed training plumbing: transformers' warm-up-cosine schedule against the formula
dspark used before, and the metrics sinks as Accelerate trackers (JSONL always, one service)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from dspark.errors import MissingPackageError
from dspark.training.optim import warmup_cosine
from dspark.training.tracking import flat_config, init_tracking, trackers


def old_factor(step: int, total: int, warmup_ratio: float, min_lr_ratio: float) -> float:
    """dspark's hand-written LambdaLR factor before the switch (kept here as the reference)."""
    warmup = max(1, round(total * warmup_ratio)) if warmup_ratio > 0 else 0
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize(
    "total,ratio,min_lr_ratio",
    [(100, 0.04, 0.0), (150, 0.04, 0.1), (12, 0.04, 0.0), (50, 0.0, 0.2), (10, 0.5, 0.05)],
)
def test_schedule_matches_the_old_formula(total, ratio, min_lr_ratio):
    """From the end of warm-up on the two agree exactly (min_lr_ratio included); during
    warm-up transformers ramps from lr 0, i.e. one step behind the old (step+1)/warmup."""
    lr = 1e-3
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=lr)
    sched = warmup_cosine(opt, total, ratio, min_lr_ratio)
    warmup = max(1, round(total * ratio)) if ratio > 0 else 0
    for step in range(total):
        got = opt.param_groups[0]["lr"] / lr
        if step >= warmup:
            want = old_factor(step, total, ratio, min_lr_ratio)
        else:
            want = 0.0 if step == 0 else old_factor(step - 1, total, ratio, min_lr_ratio)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (step, got, want)
        opt.step()
        sched.step()
    # and the cosine ends at lr * min_lr_ratio
    assert opt.param_groups[0]["lr"] == pytest.approx(lr * min_lr_ratio, abs=1e-15)


def _tracking(**kw):
    base = {"backend": "none", "project": "dspark", "run_name": None, "mode": "auto"}
    return OmegaConf.create({**base, **kw})


def _accelerator(cfg, out):
    from accelerate import Accelerator

    return Accelerator(log_with=trackers(cfg, out), project_dir=str(out))


def test_jsonl_tracker_writes_every_record_through_accelerate(tmp_path):
    cfg = _tracking(backend="none")
    acc = _accelerator(cfg, tmp_path)
    init_tracking(acc, cfg, tmp_path, {"optim": {"lr": 1e-3}})
    acc.log({"step": 2, "train/loss": 0.5}, step=2)
    acc.log({"eval/loss": 0.25}, step=4)  # the step is added when the record lacks it
    acc.end_training()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    assert rows[0]["train/loss"] == 0.5 and rows[1]["eval/loss"] == 0.25
    assert all(isinstance(r["time"], float) for r in rows)
    assert [t.name for t in acc.trackers] == ["jsonl"]


def test_disabled_wandb_leaves_only_the_jsonl_log(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    names = [getattr(t, "name", t) for t in trackers(_tracking(backend="wandb"), tmp_path)]
    assert names == ["jsonl"]
    names = [getattr(t, "name", t) for t in trackers(_tracking(backend="none"), tmp_path)]
    assert names == ["jsonl"]


def test_missing_tracker_package_is_a_user_error(tmp_path, monkeypatch):
    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, "is_tensorboard_available", lambda: False)
    with pytest.raises(MissingPackageError, match="pip install tensorboard, or train with"):
        trackers(_tracking(backend="tensorboard"), tmp_path)


def test_flat_config_for_scalar_only_trackers():
    flat = flat_config({"optim": {"lr": 1e-3, "betas": [0.9, 0.999]}, "draft": {"ids": None}})
    assert flat == {"optim.lr": 1e-3, "optim.betas": "[0.9, 0.999]", "draft.ids": "None"}


def test_tensorboard_tracker_logs_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _tracking(backend="tensorboard", project="proj")
    acc = _accelerator(cfg, tmp_path)
    init_tracking(acc, cfg, tmp_path, {"optim": {"lr": 1e-3, "betas": [0.9, 0.999]}})
    acc.log({"step": 3, "train/loss": 0.75}, step=3)
    acc.end_training()
    assert [t.name for t in acc.trackers] == ["jsonl", "tensorboard"]
    ev = EventAccumulator(str(tmp_path / "proj"))
    ev.Reload()
    (scalar,) = ev.Scalars("train/loss")
    assert scalar.step == 3 and scalar.value == pytest.approx(0.75)
    assert (tmp_path / "metrics.jsonl").exists()
