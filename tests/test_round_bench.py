"""RoundBench at batch B fills its cache from one row's prefill: every row then holds that real
context (not zeros), and the timed passes and draft rounds run over B rows of it."""

import pytest
import torch
from helpers import ScriptedClock, make_draft

import dspark.timing
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


def test_timed_passes_report_the_median_of_the_timed_calls_only(tiny_target, monkeypatch):
    """`time_verify` / `time_draft` give the median of `repeats` timed calls of the pass (the
    clock scripted, so the figure is known exactly); warm-up calls run the pass but are not
    timed."""
    target, tok = tiny_target("llama")
    bench = RoundBench(target, make_draft(target, tok, block_size=4), context_len=20, max_tokens=3)
    forwards = []
    hook = target.model.norm.register_forward_hook(lambda *_: forwards.append(1))
    try:
        clock = ScriptedClock([0.9, 0.1, 0.2, 0.7, 0.4, 0.3, 0.5])
        monkeypatch.setattr(dspark.timing, "time", clock)
        assert bench.time_verify(3, repeats=3, warmup=2) == pytest.approx(0.2)  # not the mean
        assert len(forwards) == 2 + 3  # one target pass per call, warm-up included
        assert clock.reads == 2 * 3  # the warm-up calls were not timed
        assert bench.time_draft(repeats=4, warmup=1) == pytest.approx((0.4 + 0.5) / 2)
        assert clock.reads == 2 * 7 and len(forwards) == 5  # a draft round runs no target pass
    finally:
        hook.remove()
