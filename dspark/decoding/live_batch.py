"""`LiveBatch`: the requests of one decoder call still decoding, their rows and caches.

Both `SpeculativeDecoder.generate` and `.generate_autoregressive` keep the same bookkeeping:
which request each batch row serves, each row's next position (host side), and the caches,
from which finished requests are gathered out so later rounds cost only what the live
requests need. Per-row tensors of the caller (anchors, generators) follow the `keep` index
that `retire` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.decoding.cache import DraftContextCache, TargetKVCache
from dspark.decoding.observer import DecodeObserver


@dataclass
class LiveBatch:
    requests: list[int]  # the request (index into the call's prompts) of each live row
    positions: list[int]  # per row, where its next token goes (the anchor's position)
    cache: TargetKVCache
    ctx: DraftContextCache | None  # None for the AR baseline
    device: torch.device
    observer: DecodeObserver | None = None

    def __len__(self) -> int:
        return len(self.requests)

    def start_round(self) -> None:
        """Tell the observer which request each live row serves this round."""
        if self.observer is not None:
            self.observer.on_round(list(self.requests))

    def retire(self, done: list[bool]) -> list[int] | None:
        """Drop the requests with `done[request]` (one gather of the caches, only when some
        finished; none when all did). Returns `keep`, the old row indices that stay (for the
        caller's own per-row tensors), or None when nobody left. The observer sees each
        finished request's final caches and row first."""
        gone = [i for i, b in enumerate(self.requests) if done[b]]
        if not gone:
            return None
        if self.observer is not None:
            for i in gone:
                self.observer.on_finish(self.requests[i], self.cache, self.ctx, i)
        keep = [i for i, b in enumerate(self.requests) if not done[b]]
        if keep:
            index = torch.tensor(keep, device=self.device)
            self.cache = self.cache.select(index)
            self.ctx = self.ctx.select(index) if self.ctx is not None else None
        self.requests = [self.requests[i] for i in keep]
        self.positions = [self.positions[i] for i in keep]
        return keep
