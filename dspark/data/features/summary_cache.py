"""The target's logit summaries over a feature cache, kept on disk per cache and target head.

`summarize_rows` is one pass of the target's whole head over every loss position of a set
(SmolLM2's 3,068-row recipe set: ~6 min on 2 cores, in fp32), paid at the start of every run
that trains a reduced-vocabulary draft on cached features. A second run on the same cache and
head (a sweep or ablation arm, a resumed run) reads them back instead.

Stored under `$DSPARK_CACHE/target_summaries/<key>.pt` (`{"key", "rows": {row: (lse [n] fp32,
argmax [n] int64)}}`), the key a hash of the feature cache's manifest (a remade cache is a new
key) and of the head's dtype, shape and weight bytes. Rows a file lacks (another split or
subset of the same cache) are computed and the union written back atomically; a file that does
not read back is measured again, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from dspark.data.features.feature_dataset import ROW_COLUMN, FeatureCache, summarize_rows
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


def summary_key(cache: FeatureCache, head: torch.nn.Module) -> dict:
    manifest = (cache.dir / "manifest.json").read_bytes()
    return {
        "version": 1,
        "feature_cache": str(cache.dir.resolve()),
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "head_sha256": head_fingerprint(head),
    }


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
    read back from the disk cache where it holds it, only the others computed (then saved)."""
    key = summary_key(cache, head)
    path = summary_path(key, root)
    with exclusive_output(path, "the target summary cache entry", wait=CACHE_WAIT_S):
        have = _read(path, key)
        rows = [int(r) for r in ds[ROW_COLUMN]]
        missing = [i for i, r in enumerate(rows) if r not in have]
        if missing:
            have |= summarize_rows(ds.select(missing), cache, summarize, progress=progress)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            packed = {r: (lse, top.to(torch.int32)) for r, (lse, top) in have.items()}
            torch.save({"key": key, "rows": packed}, tmp)
            tmp.replace(path)
    return {r: have[r] for r in rows}
