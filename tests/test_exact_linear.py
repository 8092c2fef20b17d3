"""fp32 logits of bf16 inputs on the CPU's bf16 units (`dspark.target.exact_linear`): the fp32
product up to summation order, against fp64; the mode is scoped to the call."""

import pytest
import torch

from dspark.machine import cpu_flags
from dspark.target import exact_linear as X


def _inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 64, generator=gen).to(dtype)
    w = torch.randn(300, 64, generator=gen).to(dtype)
    return x, w


@pytest.mark.parametrize("units", [True, False])
def test_bf16_inputs_give_the_fp32_product(monkeypatch, units):
    monkeypatch.setattr(X, "cpu_has_bf16_units", lambda: units)
    x, w = _inputs(torch.bfloat16)
    bias = torch.randn(300)
    want = x.double() @ w.double().T + bias.double()
    before = torch.backends.mkldnn.matmul.fp32_precision
    got = X.fp32_linear(x, w, bias)
    assert got.dtype == torch.float32
    # fp32 accumulation of 64 products of magnitude ~1: within a few fp32 ulps of ~10
    assert (got.double() - want).abs().max() < 1e-4
    assert torch.backends.mkldnn.matmul.fp32_precision == before
    # fp32 copies of the same bf16 values, declared exact: the same path and values
    assert torch.equal(X.fp32_linear(x.float(), w.float(), bias, bf16_exact=True), got)


def test_inputs_not_exact_in_bf16_keep_the_fp32_kernel(monkeypatch):
    # oneDNN takes the bf16 mode for fp32 matmuls on AMX; on AVX512-BF16 without AMX (AMD Zen 4)
    # torch 2.13 keeps its fp32 kernel (measured: the fp32 product within 1e-4 at the SmolLM2
    # head's shapes), so there the mode rounds nothing and there is nothing to keep away
    rounds_in_bf16_mode = "amx_bf16" in cpu_flags()
    monkeypatch.setattr(X, "cpu_has_bf16_units", lambda: True)
    x, w = _inputs(torch.float32)  # values bf16 cannot hold
    assert not X.exact_in_bf16(x, w) and not X.exact_in_bf16(x.bfloat16(), w)
    want = x.double() @ w.double().T
    assert (X.fp32_linear(x, w).double() - want).abs().max() < 1e-4
    # the bf16 mode on such inputs would round them: what the check keeps away
    lossy = X.fp32_linear(x, w, bf16_exact=True)
    if rounds_in_bf16_mode and torch.backends.mkldnn.is_available():
        assert (lossy.double() - want).abs().max() > 1e-3


def test_autocast_does_not_reach_the_logits():
    x, w = _inputs(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert X.fp32_linear(x, w).dtype == torch.float32
