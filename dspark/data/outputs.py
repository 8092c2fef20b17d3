"""Output directories of the data scripts: writable, and never holding someone else's files.

Each writer (regeneration, tokenized set, feature cache) recognises a directory it wrote
itself by a marker file (`run.json`, a tokenized `manifest.json`, a feature cache's
`manifest.json`) and resumes or rebuilds it. A directory without that marker but with a file
of the same name as one the writer writes belongs to something else, and writing there would
overwrite it, so it is refused with the path and the fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dspark.errors import BadInputError


def require_output_dir(path: str | os.PathLike, key: str = "--output") -> Path:
    """`path` as a directory this process can create or write into, else a `BadInputError`.

    Checked before any slow work (loading a target), so a typo costs seconds, not minutes."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise BadInputError(
            f"{key} {path} is a file, not a directory; pass a directory (it is created when "
            "missing)"
        )
    probe = p
    while not probe.exists() and probe != probe.parent:  # the nearest existing ancestor
        probe = probe.parent
    if not probe.is_dir():
        raise BadInputError(
            f"{key} {path}: {probe} is a file, so the directory cannot be made there; pass "
            "another path"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "it" if probe == p else f"its parent {probe}"
        raise BadInputError(
            f"{key} {path}: {where} is not writable; pass a directory you can write to, or "
            "change its permissions"
        )
    return p


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when the file is not one (not JSON, not UTF-8)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def read_json_rows(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines log (a step's runs.jsonl, a run's metrics.jsonl); a line
    that is not one (the torn last line of a killed writer) is no row. A missing file has none."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def refuse_foreign(
    out: Path, names: Iterable[str], *, marker: str, what: str, key: str = "--output"
) -> None:
    """Raise when `out` (which holds no `marker` of ours) has a file the writer would write."""
    if not out.is_dir():
        return
    for name in names:
        hits = sorted(out.glob(name)) if any(c in name for c in "*?[") else [out / name]
        for hit in hits:
            if hit.exists():
                raise BadInputError(
                    f"{key} {out}: {hit} was not written by {what} ({out} has no {marker}) "
                    f"and would be overwritten; pass a new {key} directory, or move that file "
                    "away"
                )


def require_writable_files(out: Path, names: Iterable[str], key: str = "--output") -> None:
    """Raise when a file the writer appends to or replaces exists but cannot be written."""
    for name in names:
        f = out / name
        if f.exists() and not os.access(f, os.W_OK):
            raise BadInputError(
                f"{key} {out}: {f} is not writable; change its permissions or pass a new {key}"
            )
