"""The static KV cache writes each row's K/V at that row's own slots (ragged batches)."""

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_writes_each_row_at_its_own_positions(dtype):
    """Ragged per-row positions (no common start) against a hand loop over rows and slots."""
    from dspark.decoding.cache import TargetKVCache

    g = torch.Generator().manual_seed(0)
    rows, heads, dim, max_len, n = 5, 2, 3, 12, 3
    cache = TargetKVCache(2, rows, heads, dim, max_len, dtype, "cpu")
    before_k = [torch.randn(rows, heads, max_len, dim, generator=g).to(dtype) for _ in range(2)]
    for layer in range(2):
        cache.keys[layer].copy_(before_k[layer])
        cache.values[layer].copy_(before_k[layer] * 2)
    starts = torch.tensor([0, 4, 9, 2, 7])
    positions = starts[:, None] + torch.arange(n)
    cache.prepare(positions, max_len, None)
    k_new = torch.randn(rows, heads, n, dim, generator=g).to(dtype)
    v_new = torch.randn(rows, heads, n, dim, generator=g).to(dtype)
    k_out, v_out = cache.update(k_new, v_new, 1)
    want_k, want_v = before_k[1].clone(), before_k[1] * 2
    for b in range(rows):
        for i in range(n):
            want_k[b, :, positions[b, i]] = k_new[b, :, i]
            want_v[b, :, positions[b, i]] = v_new[b, :, i]
    assert torch.equal(cache.keys[1], want_k) and torch.equal(cache.values[1], want_v)
    assert torch.equal(k_out, want_k) and torch.equal(v_out, want_v)
    assert torch.equal(cache.keys[0], before_k[0])  # only the layer written changed
