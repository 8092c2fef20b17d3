"""The target's logit summaries over a feature cache, kept on disk per shard and target head.

`summarize_rows` is one pass of the target's whole head over every loss position of a set
(SmolLM2's 3,068-row recipe set: ~6 min on 2 cores, in fp32; 12,000 rows: ~15 min), paid at
the start of every run that trains a reduced-vocabulary draft on cached features. A second run
on the same cache and head (a sweep or ablation arm, a resumed run) reads them back instead,
and so does a run on a grown cache (`shard_reuse`) for the shards it shares with a smaller one.

Stored under `$DSPARK_CACHE/target_summaries/<key>.pt`, one file per shard
(`{"key", "rows": {row in shard: (lse [n] fp32, argmax [n] int32)}}`), the key a hash of the
shard's SHA-256 (a shard's bytes fix its rows' features; a linked shard keeps it) and of the
head's dtype, shape and weight bytes. Rows a file lacks are computed and the union written back
atomically; a file that does not read back is measured again, never trusted. A file of the
earlier layout, one per cache (keyed by its manifest), is read where a shard's file lacks rows.
`summary_progress` says, from these files alone, how far a run's pass over a cache has come.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from dspark.data.features.feature_cache import MANIFEST
from dspark.data.features.feature_dataset import ROW_COLUMN, FeatureCache, summarize_rows
from dspark.data.outputs import read_json_object
from dspark.locking import CACHE_WAIT_S, exclusive_output
from dspark.paths import cache_root

Summaries = dict[int, tuple[torch.Tensor, torch.Tensor]]


def head_fingerprint(head: torch.nn.Module) -> str:
    """sha256 of the head's weight (and bias): dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in ("weight", "bias"):
        t = getattr(head, name, None)
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def summary_key(cache: FeatureCache, head_sha256: str) -> dict:
    """The earlier layout's key: one file for a whole cache, by its manifest's bytes."""
    manifest = (cache.dir / "manifest.json").read_bytes()
    return {
        "version": 1,
        "feature_cache": str(cache.dir.resolve()),
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "head_sha256": head_sha256,
    }


def shard_summary_key(shard: dict, head_sha256: str) -> dict:
    return {"version": 2, "shard_sha256": shard["sha256"], "head_sha256": head_sha256}


def summary_path(key: dict, root: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return (root or cache_root()) / "target_summaries" / f"{digest}.pt"


def _read(path: Path, key: dict) -> Summaries:
    if not path.exists():
        return {}
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a torn or foreign file: summarized again, never trusted
        return {}
    if not isinstance(saved, dict) or saved.get("key") != key:
        return {}
    return {int(r): (lse, top.long()) for r, (lse, top) in saved["rows"].items()}


def _write(path: Path, key: dict, rows: Summaries) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    packed = {r: (lse, top.to(torch.int32)) for r, (lse, top) in rows.items()}
    torch.save({"key": key, "rows": packed}, tmp)
    tmp.replace(path)


def load_or_summarize(
    ds,
    cache: FeatureCache,
    head: torch.nn.Module,
    summarize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    *,
    root: Path | None = None,
    progress: bool = True,
) -> Summaries:
    """`summarize_rows(ds, cache, summarize)` (`summarize`: the summary of `head`), each row
    read back from the disk cache where its shard's file holds it, only the others computed
    (then saved)."""
    head_sha = head_fingerprint(head)
    rows = [int(r) for r in ds[ROW_COLUMN]]
    by_shard: dict[int, list[int]] = {}  # shard -> positions in ds of its rows
    for i, r in enumerate(rows):
        by_shard.setdefault(cache.shard_of(r), []).append(i)
    legacy: Summaries | None = None  # the earlier per-cache file, read once where needed
    out: Summaries = {}
    for k, idx in sorted(by_shard.items()):
        shard = cache.shards[k]
        start = shard["rows"][0]
        key = shard_summary_key(shard, head_sha)
        path = summary_path(key, root)
        with exclusive_output(path, "the target summary cache entry", wait=CACHE_WAIT_S):
            have = {start + j: v for j, v in _read(path, key).items()}
            missing = [i for i in idx if rows[i] not in have]
            if missing and legacy is None:
                old_key = summary_key(cache, head_sha)
                legacy = _read(summary_path(old_key, root), old_key)
            found = {rows[i]: legacy[rows[i]] for i in missing if legacy and rows[i] in legacy}
            todo = [i for i in missing if rows[i] not in found]
            if todo:
                found |= summarize_rows(ds.select(todo), cache, summarize, progress=progress)
            if found:
                have |= found
                _write(path, key, {r - start: v for r, v in have.items()})
        out.update((rows[i], have[rows[i]]) for i in idx)
    return {r: out[r] for r in rows}


def _shard_of_file(path: Path) -> str | None:
    """The shard SHA-256 a summary file is keyed by; None for a file that does not read."""
    try:  # mmap: the key is read, the rows' tensors are not
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    key = saved.get("key") if isinstance(saved, dict) else None
    return key.get("shard_sha256") if isinstance(key, dict) else None


def summary_progress(cache_dir: str | os.PathLike, root: Path | None = None) -> dict | None:
    """How far the pass of a target head over the cache in `cache_dir` has come, read-only from
    the summary files (so it may run beside the pass): `shards`, `shards_done` (shards with a
    summary file, for any head: a cache's shards are summarized by one target's head), the pace
    `s_per_shard` (the median gap between consecutive files' modification times: a gap over a
    kill or a job's start says nothing of the pace) and `left_s`; None without a manifest."""
    manifest = read_json_object(Path(cache_dir) / MANIFEST)
    if manifest is None:
        return None
    shards = {
        s["sha256"] for s in manifest.get("shards") or [] if isinstance(s, dict) and "sha256" in s
    }
    done: dict[str, float] = {}  # shard sha256 -> its newest summary file's mtime
    folder = (root or cache_root()) / "target_summaries"
    for path in sorted(folder.glob("*.pt")) if folder.is_dir() else []:
        sha = _shard_of_file(path)
        if sha is not None and sha in shards:
            done[sha] = max(done.get(sha, 0.0), path.stat().st_mtime)
    times = sorted(done.values())
    gaps = [b - a for a, b in zip(times, times[1:])]
    pace = statistics.median(gaps) if gaps else None
    left = max(0, len(shards) - len(done)) * pace if pace is not None else None
    return {
        "shards": len(shards),
        "shards_done": len(done),
        "s_per_shard": pace,
        "left_s": 0.0 if len(done) >= len(shards) else left,
    }
