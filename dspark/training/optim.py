"""AdamW over the trainable parameters, linear warm-up then cosine decay."""

from __future__ import annotations

import math

import torch


def build_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, betas
) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the draft has no trainable parameters")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas))


def warmup_cosine(optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float = 0.0):
    """LambdaLR: lr * step/warmup during warm-up, then cosine from 1 to `min_lr_ratio`."""
    warmup = max(1, round(total_steps * warmup_ratio)) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
