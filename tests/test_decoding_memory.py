"""Finished requests leave nothing behind: the decoder keeps no finished request's caches (a
test sees them only through a `DecodeObserver`); holding them cost GBs per call at batch 16+
(a regeneration job OOMed)."""

import gc
import weakref

from test_decoding import _real_draft, prompts_for

from dspark.decoding import DecodeObserver, SpeculativeDecoder


class _WeakFinals(DecodeObserver):
    """Weak references to each finished request's caches: the test itself pins nothing."""

    def __init__(self):
        self.refs: dict[int, list] = {}

    def on_finish(self, request, cache, ctx, row):
        self.refs[request] = [weakref.ref(c) for c in (cache, ctx) if c is not None]


def test_no_caches_are_kept_after_a_call(tiny_target):
    model, tok = tiny_target("qwen3")
    prompts = prompts_for(model.config.vocab_size, (4, 7, 9), 5)
    seen = _WeakFinals()
    dec = SpeculativeDecoder(model, _real_draft(model, tok), observer=seen)
    assert not hasattr(dec, "last_caches") and not hasattr(dec, "live_rows")
    for run in (dec.generate, dec.generate_autoregressive):
        seen.refs.clear()
        run(prompts, 6)
        assert sorted(seen.refs) == [0, 1, 2]  # the hook saw every request finish
        gc.collect()
        alive = {id(r()) for refs in seen.refs.values() for r in refs if r() is not None}
        # only the decoder's reusable full-batch buffers may survive the call
        assert alive <= {id(dec._target_cache), id(dec._ctx_cache)}


def test_live_batch_retires_finished_rows_once():
    import torch

    from dspark.decoding.live_batch import LiveBatch

    class _Cache:
        def __init__(self, rows):
            self.rows = rows

        def select(self, index):
            return _Cache([self.rows[i] for i in index.tolist()])

    seen = []

    class _Obs(DecodeObserver):
        def on_round(self, requests):
            seen.append(("round", requests))

        def on_finish(self, request, cache, ctx, row):
            seen.append(("finish", request, cache.rows[row], ctx.rows[row]))

    cache, ctx = _Cache(["t0", "t1", "t2"]), _Cache(["c0", "c1", "c2"])
    batch = LiveBatch([0, 1, 2], [5, 7, 9], cache, ctx, torch.device("cpu"), _Obs())
    assert batch.retire([False, False, False]) is None and batch.cache is cache
    batch.start_round()
    assert batch.retire([False, True, False]) == [0, 2]
    assert batch.requests == [0, 2] and batch.positions == [5, 9]
    assert batch.cache.rows == ["t0", "t2"] and batch.ctx.rows == ["c0", "c2"]
    last = batch.cache
    assert batch.retire([True, True, True]) == [] and not batch
    assert batch.cache is last  # nobody left: no gather
    assert seen == [
        ("round", [0, 1, 2]),
        ("finish", 1, "t1", "c1"),
        ("finish", 0, "t0", "c0"),
        ("finish", 2, "t2", "c2"),
    ]
