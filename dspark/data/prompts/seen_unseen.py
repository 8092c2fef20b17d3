"""Two bench sets cut from one data build's answers: prompts a draft trained on and prompts of
the same mix it never saw.

A draft trained on the first N answered rows of a build (`make smollm2-point N=...`) has seen
the rows [0, N) and none after. `seen` holds the user turns of the build's first `n` rows,
`unseen` those of rows [N, N + n): the same mix, cut the same way, so the two differ only in
whether the draft trained on them. Its decoder tau on `seen` against `unseen` is the gap that
more rows of the same kind can close; a draft that does as well on both is limited by its
capacity, not its data. (The held-out set of training, the embedded test split, is another
kind of prompt, so its gap to the training rows also holds the shift between kinds.)

Written as `{"turns": [user turn, ...]}` JSONL, one file a set, which `eval/benchmark.py
datasets=[seen] bench_dir=...` reads like any bench set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dspark.data.prompts.readers import read_jsonl_lines
from dspark.data.prompts.rows import BadLine, MalformedRow, normalize_row
from dspark.errors import BadInputError, MissingPathError
from dspark.fileio import write_text_atomic

SETS = ("seen", "unseen")  # the two sets' names, which are also their files' stems


def _turns(row, where: str) -> list[str]:
    if isinstance(row, BadLine):
        raise BadInputError(f"{where}: {row.reason}; the answers file is damaged: repair it")
    try:
        messages = normalize_row(row)
    except MalformedRow as e:
        raise BadInputError(f"{where}: {e}; pass the answering step's regenerated.jsonl") from None
    return [m["content"] for m in messages if m["role"] == "user"]


def seen_unseen_turns(answers: str | os.PathLike, trained_rows: int, n: int) -> dict:
    """`{"seen": [turns] * n, "unseen": [turns] * n}` from the answers file (JSONL, one
    conversation a line, in the order a point's `--limit` cuts it): its first `n` rows, and
    the `n` rows after the first `trained_rows`."""
    path = Path(answers)
    if not path.is_file():
        raise MissingPathError(f"answers file {path} does not exist; pass a build's "
                               "answers/regenerated.jsonl")  # fmt: skip
    if n < 1 or trained_rows < n:
        raise BadInputError(f"need 1 <= --prompts ({n}) <= --trained-rows ({trained_rows})")
    sets: dict[str, list[list[str]]] = {name: [] for name in SETS}
    for i, row in enumerate(read_jsonl_lines(path)):
        if i >= trained_rows + n:
            break
        if i < n:
            sets["seen"].append(_turns(row, f"{path} line {i + 1}"))
        elif i >= trained_rows:
            sets["unseen"].append(_turns(row, f"{path} line {i + 1}"))
    if len(sets["unseen"]) < n:
        raise BadInputError(
            f"{path} holds {len(sets['unseen'])} rows after the first {trained_rows:,}, not "
            f"{n}: answer more rows (the build's command resumes) or pass a smaller --prompts"
        )
    return sets


def write_sets(sets: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Each set as `<out_dir>/<name>.jsonl`, atomically. A file already there is kept when it
    holds the same prompts and refused when it differs (benchmarks read it: never rewritten)."""
    out = Path(out_dir)
    paths = {}
    for name, turns in sets.items():
        text = "".join(json.dumps({"turns": t}, ensure_ascii=False) + "\n" for t in turns)
        path = out / f"{name}.jsonl"
        if path.exists() and path.read_text(encoding="utf-8") != text:
            raise BadInputError(
                f"{path} exists with other prompts (benchmarks may have read it); pass another "
                "--output or remove it with the benchmarks made from it"
            )
        if not path.exists():
            out.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
        paths[name] = path
    return paths
