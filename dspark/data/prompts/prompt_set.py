"""A prompt source's rows as a job uses them: the selected rows, normalised, and the rejects.

A malformed row is never fatal and never silently dropped: it becomes a `RejectedRow` with its
row number (0-based, in source order) and the reason, and is counted. `RowSelection` (skip,
`where`, limit) says which rows a job takes; rows keep their source row number as `index`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from dspark.data.prompts.rows import BadLine, MalformedRow, normalize_row
from dspark.errors import BadInputError


@dataclass
class RejectedRow:
    index: int
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PromptSet:
    """Normalised rows `{"index": source row number, "messages": [...]}` plus the rejects."""

    source: str
    rows: list[dict] = field(default_factory=list)
    rejected: list[RejectedRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def write_rejected(self, path: str | os.PathLike) -> None:
        """Write the per-row report of rejected rows as JSONL (empty file when none)."""
        write_rejected([self], path)


def write_rejected(sets: list[PromptSet], path: str | os.PathLike) -> None:
    """One JSONL report of the rejected rows of several prompt sets, each naming its source."""
    with open(path, "w", encoding="utf-8") as f:
        for ps in sets:
            for r in ps.rejected:
                f.write(json.dumps({"source": ps.source, **r.to_dict()}, ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class RowSelection:
    """Which source rows a job uses: skip the first `skip`, keep those whose fields equal every
    `where` value (e.g. `{"source": "gsm8k-train"}` in a mixed prompt file), then the first
    `limit` of what is left. Rows keep their source row number as `index`, so two selections
    of one file never collide and a resumed job finds its rows again."""

    limit: int | None = None
    skip: int = 0
    where: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(
        cls, limit: int | None = None, skip: int = 0, where: list[str] | None = None
    ) -> RowSelection:
        """From CLI strings `KEY=VALUE` (repeatable)."""
        pairs = []
        for w in where or []:
            key, sep, value = w.partition("=")
            if not sep or not key:
                raise BadInputError(f"--where {w!r}: expected KEY=VALUE, e.g. source=gsm8k-train")
            pairs.append((key, value))
        if skip < 0 or (limit is not None and limit < 0):
            raise BadInputError(f"--skip {skip} / --limit {limit}: must be >= 0")
        return cls(limit=limit, skip=skip, where=tuple(pairs))

    def describe(self, source: str) -> str:
        """The source's identity for resume checks: another selection is another job."""
        parts = [source]
        if self.skip:
            parts.append(f"from row {self.skip}")
        parts += [f"where {k}={v}" for k, v in self.where]
        return " ".join(parts)

    def matches(self, row: Any) -> bool:
        get = row.get if isinstance(row, dict) else (lambda k: None)
        return all(str(get(k)) == v for k, v in self.where)


def normalize_rows(
    rows, source: str = "<rows>", selection: RowSelection | None = None
) -> PromptSet:
    """Normalise an iterable of raw rows, keeping a report of the rejected ones.

    `selection` skips, filters and limits (default: every row). Rejected rows count toward
    the limit, filtered-out rows do not."""
    sel = selection if selection is not None else RowSelection()
    out = PromptSet(source=sel.describe(source))
    taken = 0
    keys_seen = {k: False for k, _ in sel.where}
    n_rows = 0
    for i, row in enumerate(rows):
        if sel.limit is not None and taken >= sel.limit:
            break
        n_rows = i + 1
        if i < sel.skip:
            continue
        if sel.where and not isinstance(row, BadLine):
            for k in keys_seen:
                keys_seen[k] = keys_seen[k] or (isinstance(row, dict) and k in row)
            if not sel.matches(row):
                continue
        taken += 1
        if isinstance(row, BadLine):
            out.rejected.append(RejectedRow(i, row.reason))
            continue
        try:
            out.rows.append(_normalized(i, row))
        except MalformedRow as e:
            out.rejected.append(RejectedRow(i, str(e)))
    if sel.skip and n_rows <= sel.skip:
        raise BadInputError(
            f"--skip {sel.skip}: {source} has only {n_rows} rows, so none is left; skip fewer rows"
        )
    missing = [k for k, seen in keys_seen.items() if not seen]
    if missing:
        raise BadInputError(
            f"--where {missing[0]}=...: no row of {source} has a field {missing[0]!r}; "
            "use a field its rows have (e.g. `source` in the train_mix prompt set)"
        )
    return out


def _normalized(i: int, row: Any) -> dict:
    """`{"index": row number, "messages": ...}`; a row's own int `index` (e.g. a regenerated
    file's source row) is kept as `source_index`."""
    out = {"index": i, "messages": normalize_row(row)}
    own = row.get("index")
    if isinstance(own, int) and not isinstance(own, bool):
        out["source_index"] = own
    finish = row.get("finish_reasons")  # a regenerated file: which answers hit the limit
    if isinstance(finish, list) and all(isinstance(f, str) for f in finish):
        out["finish_reasons"] = finish
    return out


def require_rows(
    ps: PromptSet, source: str, key: str | None = None, selection: RowSelection | None = None
) -> PromptSet:
    """`ps` when it has rows to work on; else a `BadInputError` saying the source (passed as
    `key`, e.g. `--input`) is empty, or that every row was rejected (with the first reason)."""
    if ps.rows:
        return ps
    label = f"{key} {source}" if key else f"prompt source {source}"
    if ps.rejected:
        first = ps.rejected[0]
        raise BadInputError(
            f"{label}: none of its rows can be used, all {len(ps.rejected)} were rejected "
            f"(first: row {first.index}: {first.reason}); fix the file (rows need `messages`, "
            "`conversations`, `turns` or `instruction`)"
        )
    sel = selection or RowSelection()
    if sel.skip or sel.where or sel.limit is not None:
        why = "it is empty, or --skip/--where/--limit selected none"
    else:
        why = "it is empty"
    raise BadInputError(
        f"{label} has no rows ({why}); pass a source with at least one conversation"
    )
