"""Per-slot loss terms over chunks of slots, recomputed in backward, so no `[all slots, V]`
tensor is ever held (method doc, section 2).

The vocabulary-sized part of the draft (`lm_head(h) + markov bias`, then the caller's loss
terms on those logits: softmaxes, log-softmax, the target's logits) runs on `chunk_size` slots
at a time inside `torch.utils.checkpoint` (non-reentrant, so DDP and parameters captured by
closures work): forward keeps only each chunk's inputs (views of `[M, H]` / `[M, r]` tensors)
and its per-slot outputs `[m]`; backward recomputes one chunk at a time. Called from the
draft's `forward`, so every parameter use stays inside it (DDP / FSDP hooks see them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

# (logits [m, K], rows: the chunk's slice of the M slots, kept_ids [K] | None) -> per-slot
# terms {name: [m]}; K = V for a full draft vocabulary.
SlotLoss = Callable[[torch.Tensor, slice, torch.Tensor | None], dict[str, torch.Tensor]]
# (h [m, H], mixed [m, r] | None) -> draft logits [m, K]
SlotLogits = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


def chunk_bounds(num_slots: int, chunk_size: int | None) -> list[slice]:
    """Consecutive slices covering `num_slots`; one slice when `chunk_size` is 0 / None, and
    one empty slice when there are no slots (so the terms still exist, with shape [0])."""
    step = int(chunk_size) if chunk_size else max(num_slots, 1)
    if step < 0:
        raise ValueError(f"chunk_size must be >= 0 (got {chunk_size})")
    return [slice(s, min(s + step, num_slots)) for s in range(0, num_slots, step)] or [slice(0, 0)]


def chunked_slot_terms(
    slot_logits: SlotLogits,
    slot_loss: SlotLoss,
    h: torch.Tensor,
    mixed: torch.Tensor | None,
    kept_ids: torch.Tensor | None,
    chunk_size: int | None,
) -> dict[str, torch.Tensor]:
    """`slot_loss(slot_logits(h[rows], mixed[rows]), rows, kept_ids)` over chunks of the M
    selected slots, concatenated per term: `{name: [M]}`.

    `h [M, H]`, `mixed [M, r] | None`. `chunk_size` 0 / None: one chunk, no recomputation
    (autograd keeps the `[M, K]` intermediates until backward); otherwise each chunk is
    recomputed in backward while gradients are on, so only one chunk's intermediates exist.
    """

    def run(rows: slice, h_c: torch.Tensor, mixed_c: torch.Tensor | None):
        return slot_loss(slot_logits(h_c, mixed_c), rows, kept_ids)

    recompute = bool(chunk_size) and torch.is_grad_enabled()
    parts = []
    for rows in chunk_bounds(h.shape[0], chunk_size):
        args = (rows, h[rows], None if mixed is None else mixed[rows])
        parts.append(checkpoint(run, *args, use_reentrant=False) if recompute else run(*args))
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
