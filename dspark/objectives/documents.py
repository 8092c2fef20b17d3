"""Anchors of packed rows (several conversations per row, `dspark.data.packing`).

A packed conversation must get what it gets alone: anchors and supervised slots inside its own
document, and its own anchor budget (`num_anchors` per conversation, as the method draws them
per sequence), not a share of one budget per row.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dspark import losses as L


def document_starts(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """bool `[B, S]`: the first token of every document (position 0 of a row; with packed
    `document_ids`, also every position where the document changes).

    The objective clears the loss mask there, which makes anchors and supervision stop at
    document ends: a first token has no context in its own document (never an anchor) and
    nothing before it in its document predicts it (never a label), so an anchor p needs p+1 in
    its document and slot k stops before a document change. A packed conversation thus gets
    exactly the anchors and supervised slots it gets alone (chat data never has a loss mask on
    a row's first token, so unpacked rows lose nothing).
    """
    input_ids = batch["input_ids"]
    starts = torch.zeros_like(input_ids, dtype=torch.bool)
    starts[:, 0] = True
    docs = batch.get("document_ids")
    if docs is not None:
        starts[:, 1:] = docs[:, 1:] != docs[:, :-1]
    return starts


def sample_document_anchors(
    loss_mask: torch.Tensor,
    document_ids: torch.Tensor,
    num_anchors: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`L.sample_anchors` with the budget per document: up to `num_anchors` valid anchors of
    EACH document (all of them when it has no more), drawn without replacement, sorted.

    `loss_mask [B, S]` (already cleared at document starts), `document_ids [B, S]` (pads -1).
    Returns `(anchor_positions [B, N], anchor_valid [B, N])`, N = the largest per-row count
    (at least 1); missing ones are dummies at position 0, as in `L.sample_anchors`.
    """
    valid = L.valid_anchor_mask(loss_mask)
    B, S = valid.shape
    dev = valid.device
    gen_device = generator.device if generator is not None else torch.device("cpu")
    keys = torch.rand(B, S, generator=generator, device=gen_device).to(dev)
    keys = torch.where(valid, keys, torch.full_like(keys, 2.0))  # invalid positions rank last
    # Sort by (document, key): the rank of a position inside its document's run is its
    # index minus the index where that document's run starts.
    docs = document_ids.clamp(min=-1).to(torch.float64) + 1.0  # pads (-1) -> 0
    order = (docs * 4.0 + keys.double()).argsort(dim=1)
    sorted_docs = docs.gather(1, order)
    idx = torch.arange(S, device=dev).expand(B, -1)
    new_run = torch.ones_like(sorted_docs, dtype=torch.bool)
    new_run[:, 1:] = sorted_docs[:, 1:] != sorted_docs[:, :-1]
    run_start = torch.where(new_run, idx, torch.zeros_like(idx)).cummax(dim=1).values
    rank = torch.empty_like(idx)
    rank.scatter_(1, order, idx - run_start)
    chosen = valid & (rank < int(num_anchors))
    counts = chosen.sum(1)
    N = max(1, int(counts.max().item()) if B else 0)
    # Chosen positions first, in position order; the rest become dummies at position 0.
    pos_key = torch.where(chosen, idx, idx + S)
    picked = pos_key.argsort(dim=1)[:, :N]
    anchor_valid = chosen.gather(1, picked)
    positions = torch.where(anchor_valid, picked, torch.zeros_like(picked))
    return positions, anchor_valid
