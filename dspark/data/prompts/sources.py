"""The loader behind every `--input`: one name or path to a `PromptSet`.

`load_prompts(source)` takes `embedded` (the stdlib-built default set), a named preset of
`presets.PRESETS` (or `NAME=PATH`, a local copy of one), a named public set of
`presets.PUBLIC_SETS` (the training prompt sets, local folder first, then the hub), a local
file or dataset dir, or a hub dataset name, and normalises its rows (`rows`, `prompt_set`).
"""

from __future__ import annotations

from pathlib import Path

from dspark.data.prompts.embedded import embedded_prompts
from dspark.data.prompts.named_sets import load_named_set
from dspark.data.prompts.presets import Preset, parse_preset
from dspark.data.prompts.prompt_set import PromptSet, RowSelection, normalize_rows
from dspark.data.prompts.public_sets import TRAIN_MIX, TRAIN_SETS
from dspark.data.prompts.readers import load_raw_dataset, read_json, read_jsonl_lines
from dspark.errors import BadInputError, UserError


class PresetUnavailable(RuntimeError):
    """A preset that cannot be loaded here; the message names the preset and the fix."""


def load_preset_dataset(preset: Preset, local: str | None, split: str):
    """The raw `datasets.Dataset` of a preset's split, its columns renamed to an accepted shape."""
    if split not in preset.splits:
        raise ValueError(
            f"prompt preset {preset.name!r} has no {split!r} split (it has "
            f"{sorted(preset.splits)}); hold out part of train with data.eval_fraction instead"
        )
    where = local or preset.hub_id
    try:
        if local:
            if not Path(local).expanduser().exists():
                raise FileNotFoundError(f"{local} does not exist")
            ds = load_raw_dataset(local, split=preset.splits[split])
        else:
            ds = load_raw_dataset(preset.hub_id, split=preset.splits[split], name=preset.config)
    except Exception as e:  # offline, unreachable hub, missing file: always the same advice
        raise PresetUnavailable(
            f"prompt preset {preset.name!r} ({where}, split {preset.splits[split]!r}) could not "
            f"be loaded: {type(e).__name__}: {str(e)[:300]}\n"
            f"Fix: with hub access, load it once (it stays in the datasets cache; unset "
            f"HF_DATASETS_OFFLINE / HF_HUB_OFFLINE for that run), or download it "
            f"(`hf download --repo-type dataset {preset.hub_id} --local-dir DIR`) and name the "
            f"local copy: `{preset.name}=DIR` (a file or save_to_disk dir with the same "
            f"columns works too)."
        ) from e
    drop = [old for old, new in preset.rename.items() if new == "output" and old in ds.column_names]
    ds = ds.remove_columns(drop)  # the target regenerates the answers
    keep = {old: new for old, new in preset.rename.items() if new != "output"}
    return ds.rename_columns({k: v for k, v in keep.items() if k in ds.column_names})


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
    `NAME=PATH` for a local copy of one), a public training set by name (`gsm8k-train`,
    `self-instruct-seed`: a local copy in `$DSPARK_PROMPTS_DIR` first, then the hub;
    `train_mix`: local only; `dspark.data.prompts.named_sets`), a local
    .json/.jsonl/.parquet/.arrow/.csv file, a `save_to_disk` directory, a data directory,
    or a hub dataset name (needs network, or the HF datasets cache when offline).
    `limit` keeps the first `limit` source rows (rejected ones included in the count);
    `selection` (`RowSelection`: skip, where, limit) overrides it.
    """
    sel = selection if selection is not None else RowSelection(limit=limit)
    # Without a filter only the first skip + limit rows are read (a prefix of a big set).
    prefix = None if sel.where or sel.limit is None else sel.skip + sel.limit
    if source == "embedded":
        return normalize_rows(embedded_prompts(split), source=f"embedded:{split}", selection=sel)
    if source in TRAIN_SETS + (TRAIN_MIX,) and not Path(source).exists():
        return _load_named(source, split, sel)
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
            rows = read_jsonl_lines(path) if path.suffix.lower() == ".jsonl" else read_json(path)
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


def _load_named(name: str, split: str, sel: RowSelection) -> PromptSet:
    """A public training set by name (`named_sets.load_named_set`: local copy, else the hub)."""
    if split != "train":
        raise BadInputError(
            f"prompt set {name!r} has only a train split (got {split!r}); hold out part of it "
            "with data.eval_fraction, or evaluate on a bench set"
        )
    named = load_named_set(name)
    return normalize_rows(named.rows, source=f"public:{name} ({named.origin})", selection=sel)
