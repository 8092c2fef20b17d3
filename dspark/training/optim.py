"""The run config's optimizer over the trainable parameters (`optim.name`: AdamW, or Muon for
the hidden matrices with AdamW for the rest, training/muon.py), linear warm-up then cosine
decay (transformers')."""

from __future__ import annotations

from typing import Any

import torch
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from dspark.training.muon import MuonWithAdamW, split_parameters


def build_optimizer(model: torch.nn.Module, optim: Any) -> torch.optim.Optimizer:
    """`optim` is the run config's `optim` section (`OptimConfig`). Only parameters with
    requires_grad are optimised (the frozen embed_tokens / lm_head copies never are)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("the draft has no trainable parameters")
    adamw_kw = {"lr": optim.lr, "weight_decay": optim.weight_decay, "betas": tuple(optim.betas)}
    if optim.name == "adamw":
        return torch.optim.AdamW([p for _, p in named], **adamw_kw)
    if optim.name != "muon":
        raise ValueError(f"optim.name={optim.name!r} is not one of ('adamw', 'muon')")

    muon, adamw = split_parameters(named)
    if not muon or not adamw:
        raise ValueError(
            "optim.name=muon needs hidden weight matrices (fc, layers.*) and other trainable "
            f"parameters; this draft trains {len(muon)} and {len(adamw)} (a LoRA run has no "
            "Muon matrix): use optim.name=adamw"
        )
    return MuonWithAdamW(
        torch.optim.AdamW([p for _, p in adamw], **adamw_kw),
        torch.optim.Muon(
            [p for _, p in muon],
            lr=optim.lr * optim.muon_lr_ratio,  # the schedule scales it with AdamW's lr
            weight_decay=optim.muon_weight_decay,
            momentum=optim.muon_momentum,
            ns_steps=optim.muon_ns_steps,
        ),
    )


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """`round(total * ratio)` warm-up steps, at least one when the ratio is positive."""
    return max(1, round(total_steps * warmup_ratio)) if warmup_ratio > 0 else 0


def warmup_cosine(optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float = 0.0):
    """LambdaLR, stepped once per optimizer step: lr * step/warmup during warm-up (step 0 at
    lr 0, as transformers' Trainer), then cosine from lr to `lr * min_lr_ratio` at `total`."""
    return get_cosine_with_min_lr_schedule_with_warmup(
        optimizer,
        num_warmup_steps=warmup_steps(total_steps, warmup_ratio),
        num_training_steps=total_steps,
        min_lr_rate=min_lr_ratio,
    )
