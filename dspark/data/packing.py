"""Sequence packing: several conversations per row, so short conversations do not pay for padding.

`first_fit_pack(lengths, capacity, seed)` puts conversations into rows of `capacity` tokens by
greedy first-fit over a seeded random order (deterministic given the seed; a conversation
longer than `capacity` is truncated to it, as `PadCollator(max_length=)` does, and fills a row
alone). `PackedDataset` is the dataset transform: each item is one packed row with

- `input_ids`, `loss_mask`: the conversations concatenated;
- `document_ids`: 0, 1, 2, ... per conversation within the row (the collator pads with -1);
- `position_ids`: restarting at 0 for every conversation (the collator pads with 0).

Every consumer must then keep the conversations apart: the target runs with document-aware
causal attention and per-document positions (`dspark.target.capture`), the draft's block mask admits
context keys of the anchor's own document only and its RoPE positions are per document
(`dspark.modeling.backbone`), and anchors / supervised slots never cross a document end
(`dspark.objectives.dspark`). Packed features then equal those of each conversation run alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow.compute as pc
import torch
from torch.utils.data import Dataset


class _MaxTree:
    """Segment tree over row capacities: `first_fit(need)` = leftmost row with room >= need,
    in O(log rows), so packing a million conversations stays fast."""

    def __init__(self, n: int, capacity: int) -> None:
        size = 1
        while size < max(n, 1):
            size *= 2
        self.size = size
        self.tree = [0] * (2 * size)
        self.capacity = capacity

    def open_row(self, row: int) -> None:
        self.update(row, self.capacity)

    def update(self, row: int, room: int) -> None:
        i = row + self.size
        self.tree[i] = room
        i //= 2
        while i:
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])
            i //= 2

    def first_fit(self, need: int) -> int | None:
        if self.tree[1] < need:
            return None
        i = 1
        while i < self.size:
            i = 2 * i if self.tree[2 * i] >= need else 2 * i + 1
        return i - self.size


def first_fit_pack(lengths: Sequence[int], capacity: int, seed: int = 0) -> list[list[int]]:
    """Rows of conversation indices; each row's (truncated) lengths sum to <= `capacity`.

    Conversations are visited in a random order drawn from `seed` and each goes into the first
    row (lowest index) with room for it, else opens a new row. Zero-length items are skipped.
    """
    if capacity < 1:
        raise ValueError(f"packing capacity (data.max_length) must be >= 1, got {capacity}")
    gen = torch.Generator().manual_seed(int(seed))
    order = torch.randperm(len(lengths), generator=gen).tolist()
    tree = _MaxTree(len(lengths), capacity)
    rows: list[list[int]] = []
    for i in order:
        need = min(int(lengths[i]), capacity)
        if need <= 0:
            continue
        r = tree.first_fit(need)
        if r is None:
            r = len(rows)
            rows.append([])
            tree.open_row(r)
        rows[r].append(i)
        tree.update(r, tree.tree[r + tree.size] - need)
    return rows


def pack_features(features: Sequence[dict], capacity: int | None = None) -> dict[str, list[int]]:
    """Concatenate conversations (`input_ids`, `loss_mask`) into one packed row with
    `document_ids` and per-document `position_ids`; each is truncated to `capacity` first."""
    ids, lm, docs, pos = [], [], [], []
    for d, f in enumerate(features):
        x = _as_list(f["input_ids"])[:capacity]
        m = _as_list(f["loss_mask"])[:capacity]
        if len(x) != len(m):
            raise ValueError(f"input_ids ({len(x)}) and loss_mask ({len(m)}) lengths differ")
        ids += x
        lm += m
        docs += [d] * len(x)
        pos += list(range(len(x)))
    if capacity is not None and len(ids) > capacity:
        raise ValueError(f"packed row of {len(ids)} tokens exceeds capacity {capacity}")
    return {"input_ids": ids, "loss_mask": lm, "document_ids": docs, "position_ids": pos}


class PackedDataset(Dataset):
    """A tokenized dataset (rows with `input_ids`, `loss_mask`) repacked into rows of at most
    `max_length` tokens (`first_fit_pack` with `seed`); items are packed rows (see module doc)."""

    def __init__(self, dataset, max_length: int, seed: int = 0) -> None:
        self.dataset = dataset
        self.max_length = int(max_length)
        lengths = row_lengths(dataset)
        self.rows = first_fit_pack(lengths, self.max_length, seed)
        self.num_documents = sum(len(r) for r in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return pack_features([self.dataset[j] for j in self.rows[i]], self.max_length)


def row_lengths(dataset) -> list[int]:
    """Token count of every row: from the Arrow column of an HF `datasets.Dataset` (no Python
    lists of ids are built), else from a list of dicts."""
    if hasattr(dataset, "data") and hasattr(dataset, "column_names"):
        lengths = pc.list_value_length(dataset.data.column("input_ids"))
        indices = getattr(dataset, "_indices", None)  # a select() / train_test_split() view
        if indices is not None:
            lengths = lengths.take(indices.column(0))
        return lengths.to_pylist()
    return [len(row["input_ids"]) for row in dataset]


def _as_list(x) -> list[int]:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def padding_stats(
    lengths: Sequence[int], batch_size: int, max_length: int, packing: bool, seed: int = 0
) -> dict:
    """Padding of one epoch of batches, as the training loader builds them: rows truncated to
    `max_length`, `batch_size` rows per batch in a seeded random order, each batch padded to
    its longest row; with `packing` the rows are first-fit packed conversations.

    Returns `pad_share` (pad tokens / all tokens in the batches) and the counts behind it.
    """
    lens = [min(int(n), max_length) for n in lengths if int(n) > 0]
    if packing:
        rows = [sum(lens[i] for i in r) for r in first_fit_pack(lens, max_length, seed)]
    else:
        rows = lens
    gen = torch.Generator().manual_seed(int(seed) + 1)
    order = torch.randperm(len(rows), generator=gen).tolist()
    real = total = batches = 0
    for i in range(0, len(order), batch_size):
        chunk = [rows[j] for j in order[i : i + batch_size]]
        real += sum(chunk)
        total += len(chunk) * max(chunk)
        batches += 1
    return {
        "packing": packing,
        "conversations": len(lens),
        "rows": len(rows),
        "conversations_per_row": len(lens) / max(len(rows), 1),
        "batches": batches,
        "real_tokens": real,
        "batch_tokens": total,
        "pad_tokens": total - real,
        "pad_share": (total - real) / max(total, 1),
        "mean_tokens_per_batch": total / max(batches, 1),
    }
