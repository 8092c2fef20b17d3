"""Noise on the target's features during training: the draft learns to read hidden states a
little off the ones it was trained on (at decode time it reads the target's states at text it
drafted, in another dtype or engine). EAGLE adds uniform noise of a fixed size to its
features; here the size is relative, so one setting fits targets whose layers differ in scale.
"""

from __future__ import annotations

import torch

# Off by default (`objective.feature_noise`); docs/results.md has what it changed.
FEATURE_NOISE = 0.0


def noisy_features(
    tapped: torch.Tensor, num_layers: int, scale: float, generator: torch.Generator
) -> torch.Tensor:
    """`tapped [B, S, L*H]` (L tapped layers, concatenated) plus Gaussian noise whose std is
    `scale` times the RMS of each layer's H-vector at each position.

    The noise is drawn on the CPU from `generator` (the objective's checkpointed anchor RNG), so
    a resumed run draws the same noise; returned in `tapped`'s dtype and device."""
    B, S, LH = tapped.shape
    if LH % num_layers:
        raise ValueError(f"tapped width {LH} is not {num_layers} layers of equal size")
    x = tapped.float().view(B, S, num_layers, LH // num_layers)
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()  # [B, S, L, 1]
    eps = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.device)
    return (x + scale * rms * eps).view(B, S, LH).to(tapped.dtype)
