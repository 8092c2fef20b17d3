"""Prompt sources: local JSON/JSONL/Parquet/Arrow files, saved datasets, hub datasets, embedded.

Every row shape people have is normalised to one: `{"messages": [{"role", "content"}, ...]}`.

Accepted shapes (first match wins, keys whose value is None count as absent):
- `messages`: OpenAI `[{"role": system|user|assistant, "content": str}, ...]`
- `conversations`: ShareGPT `[{"from": human|user|gpt|assistant|chatgpt|system, "value": str}]`
- `turns`: `["user turn 1", "user turn 2", ...]` (as in the shared prompt sets); user turns only,
  the assistant answers come from regeneration.
- Alpaca: `instruction` (+ optional `input`, optional `output`).

A malformed row is never fatal and never silently dropped: it becomes a `RejectedRow` with its
row number (0-based, in source order) and the reason, and is counted.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dspark.errors import BadInputError, MissingPathError, UserError

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
_FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".csv": "csv",
}


class MalformedRow(ValueError):
    """A row that cannot be normalised; the message is the reason."""


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


def _present(row: dict, key: str) -> bool:
    return key in row and row[key] is not None


def _content(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedRow(f"{where}: content must be a string, got {type(value).__name__}")
    if not value.strip():
        raise MalformedRow(f"{where}: empty content")
    return value


def _check_order(messages: list[dict]) -> list[dict]:
    if not messages:
        raise MalformedRow("no messages")
    for i, m in enumerate(messages):
        if m["role"] == "system" and i != 0:
            raise MalformedRow(f"message {i}: a system message is only allowed first")
    if not any(m["role"] == "user" for m in messages):
        raise MalformedRow("no user message")
    return messages


def _from_messages(msgs: Any) -> list[dict]:
    if not isinstance(msgs, list):
        raise MalformedRow(f"'messages' must be a list, got {type(msgs).__name__}")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise MalformedRow(f"message {i}: must be an object, got {type(m).__name__}")
        role = m.get("role")
        if role is None:
            raise MalformedRow(f"message {i}: missing role")
        if role not in ROLES:
            raise MalformedRow(f"message {i}: unsupported role {role!r} (use one of {ROLES})")
        if m.get("content") is None:
            raise MalformedRow(f"message {i}: missing content")
        out.append({"role": role, "content": _content(m["content"], f"message {i}")})
    return _check_order(out)


def _from_sharegpt(conv: Any) -> list[dict]:
    if not isinstance(conv, list):
        raise MalformedRow(f"'conversations' must be a list, got {type(conv).__name__}")
    out = []
    for i, m in enumerate(conv):
        if not isinstance(m, dict):
            raise MalformedRow(f"conversation turn {i}: must be an object, got {type(m).__name__}")
        who = m.get("from")
        if who is None:
            raise MalformedRow(f"conversation turn {i}: missing role ('from')")
        if not isinstance(who, str) or who.lower() not in SHAREGPT_ROLES:
            raise MalformedRow(f"conversation turn {i}: unknown speaker {who!r}")
        if m.get("value") is None:
            raise MalformedRow(f"conversation turn {i}: missing 'value'")
        out.append(
            {
                "role": SHAREGPT_ROLES[who.lower()],
                "content": _content(m["value"], f"conversation turn {i}"),
            }
        )
    return _check_order(out)


def _from_turns(turns: Any) -> list[dict]:
    if isinstance(turns, str) or not isinstance(turns, list):
        raise MalformedRow(f"'turns' must be a list of strings, got {type(turns).__name__}")
    return _check_order(
        [{"role": "user", "content": _content(t, f"turn {i}")} for i, t in enumerate(turns)]
    )


def _from_alpaca(row: dict) -> list[dict]:
    instruction = _content(row["instruction"], "instruction")
    extra = row.get("input")
    if extra is not None and not isinstance(extra, str):
        raise MalformedRow(f"input: must be a string, got {type(extra).__name__}")
    user = instruction if not extra or not extra.strip() else f"{instruction}\n\n{extra}"
    msgs = [{"role": "user", "content": user}]
    if _present(row, "system"):
        msgs.insert(0, {"role": "system", "content": _content(row["system"], "system")})
    out = row.get("output")
    if out is not None:
        if not isinstance(out, str):
            raise MalformedRow(f"output: must be a string, got {type(out).__name__}")
        if out.strip():
            msgs.append({"role": "assistant", "content": out})
    return msgs


def normalize_row(row: Any) -> list[dict]:
    """Return the row as OpenAI-style `messages`, or raise `MalformedRow(reason)`."""
    if not isinstance(row, dict):
        raise MalformedRow(f"row must be an object, got {type(row).__name__}")
    if _present(row, "messages"):
        return _from_messages(row["messages"])
    if _present(row, "conversations"):
        return _from_sharegpt(row["conversations"])
    if _present(row, "turns"):
        return _from_turns(row["turns"])
    if _present(row, "instruction"):
        return _from_alpaca(row)
    keys = sorted(k for k in row if row[k] is not None)
    raise MalformedRow(
        f"unknown row shape (keys {keys}); expected 'messages', 'conversations', 'turns' or "
        "'instruction'"
    )


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
        if sel.where and not isinstance(row, _BadLine):
            for k in keys_seen:
                keys_seen[k] = keys_seen[k] or (isinstance(row, dict) and k in row)
            if not sel.matches(row):
                continue
        taken += 1
        if isinstance(row, _BadLine):
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
            "use a field its rows have (e.g. `source` in ../shared/data/prompts/train_mix.jsonl)"
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


def _read_jsonl_lines(path: Path):
    """Stdlib fallback for JSON lines that `datasets` refuses (mixed types, bad lines): a line
    that is not UTF-8 or not JSON becomes a `_BadLine` with the reason, the rest are read."""
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield _BadLine(
                    f"not valid UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}; "
                    "re-save the file as UTF-8"
                )
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                yield _BadLine(f"invalid JSON: {e.msg} at column {e.colno}")


class _BadLine:
    def __init__(self, reason: str):
        self.reason = reason


def load_raw_dataset(source: str, split: str = "train", name: str | None = None):
    """Load `source` with `datasets`: a file, a `save_to_disk` dir, a data dir or a hub name."""
    import datasets

    path = Path(source).expanduser()
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise BadInputError(
                f"{path}: unsupported file type {path.suffix!r}; use one of "
                + ", ".join(sorted(_FILE_BUILDERS))
            )
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(path))
            return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        return datasets.load_dataset(str(path), split=split)
    if source.startswith((".", "/", "~")) or path.suffix.lower() in _FILE_BUILDERS:
        raise MissingPathError(
            f"prompt source {source!r} does not exist; pass an existing file or dataset dir, "
            "`embedded`, or a hub dataset name"
        )
    try:
        return datasets.load_dataset(source, name, split=split)
    except ConnectionError as e:  # offline (HF_DATASETS_OFFLINE=1) or no network, not cached
        raise MissingPathError(
            f"prompt source {source!r} is no local file or dir, and the hub cannot be reached "
            f"({e}): pass a local file, `embedded`, or download it first with hub access"
        ) from None


def load_prompts(
    source: str,
    split: str = "train",
    limit: int | None = None,
    name: str | None = None,
    selection: RowSelection | None = None,
) -> PromptSet:
    """Load and normalise a prompt source.

    `source` is `embedded` (the stdlib-built default set, `split` train|test), a named preset
    (`dspark.data.prompts.presets`: sharegpt, ultrachat, magpie, opencodeinstruct, math, gsm8k; or
    `NAME=PATH` for a local copy of one), a local
    .json/.jsonl/.parquet/.arrow/.csv file, a `save_to_disk` directory, a data directory,
    or a hub dataset name (needs network, or the HF datasets cache when offline).
    `limit` keeps the first `limit` source rows (rejected ones included in the count);
    `selection` (`RowSelection`: skip, where, limit) overrides it.
    """
    sel = selection if selection is not None else RowSelection(limit=limit)
    # Without a filter only the first skip + limit rows are read (a prefix of a big set).
    prefix = None if sel.where or sel.limit is None else sel.skip + sel.limit
    if source == "embedded":
        from dspark.data.prompts.embedded import embedded_prompts

        return normalize_rows(embedded_prompts(split), source=f"embedded:{split}", selection=sel)
    from dspark.data.prompts.presets import load_preset_dataset, parse_preset

    preset = parse_preset(source)  # a named public set: `ultrachat`, or `ultrachat=/local/copy`
    if preset is not None:
        ds = load_preset_dataset(*preset, split=split)
        if prefix is not None:
            ds = ds.select(range(min(prefix, len(ds))))
        return normalize_rows(
            ds, source=f"preset:{preset[0].name} ({preset[1] or preset[0].hub_id})", selection=sel
        )
    path = Path(source).expanduser()
    # A local file is named by its absolute path, so a resumed run started from another
    # directory (or with `../x` vs `/abs/x`) is recognised as the same source.
    label = str(path.resolve()) if path.exists() else str(source)
    try:
        ds = load_raw_dataset(source, split=split, name=name)
        if prefix is not None:
            ds = ds.select(range(min(prefix, len(ds))))
        # Rows are decoded while they are read, so a bad one (e.g. a byte that is not UTF-8)
        # fails here, not in load_raw_dataset.
        return normalize_rows(ds, source=label, selection=sel)
    except UserError:
        raise
    except Exception as e:  # arrow cannot unify the rows' types, or a line is not JSON/UTF-8
        if path.is_file() and path.suffix.lower() in (".json", ".jsonl"):
            rows = _read_jsonl_lines(path) if path.suffix.lower() == ".jsonl" else _read_json(path)
            out = normalize_rows(rows, str(path), selection=sel)
            out.notes.append(
                f"`datasets` could not load {path} ({type(e).__name__}: {str(e)[:200]}); "
                "read it row by row with the json module instead"
            )
            return out
        if path.is_file():
            cause: BaseException = e  # `datasets` wraps the reader's error in a generic one
            while cause.__cause__ is not None:
                cause = cause.__cause__
            raise BadInputError(
                f"prompt source {path}: the file cannot be read as {path.suffix} "
                f"({type(cause).__name__}: {str(cause)[:200]}); check that it is a valid, UTF-8 "
                f"{path.suffix} file, or convert it to .jsonl (one JSON row a line)"
            ) from e
        raise


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


def _read_json(path: Path):
    """The rows of a .json file: one document, so a byte that is not UTF-8 or a syntax error
    anywhere makes the whole file unreadable (one error naming the file and the place)."""
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadInputError(
            f"prompt source {path} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            "re-save it as UTF-8"
        ) from None
    except json.JSONDecodeError as e:
        raise BadInputError(
            f"prompt source {path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
            "a .json file holds one array of rows (or use .jsonl: one JSON row a line)"
        ) from None
    if not isinstance(data, (list, dict)):
        data = [data]  # a lone value: one row, rejected with its type
    if isinstance(data, dict):  # {"data": [...]} or a single row
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 and len(data) == 1 else [data]
    yield from data
