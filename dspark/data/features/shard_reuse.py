"""Shards another feature cache already holds: linked, not computed again, when a set grows.

A tokenized set grown by more rows (a data build that answered further, a data curve's next
point) keeps its first rows, and `plan_shards` closes each shard from the sizes of the rows up
to it alone. So every shard of the smaller set's plan but its last covers the same rows in the
larger set's plan, and a shard's batches are formed from its own rows only: computing it again
would write the same bytes. Such a shard is hard-linked into the new cache (copied where the two
caches sit on different filesystems) and its SHA-256 checked against the other manifest.

A shard is taken only from a cache made with the same settings but for the data (target and its
identity, layers, dtype, positions, batch and shard sizes), for the same row range, and when its
rows' hash (`rows_sha256`: the token ids and loss masks of those rows) equals the new rows'.
Caches written before `rows_sha256` was recorded offer nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dspark.fileio import file_sha256

# settings that describe the tokenized set rather than how its features were made
DATA_SETTINGS = ("data_hash", "data_rows", "data_tokens")


def rows_sha256(ds, start: int, end: int) -> str:
    """SHA-256 of rows `[start, end)` of a tokenized set: each row's length, token ids and loss
    mask (int64), in order."""
    h = hashlib.sha256()
    part = ds[start:end]
    for ids, mask in zip(part["input_ids"], part["loss_mask"]):
        h.update(np.int64(len(ids)).tobytes())
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        h.update(np.asarray(mask, dtype=np.int64).tobytes())
    return h.hexdigest()


def _making(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in DATA_SETTINGS}


def offered_shards(
    settings: dict, caches: Sequence[tuple[Path, dict]]
) -> tuple[dict[tuple[int, int, str], tuple[Path, dict]], list[str]]:
    """`({(start, end, rows_sha256): (shard path, manifest entry)}, notes)` over the finished
    shards of `caches` (each a directory and its manifest) made as `settings` say; a note names
    each cache that offers nothing and why."""
    offered: dict[tuple[int, int, str], tuple[Path, dict]] = {}
    notes = []
    for cache, m in caches:
        if _making(m["settings"]) != _making(settings):
            diff = sorted(k for k in _making(settings) if m["settings"].get(k) != settings.get(k))
            notes.append(f"{cache}: made with other settings ({', '.join(diff)}), nothing reused")
            continue
        usable = [s for s in m["shards"] if "rows_sha256" in s]
        if not usable:
            notes.append(f"{cache}: its shards record no rows_sha256, nothing reused")
        for s in usable:
            a, b = s["rows"]
            offered.setdefault((a, b, s["rows_sha256"]), (Path(cache) / s["file"], s))
    return offered, notes


def link_shard(src: Path, dst: Path, sha256: str) -> bool:
    """Place `src` at `dst` (a hard link, else a copy), atomically; False, with nothing left
    at `dst`, when the file's SHA-256 is not `sha256` (the other cache's file was altered)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    os.close(fd)
    os.unlink(tmp)
    try:
        os.link(src, tmp)
    except OSError:  # another filesystem, or links not allowed there
        shutil.copyfile(src, tmp)
    if file_sha256(Path(tmp)) != sha256:
        os.unlink(tmp)
        return False
    os.replace(tmp, dst)
    return True
