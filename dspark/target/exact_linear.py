"""fp32 logits of bf16 inputs on the CPU's bf16 matrix units.

A bf16 target's head and the post-norm states cached from it are bf16 tensors, so every input
of their fp32 logits is exact in bf16. oneDNN's bf16 mode for fp32 matmuls
(`torch.backends.mkldnn.matmul.fp32_precision = "bf16"`) rounds the inputs to bf16 (here: no
change), multiplies on the bf16 units (AMX, AVX512-BF16), accumulates in fp32 and writes fp32:
the fp32 product up to summation order, ~4x faster than the fp32 kernel at the SmolLM2 head's
shapes on an AMX Xeon (docs/results.md). On AVX512-BF16 without AMX (AMD Zen 4) torch 2.13's
oneDNN keeps the fp32 kernel in that mode: the same product, no faster. Every other case (an
fp32 head, states not in bf16, a GPU, a CPU without bf16 units) takes the plain fp32 matmul.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from dspark.machine import cpu_flags


@functools.cache
def cpu_has_bf16_units() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


@contextlib.contextmanager
def _bf16_fp32_matmuls():
    matmul = torch.backends.mkldnn.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def _bf16_units_for(x: torch.Tensor) -> bool:
    """Whether a matmul on `x` can use the bf16 units: a CPU that has them, oneDNN on."""
    return (
        x.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and bool(torch.backends.mkldnn.enabled)
        and cpu_has_bf16_units()
    )


def exact_in_bf16(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `fp32_linear(x, weight)` runs on the bf16 units: both bf16 (so exact there),
    on a CPU that has them, with oneDNN on."""
    return x.dtype == weight.dtype == torch.bfloat16 and _bf16_units_for(x)


def fp32_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    bf16_exact: bool | None = None,
) -> torch.Tensor:
    """`x [.., H] @ weight [N, H].T + bias [N]` in fp32, autocast off. `bf16_exact`: whether x
    and weight hold bf16 values (default: both are bf16 tensors; pass True for fp32 copies of
    bf16 tensors, e.g. a head's rows cast once)."""
    exact = x.dtype == weight.dtype == torch.bfloat16 if bf16_exact is None else bf16_exact
    fast = exact and _bf16_units_for(x)
    with torch.autocast(x.device.type, enabled=False):
        with _bf16_fp32_matmuls() if fast else contextlib.nullcontext():
            out = F.linear(x.float(), weight.float())
        return out if bias is None else out + bias.float()
