"""`DecodeObserver`: optional hooks into `SpeculativeDecoder`'s live batch (tests, monitoring).

The decoder keeps no per-call state for inspection; a test that needs to see which request a
batch row serves, or a finished request's caches, passes an observer instead. The base class
does nothing, so an observer overrides only the hooks it needs.
"""

from __future__ import annotations


class DecodeObserver:
    def on_round(self, requests: list[int]) -> None:
        """Before each speculative round / AR step: `requests[i]` is the request (index into
        the call's prompts) that live batch row i serves. Rows leave as requests finish."""

    def on_finish(self, request: int, cache, ctx, row: int) -> None:
        """`request` has finished and is about to leave the live batch: `cache`
        (`TargetKVCache`) and `ctx` (`DraftContextCache`, None for the AR baseline) still hold
        it at batch row `row`, but only until this call returns: the live batch then moves
        another row into that slot in place, so copy what you keep
        (`cache.select(torch.tensor([row]))`). Tests only."""
