"""Finished requests leave nothing behind: the decoder keeps no finished request's caches (a
test sees them only through a `DecodeObserver`); holding them cost GBs per call at batch 16+
(a regeneration job OOMed)."""

import gc
import weakref

from helpers import prompts_for, real_draft

from dspark.decoding import DecodeObserver, DecoderOptions, SpeculativeDecoder


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
    dec = SpeculativeDecoder(model, real_draft(model, tok), DecoderOptions(observer=seen))
    for run in (dec.generate, dec.generate_autoregressive):
        seen.refs.clear()
        run(prompts, 6)
        assert sorted(seen.refs) == [0, 1, 2]  # the hook saw every request finish
        gc.collect()
        alive = {id(r()) for refs in seen.refs.values() for r in refs if r() is not None}
        # only the decoder's reusable full-batch buffers may survive the call
        assert alive <= {id(dec._target_cache), id(dec._ctx_cache)}


def test_live_batch_retires_finished_rows_once():
    from dspark.decoding.live_batch import LiveBatch

    class _Cache:
        def __init__(self, rows):
            self.rows = rows

        def compact(self, moves, rows):  # in place, as the real caches do
            for dst, src, _ in moves:
                self.rows[dst] = self.rows[src]
            return _Cache(self.rows[:rows])

    seen = []

    class _Obs(DecodeObserver):
        def on_round(self, requests):
            seen.append(("round", requests))

        def on_finish(self, request, cache, ctx, row):
            seen.append(("finish", request, cache.rows[row], ctx.rows[row]))

    cache, ctx = _Cache(["t0", "t1", "t2"]), _Cache(["c0", "c1", "c2"])
    batch = LiveBatch([0, 1, 2], [5, 7, 9], cache, ctx, _Obs())
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


def test_retire_moves_rows_in_place_and_keeps_every_live_rows_committed_slots():
    """Swap-remove against a by-hand reference: after any set of finished rows, live row j
    holds exactly what old row keep[j] held below its position (4 rows, every subset)."""
    import itertools

    import torch

    from dspark.decoding.cache import DraftContextCache, TargetKVCache
    from dspark.decoding.live_batch import LiveBatch

    rows, layers, max_len = 4, 2, 8
    for gone in itertools.chain.from_iterable(
        itertools.combinations(range(rows), k) for k in range(1, rows + 1)
    ):
        cache = TargetKVCache(layers, rows, 2, 3, max_len, torch.float32, "cpu")
        for t in cache.keys + cache.values:
            t.copy_(torch.randn_like(t))
        ctx = DraftContextCache(rows, max_len)
        ctx.write([(torch.randn(rows, 1, max_len, 3), torch.randn(rows, 1, max_len, 3))],
                  torch.arange(max_len)[None].expand(rows, max_len), start=0)  # fmt: skip
        before = [t.clone() for t in cache.keys + cache.values + ctx.keys + ctx.values]
        positions = [5, 3, 8, 6]
        batch = LiveBatch([10, 11, 12, 13], list(positions), cache, ctx)
        done = {10 + g: True for g in gone}
        keep = batch.retire([done.get(r, False) for r in range(14)])
        assert sorted(keep) == [r for r in range(rows) if r not in gone], (gone, keep)
        assert batch.requests == [10 + k for k in keep]
        assert batch.positions == [positions[k] for k in keep]
        after = batch.cache.keys + batch.cache.values + batch.ctx.keys + batch.ctx.values
        for old, new in zip(before, after):
            assert new.shape[0] == (len(keep) or rows)  # nobody left: caches untouched
            for j, k in enumerate(keep):
                n = positions[k]
                torch.testing.assert_close(new[j, :, :n], old[k, :, :n], rtol=0, atol=0)
