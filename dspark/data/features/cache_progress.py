"""How far a feature cache being written has come, from its manifest alone (read-only, so it may
run beside `cache_features.py`): rows and shards done of the planned, and the pace of a row.

`write_cache` records its plan (`plan`: each shard's rows) before its first shard and each
shard as it finishes, so a killed or running cache says what is done. The pace is the time
between consecutive finished shards per row (their files' modification times), the usual one
(the median): a gap that spans a kill, a pause or a job's start says nothing of the pace.
`cache_cost` prices a complete cache at those paces, with the target head's pass over it, so a
run trained on it records what its features took (training's results.json, the data curve).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from dspark.data.features.feature_cache import MANIFEST, shard_name
from dspark.data.features.summary_cache import summary_progress
from dspark.data.outputs import read_json_object


def cache_progress(cache_dir: str | os.PathLike) -> dict | None:
    """The cache in `cache_dir`: `rows`, `rows_done`, `shards`, `shards_done`, `complete`,
    `s_per_row` (None before two consecutive shards) and `left_s`; None without a manifest."""
    out = Path(cache_dir)
    manifest = read_json_object(out / MANIFEST)
    if manifest is None:
        return None
    plan = manifest.get("plan") or []
    rows = int((manifest.get("settings") or {}).get("data_rows", 0))
    shards = manifest.get("shards") or []
    rows_done = sum(b - a for a, b in (s["rows"] for s in shards))
    by_file = {s["file"]: s for s in shards}
    finished: dict[int, tuple[float, int]] = {}  # shard index -> (mtime, rows)
    for k in range(len(plan)):
        s = by_file.get(shard_name(k))
        if s is None:  # not finished
            continue
        try:
            finished[k] = ((out / s["file"]).stat().st_mtime, s["rows"][1] - s["rows"][0])
        except (OSError, TypeError, KeyError):  # its file gone, or an entry without rows
            continue
    gaps = [
        (finished[k + 1][0] - finished[k][0]) / finished[k + 1][1]
        for k in finished
        if k + 1 in finished and finished[k + 1][1] > 0
        and finished[k + 1][0] > finished[k][0]  # a shard linked from another cache: no pace
    ]  # fmt: skip
    pace = statistics.median(gaps) if gaps else None
    complete = bool(manifest.get("complete"))
    left = 0.0 if complete else None if pace is None else max(0, rows - rows_done) * pace
    return {
        "cache": str(out),
        "rows": rows,
        "rows_done": rows_done,
        "shards": len(plan),
        "shards_done": len(shards),
        "complete": complete,
        "s_per_row": pace,
        "left_s": left,
    }


def cache_cost(cache_dir: str | os.PathLike, root: Path | None = None) -> dict | None:
    """What a complete cache took to make, in wall seconds at its recorded paces: `cache_s`,
    the target's passes writing it (`s_per_row` times its rows), and `head_pass_s`, a target
    head's pass over it (`summary_progress`: per shard times its shards, None where no head
    summarized it); each None where its files give no pace (one shard, or shards linked from
    another cache). None without a manifest. `root`: the summaries' `$DSPARK_CACHE`."""
    cache = cache_progress(cache_dir)
    if cache is None:
        return None
    head = summary_progress(cache_dir, root) or {}
    head_pace = head.get("s_per_shard") if head.get("shards_done") else None
    return {
        "rows": cache["rows"],
        "shards": cache["shards_done"],
        "cache_s": None if cache["s_per_row"] is None else cache["s_per_row"] * cache["rows"],
        "head_pass_s": None if head_pace is None else head_pace * head["shards"],
    }
