"""RoundBench at batch B fills its cache from one row's prefill: every row then holds that real
context (not zeros), and the timed passes and draft rounds run over B rows of it."""

import torch
from helpers import make_draft

from dspark.decoding.round_cost import RoundBench


def test_a_batched_bench_copies_one_rows_context_into_every_row(tiny_target):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, block_size=4)
    one = RoundBench(target, draft, batch=1, context_len=20, max_tokens=3, seed=5)
    many = RoundBench(target, draft, batch=3, context_len=20, max_tokens=3, seed=5)
    assert torch.equal(many.ids[:1], one.ids)  # row 0 of the same seed
    for k1, kb in zip(one.cache.keys, many.cache.keys, strict=True):
        assert kb.shape[0] == 3 and k1[0, :, :20].abs().sum() > 0  # a filled context
        for r in range(3):
            torch.testing.assert_close(kb[r, :, :20], k1[0, :, :20], rtol=0, atol=0)
    assert many.context_taps.shape[0] == 3
    torch.testing.assert_close(many.context_taps[2], one.context_taps[0], rtol=0, atol=0)
    with torch.inference_mode():
        # the next token of row 0 after that context: the same logits at batch 1 and 3
        want = one.target_pass(1, False)[0][0]
        got = many.target_pass(1, False)[0]
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)
    assert got.shape[0] == 3
    assert many.time_verify(3, repeats=1, warmup=0) > 0
    assert many.time_draft(repeats=1, warmup=0) > 0
