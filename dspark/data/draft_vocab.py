"""A reduced draft vocabulary: the K target ids the target itself writes most often.

Counted over the supervised tokens (`loss_mask == 1`: the target's own answers and their
end-of-turn markers) of a tokenized set; ties go to the lower id, so the same set always
gives the same ids. The file (`draft_vocab_<K>.json` beside the set) holds the ids, sorted,
and the share of the supervised tokens they cover: a draft over those K ids can propose at
most that share of what the target writes (every other token ends its block there).
Exports take it as `--draft-vocab` (d2t / t2d in every format), training runs as
`draft.vocab_size=K` (dspark/training/draft_vocab.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dspark.errors import BadInputError
from dspark.fileio import write_text_atomic


def count_supervised(data_dir: str | os.PathLike, vocab_size: int) -> np.ndarray:
    """How often each target id is a supervised token of the tokenized set: `[vocab_size]`."""
    from datasets import load_from_disk  # light module: defers datasets

    ds = load_from_disk(str(data_dir))
    counts = np.zeros(vocab_size, dtype=np.int64)
    for row in ds.select_columns(["input_ids", "loss_mask"]):
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        mask = np.asarray(row["loss_mask"], dtype=bool)
        if ids.size and int(ids.max()) >= vocab_size:
            raise BadInputError(
                f"{data_dir} holds token id {int(ids.max())} >= vocab size {vocab_size}: it was "
                "tokenized for another target"
            )
        np.add.at(counts, ids[mask], 1)
    return counts


def top_ids(counts: np.ndarray, k: int) -> np.ndarray:
    """The `k` most frequent ids (ties: the lower id), sorted ascending."""
    if not 1 <= k <= counts.size:
        raise BadInputError(f"draft vocabulary size {k} must be in [1, {counts.size}]")
    order = np.lexsort((np.arange(counts.size), -counts))  # by count desc, then id asc
    return np.sort(order[:k])


def vocab_doc(counts: np.ndarray, k: int, sources: list[str], hashes: list[str]) -> dict:
    """The file's contents for the top-`k` ids of `counts [V]` over the tokenized `sources`
    (their `dataset_hash`es say which data the ids were counted on)."""
    total = int(counts.sum())
    if total == 0:
        raise BadInputError(f"{', '.join(sources)} has no supervised tokens to count")
    ids = top_ids(counts, k)
    return {
        "format": "dspark-draft-vocab-v1",
        "size": int(k),
        "vocab_size": int(counts.size),
        "coverage": float(counts[ids].sum() / total),
        "supervised_tokens": total,
        "seen_ids": int((counts > 0).sum()),
        "sources": sources,
        "data_hashes": hashes,
        "ids": [int(i) for i in ids],
    }


def write_draft_vocab(
    data_dir: str | os.PathLike | Sequence[str | os.PathLike],
    k: int,
    vocab_size: int,
    out_path: str | os.PathLike | None = None,
) -> Path:
    """`<data_dir>/draft_vocab_<k>.json` (or `out_path`): `{"ids": [...], "coverage": share,
    ...}`. Several tokenized sets (a list) are counted together; give them an `out_path` of
    their own (default: beside the first)."""
    from dspark.data.features.feature_cache import dataset_hash  # light module: defers torch

    if isinstance(data_dir, (list, tuple)):
        dirs = [Path(d) for d in data_dir]
    else:
        dirs = [Path(data_dir)]  # type: ignore[arg-type]  # a str / PathLike here
    counts = np.zeros(vocab_size, dtype=np.int64)
    for d in dirs:
        counts += count_supervised(d, vocab_size)
    doc = vocab_doc(counts, k, [str(d) for d in dirs], [dataset_hash(d) for d in dirs])
    out = Path(out_path) if out_path is not None else dirs[0] / f"draft_vocab_{k}.json"
    return write_text_atomic(out, json.dumps(doc) + "\n")
