"""`LiveBatch`: the requests of one decoder call still decoding, their rows and caches.

Both `SpeculativeDecoder.generate` and `.generate_autoregressive` keep the same bookkeeping:
which request each batch row serves, each row's next position (host side) and its anchor (the
last committed token, not yet in the caches), the sampling generator(s), and the caches, from
which finished requests are gathered out so later rounds cost only what the live requests need.
A round ends with `advance`; `retire` keeps every per-row member aligned with the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark.decoding.cache import DraftContextCache, TargetKVCache
from dspark.decoding.observer import DecodeObserver


@dataclass
class LiveBatch:
    requests: list[int]  # the request (index into the call's prompts) of each live row
    positions: list[int]  # per row, where its next token goes (the anchor's position)
    cache: TargetKVCache
    ctx: DraftContextCache | None  # None for the AR baseline
    observer: DecodeObserver | None = None
    anchors: torch.Tensor | None = None  # [R] long: each row's anchor, set by `advance`
    # one generator for the batch (or None), or a list with one per row (kept row-aligned)
    generator: torch.Generator | list[torch.Generator] | None = None
    _anchor_pos: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    def start_round(self) -> None:
        """Tell the observer which request each live row serves this round."""
        if self.observer is not None:
            self.observer.on_round(list(self.requests))

    @property
    def start(self) -> int | None:
        """The position every row writes from when all rows share it (one contiguous cache
        write), else None (each row writes at its own positions)."""
        return self.positions[0] if len(set(self.positions)) == 1 else None

    @property
    def anchor_pos(self) -> torch.Tensor:
        """`positions` on the anchors' device, `[R]` long (one host-to-device copy a round)."""
        if self._anchor_pos is None:
            assert self.anchors is not None  # `advance` set them
            self._anchor_pos = torch.tensor(self.positions, device=self.anchors.device)
        return self._anchor_pos

    def extend(self, other: LiveBatch, cache: TargetKVCache) -> None:
        """Append the rows of `other`, requests just prefilled into the storage rows right after
        this batch's; `cache` covers both (continuous batching). Per-row generators follow."""
        assert other.anchors is not None  # its prefill committed a first token
        if self.requests and self.anchors is not None:
            self.anchors = torch.cat([self.anchors, other.anchors])
        else:
            self.anchors = other.anchors
        if isinstance(self.generator, list) and isinstance(other.generator, list):
            self.generator = self.generator + other.generator
        self.requests = self.requests + other.requests
        self.positions = self.positions + other.positions
        self.cache, self._anchor_pos = cache, None

    def advance(self, steps: list[int], anchors: torch.Tensor, done: list[bool]) -> None:
        """After a round: row i moved `steps[i]` positions on and waits with `anchors[i]`; then
        the requests with `done[request]` leave (`retire`)."""
        self.positions = [p + n for p, n in zip(self.positions, steps)]
        self.anchors, self._anchor_pos = anchors, None
        self.retire(done)

    def retire(self, done: list[bool]) -> list[int] | None:
        """Drop the requests with `done[request]`; returns `keep`, the old row indices that
        stay in their new order (anchors and per-row generators follow it), or None when nobody
        finished. The observer sees each finished request's final caches and row first.

        Rows leave by swap-remove: the last live row moves into a finished row's slot (only its
        committed slots are copied) and the caches shrink to views of their first rows, so a
        retirement costs one row's copy per finished request instead of a gather of every
        live row, whose cost grows with the batch (docs/results.md, "Decoder internals")."""
        gone = [i for i, b in enumerate(self.requests) if done[b]]
        if not gone:
            return None
        if self.observer is not None:
            for i in gone:
                self.observer.on_finish(self.requests[i], self.cache, self.ctx, i)
        order, live, moves = list(range(len(self.requests))), len(self.requests), []
        for g in sorted(gone, reverse=True):
            last = live - 1
            if g != last:  # the last live row fills the hole; its slots < its position are live
                moves.append((g, last, self.positions[order[last]]))
                order[g] = order[last]
            live -= 1
        keep = order[:live]
        if keep:
            self.cache = self.cache.compact(moves, live)
            self.ctx = self.ctx.compact(moves, live) if self.ctx is not None else None
        self.requests = [self.requests[i] for i in keep]
        self.positions = [self.positions[i] for i in keep]
        self._anchor_pos = None
        if self.anchors is not None:
            self.anchors = self.anchors[keep]
        if isinstance(self.generator, list):
            self.generator = [self.generator[i] for i in keep]
        return keep
