"""Load a named public prompt set (`public_sets.PUBLIC_SETS`): a local folder first, then the hub.

Search order, first hit wins:
1. a local folder: the one passed (`bench_dir=` of the benchmark, `--bench-dir`), else
   `$DSPARK_BENCH_DIR` (bench sets) / `$DSPARK_PROMPTS_DIR` (training sets)
   (`dspark.paths.bench_dir_or_none`); it holds the set as `<name>.jsonl` (a training set also as the rows of `train_mix.jsonl`
   whose `source` is its name). Tests and offline runs use this.
2. the Hugging Face hub through `datasets` (its cache makes a second load offline-safe),
   each row converted to `{"turns": [...]}` by the set's converter.
Neither reachable (offline, the set not cached, no local copy): a `MissingPathError` in one
line naming the set and both fixes.

A local set reads in file order, a hub set in the dataset's order: the bench copies are the
hub rows in hub order; the local `train_mix.jsonl` is shuffled, so its `gsm8k-train` rows
come in another order than the hub's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from dspark.data.prompts.public_sets import PUBLIC_SETS, TRAIN_MIX, PublicSet, to_prompt_row
from dspark.errors import BadInputError, MissingPathError
from dspark.paths import BENCH_ENV, bench_dir_or_none, data_dir_or_none

PROMPTS_ENV = "DSPARK_PROMPTS_DIR"


@dataclass
class NamedSet:
    """A loaded public set: its prompt rows `{"turns": [...]}` (plus `source` in a mix) and
    where they came from (a local file, or `hub:ID`)."""

    name: str
    rows: list[dict]
    origin: str


def env_of(spec: PublicSet) -> str:
    return BENCH_ENV if spec.kind == "bench" else PROMPTS_ENV


def local_dir(spec: PublicSet, given: str | os.PathLike | None = None) -> Path | None:
    """The local folder for `spec`'s kind by the search order above (None: no folder)."""
    if spec.kind == "bench":
        return bench_dir_or_none(given, "bench_dir")
    return data_dir_or_none(
        given,
        "prompts_dir",
        PROMPTS_ENV,
        "the training prompt sets (train_mix.jsonl, gsm8k-train.jsonl, ...)",
    )


def read_prompt_file(
    path: str | os.PathLike, source: str | None = None, limit: int | None = None
) -> list[dict]:
    """The `{"turns": [...]}` rows of a JSONL file (only those whose `source` is `source`,
    when given; the first `limit`); a bad line is a `BadInputError` naming the file and line.
    The one reader of the project's prompt files (bench sets, training prompts)."""
    path = Path(path)
    out: list[dict] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInputError(
                    f'{path}:{lineno}: not a JSON line ({e.msg}); each line holds one {{"turns": '
                    "[...]} object"
                ) from None
            turns = row.get("turns") if isinstance(row, dict) else None
            if (
                not turns
                or not isinstance(turns, list)
                or not all(isinstance(t, str) for t in turns)
            ):
                raise BadInputError(
                    f"{path}:{lineno}: expected an object with a non-empty list of strings under "
                    f'"turns", got {line[:120]!r}'
                )
            if source is None or row.get("source") == source:
                out.append(row)
    return out


def find_local(spec: PublicSet, folder: Path | None) -> tuple[Path, str | None] | None:
    """`(file, source filter)` of `spec`'s local copy in `folder`, or None."""
    if folder is None:
        return None
    if (folder / spec.file).is_file():
        return folder / spec.file, None
    mix = folder / f"{TRAIN_MIX}.jsonl"
    if spec.kind == "train" and mix.is_file():
        return mix, spec.name
    return None


def hub_rows(spec: PublicSet) -> list[dict]:
    """`spec`'s hub split converted to prompt rows; a `MissingPathError` (one line: the set,
    setting the local folder, going online) when `datasets` cannot load it."""
    import datasets  # light module: defers datasets

    try:
        ds = datasets.load_dataset(spec.hub_id, spec.config, split=spec.split)
    except Exception as e:  # offline and not cached, no network, hub refused
        cause = " ".join(f"{type(e).__name__}: {e}".split())[:160]
        raise MissingPathError(
            f"prompt set {spec.name!r}: no local copy and the hub dataset {spec.hub} cannot be "
            f"loaded ({cause}); set ${env_of(spec)} to a folder holding {spec.file}, or go "
            "online once (unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE; `datasets` caches it)"
        ) from None
    return [to_prompt_row(spec, row) for row in ds]


def load_named_set(
    name: str, folder: str | os.PathLike | None = None, limit: int | None = None
) -> NamedSet:
    """The public set `name` (`PUBLIC_SETS`), local folder first, then the hub; the first
    `limit` rows when given."""
    if name == TRAIN_MIX:
        return _train_mix(folder, limit)
    spec = PUBLIC_SETS.get(name)
    if spec is None:
        raise BadInputError(f"no public prompt set {name!r}; known: {sorted(PUBLIC_SETS)}")
    local = find_local(spec, local_dir(spec, folder))
    if local is not None:
        path, source = local
        rows = read_prompt_file(path, source)
        origin = str(path) + (f" where source={source}" if source else "")
    else:
        rows, origin = hub_rows(spec), f"hub:{spec.hub_id}"
    return NamedSet(name, rows[:limit] if limit is not None else rows, origin)


def _train_mix(folder, limit) -> NamedSet:
    spec = PUBLIC_SETS["gsm8k-train"]  # any training set: the same folder
    base = local_dir(spec, folder)
    path = base / f"{TRAIN_MIX}.jsonl" if base is not None else None
    if path is None or not path.is_file():
        raise MissingPathError(
            f"prompt set {TRAIN_MIX!r} is a local file only (its T0 part is not on the hub in "
            f"this form): set ${PROMPTS_ENV} to the folder holding {TRAIN_MIX}.jsonl, or use its "
            "hub parts by name: gsm8k-train, self-instruct-seed"
        )
    rows = read_prompt_file(path)
    return NamedSet(TRAIN_MIX, rows[:limit] if limit is not None else rows, str(path))


def bench_turns(
    name: str, bench_dir: str | os.PathLike | None = None, limit: int | None = None
) -> list[list[str]]:
    """A bench set's conversations as turn lists (what the benchmark renders): `bench_dir`'s
    `<name>.jsonl` (or `$DSPARK_BENCH_DIR`'s) first, then the hub."""
    spec = PUBLIC_SETS.get(name)
    if spec is None or spec.kind != "bench":
        bench = sorted(n for n, s in PUBLIC_SETS.items() if s.kind == "bench")
        raise BadInputError(f"no bench set {name!r} on the hub; bench sets: {bench}")
    return [list(r["turns"]) for r in load_named_set(name, bench_dir, limit).rows]
