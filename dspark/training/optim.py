"""AdamW over the trainable parameters, linear warm-up then cosine decay (transformers')."""

from __future__ import annotations

import torch


def build_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, betas
) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the draft has no trainable parameters")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas))


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """`round(total * ratio)` warm-up steps, at least one when the ratio is positive."""
    return max(1, round(total_steps * warmup_ratio)) if warmup_ratio > 0 else 0


def warmup_cosine(optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float = 0.0):
    """LambdaLR, stepped once per optimizer step: lr * step/warmup during warm-up (step 0 at
    lr 0, as transformers' Trainer), then cosine from lr to `lr * min_lr_ratio` at `total`."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    return get_cosine_with_min_lr_schedule_with_warmup(
        optimizer,
        num_warmup_steps=warmup_steps(total_steps, warmup_ratio),
        num_training_steps=total_steps,
        min_lr_rate=min_lr_ratio,
    )
