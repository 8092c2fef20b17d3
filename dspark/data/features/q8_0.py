"""Feature vectors in llama.cpp's Q8_0 blocks: 32 int8 values and one fp16 scale a block.

A feature cache stored as `q8_0` takes 34 bytes per 32 values (1.0625 a value) against bf16's
64, so the same disk holds 1.88x the rows. Per block of 32 values x: `d = max|x| / 127`,
`q = round_half_away(x / d)` (x times the fp32 reciprocal of d, as ggml-quants.c computes it),
d stored as fp16; the value read back is `q * d`. This is ggml's own Q8_0, bit for bit
(tests/test_feature_q8_0.py checks it against gguf-py's reference). The rows of a cache are
quantized from their bf16 values, so a q8_0 cache holds a bf16 cache's vectors quantized.

Tensor shapes: `x [T, D]` with D a multiple of `BLOCK`; `q [T, D]` int8, `d [T, D / BLOCK]`
fp16.
"""

from __future__ import annotations

import torch

from dspark.errors import BadInputError

BLOCK = 32


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(q [T, D] int8, d [T, D / BLOCK] fp16)` of `x [T, D]`, D a multiple of BLOCK."""
    t, dim = x.shape
    if dim % BLOCK:
        raise BadInputError(
            f"q8_0 needs rows a multiple of {BLOCK} wide, got {dim}; store them as bf16 (--dtype bf16)"
        )
    blocks = x.to(torch.bfloat16).float().reshape(t, dim // BLOCK, BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = blocks * inv
    # ggml rounds half away from zero (roundf), torch.round to even
    q = scaled.sign() * (scaled.abs() + 0.5).floor()
    d16 = d.squeeze(-1).to(torch.float16)
    if not torch.isfinite(d16).all():
        raise BadInputError(  # a UserError: the entry scripts print it as one `error:` line
            "a block's largest value exceeds what a q8_0 scale holds (127 x 65504); store "
            "these features as bf16 (--dtype bf16)"
        )
    return q.to(torch.int8).reshape(t, dim), d16


def dequantize(q: torch.Tensor, d: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """`q * d` as `[T, D]` in `dtype` (the product is exact in fp32, then rounded once)."""
    t, dim = q.shape
    blocks = q.reshape(t, dim // BLOCK, BLOCK).float() * d.float().unsqueeze(-1)
    return blocks.reshape(t, dim).to(dtype)
