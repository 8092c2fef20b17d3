"""Readers of prompt files and datasets: `datasets` first, the json module as the fallback.

`load_raw_dataset` loads a local file (.json/.jsonl/.parquet/.arrow/.csv), a `save_to_disk`
dir, a data dir or a hub dataset name with `datasets`. When `datasets` refuses a JSON file
(mixed types, a bad line), `read_jsonl_lines` / `read_json` read it with the stdlib: a line
that is not UTF-8 or not JSON becomes a `BadLine` (a rejected row), the rest are read.
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark.data.prompts.rows import BadLine
from dspark.errors import BadInputError, MissingPathError

FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".csv": "csv",
}


def read_jsonl_lines(path: Path):
    """Stdlib fallback for JSON lines that `datasets` refuses (mixed types, bad lines): a line
    that is not UTF-8 or not JSON becomes a `BadLine` with the reason, the rest are read."""
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield BadLine(
                    f"not valid UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}; "
                    "re-save the file as UTF-8"
                )
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                yield BadLine(f"invalid JSON: {e.msg} at column {e.colno}")


def load_raw_dataset(source: str, split: str = "train", name: str | None = None):
    """Load `source` with `datasets`: a file, a `save_to_disk` dir, a data dir or a hub name."""
    import datasets  # light module: defers datasets

    path = Path(source).expanduser()
    if path.is_file():
        builder = FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise BadInputError(
                f"{path}: unsupported file type {path.suffix!r}; use one of "
                + ", ".join(sorted(FILE_BUILDERS))
            )
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(path))
            return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        return datasets.load_dataset(str(path), split=split)
    if source.startswith((".", "/", "~")) or path.suffix.lower() in FILE_BUILDERS:
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


def read_json(path: Path):
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
