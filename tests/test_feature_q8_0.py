"""q8_0 feature storage is ggml's Q8_0, checked against gguf-py's reference bit for bit."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from dspark.data.features import feature_cache as fc
from dspark.data.features import q8_0


def features(rows=6, dim=128, seed=0):
    """bf16-exact rows with what quantizing meets: a massive channel, an all-zero block, tiny
    values, and ties (x / d exactly k + 0.5 in a block whose largest value is 127)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * torch.logspace(-3, 1, rows).unsqueeze(1)
    x[:, 5] = 2000.0  # an outlier channel, as SmolLM2's hidden states have
    x[:, 32:64] = 0.0
    x[0, 64:96] = torch.tensor([127.0, 0.5, -0.5, 1.5, -2.5, 3.5] + [0.0] * 26)
    return x.to(torch.bfloat16)


def test_blocks_equal_gguf_py_q8_0_bit_for_bit():
    x = features()
    q, d = q8_0.quantize(x)
    assert q.dtype == torch.int8 and d.dtype == torch.float16
    assert q.shape == x.shape and d.shape == (x.shape[0], x.shape[1] // q8_0.BLOCK)
    ref = gguf_quantize(x.float().numpy(), GGMLQuantizationType.Q8_0)  # [rows, blocks * 34]
    ref = ref.reshape(x.shape[0], -1, 34)
    ref_d = ref[..., :2].copy().view(np.float16)[..., 0]
    ref_q = ref[..., 2:].copy().view(np.int8).reshape(x.shape)
    np.testing.assert_array_equal(q.numpy(), ref_q)
    np.testing.assert_array_equal(d.numpy(), ref_d)
    assert q[0, 65:70].tolist() == [1, -1, 2, -3, 4]  # half away from zero, as ggml's roundf
    want = gguf_dequantize(ref.reshape(x.shape[0], -1), GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(q8_0.dequantize(q, d, torch.float32).numpy(), want)
    # every value within half a step of its block, plus 127 times the scale's fp16 rounding
    # (2^-11 relative, or half of fp16's subnormal step 2^-24 for the tiny blocks)
    err = (q8_0.dequantize(q, d, torch.float32) - x.float()).abs().reshape(6, -1, q8_0.BLOCK)
    step = d.float().unsqueeze(-1)
    assert (err <= step * (0.5 + 127 * 2**-11) + 127 * 2**-25).all()


def test_a_width_not_in_whole_blocks_or_an_overflowing_scale_is_refused(tmp_path, tiny_target):
    with pytest.raises(fc.FeatureCacheError, match="multiple of 32.*--dtype bf16"):
        fc.Layout(hidden=100, num_layers=2, dtype="q8_0")
    with pytest.raises(fc.FeatureCacheError, match="not one of"):
        fc.Layout(hidden=64, num_layers=2, dtype="int4")
    with pytest.raises(ValueError, match="--dtype bf16"):
        q8_0.quantize(torch.full((1, 32), 1e7))
    target, tok = tiny_target("llama")
    with pytest.raises(fc.FeatureCacheError, match="not one of"):  # before anything is read
        fc.write_cache(
            target,
            tmp_path / "no-such-set",
            tmp_path / "out",
            layer_ids=[0],
            target_name="t",
            pad_token_id=tok.pad_token_id,
            dtype="int4",
            progress=False,
        )
    assert not (tmp_path / "out").exists()
