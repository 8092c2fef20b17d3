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
