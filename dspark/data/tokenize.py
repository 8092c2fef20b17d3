"""Tokenize regenerated conversations with the target's chat template and loss masks.

Output (the contract with the training loop): a `datasets.Dataset` saved with `save_to_disk`
holding `input_ids`, `loss_mask` (and the source row `index`), plus `manifest.json` in the
same directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark.data.masks import (
    LossMaskError,
    assistant_mask,
    check_loss_masks,
    end_of_turn_ids,
    has_generation_markers,
    template_of,
    unmask_cut_turns,
)
from dspark.data.outputs import read_json_object, refuse_foreign, require_output_dir
from dspark.data.prompts.prompt_set import require_rows, write_rejected
from dspark.data.prompts.sources import load_prompts
from dspark.errors import BadInputError
from dspark.fileio import staged_dir, write_text_atomic
from dspark.locking import exclusive_output, refuse_if_being_written, writes_output

MANIFEST = "manifest.json"
PREFLIGHT_ROWS = 32


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_hash(tokenizer) -> str:
    """SHA-256 of the tokenizer's vocabulary and merges (fast) or its sorted vocab (slow)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return _sha(backend.to_str())
    return _sha(json.dumps(sorted(tokenizer.get_vocab().items())))


def chat_template_hash(tokenizer) -> str:
    return _sha(template_of(tokenizer))


def tokenize_rows(
    rows,
    tokenizer,
    *,
    max_length: int = 2048,
    method: str = "auto",
    chat_template_kwargs=None,
    preflight: bool = True,
):
    """Tokenize rows with `messages`; return `(datasets.Dataset, stats)`.

    Rows without an assistant turn are skipped, rows truncated to `max_length` that keep no
    assistant token are dropped; both are counted in `stats`. The preflight
    (`check_loss_masks`) runs on the first rows before the rest are tokenized, then on all.
    """
    import datasets  # light module: defers datasets

    eot = end_of_turn_ids(tokenizer, chat_template_kwargs)
    out: dict[str, list] = {"index": [], "input_ids": [], "loss_mask": []}
    kept_msgs = []
    stats: dict[str, Any] = {
        "rows_in": 0,
        "no_assistant": 0,
        "truncated": 0,
        "truncated_away": 0,
        "cut_answers": 0,
    }
    used = method
    for i, row in enumerate(rows):
        stats["rows_in"] += 1
        msgs = row["messages"]
        if not any(m["role"] == "assistant" for m in msgs):
            stats["no_assistant"] += 1
            continue
        ids, mask, used = assistant_mask(
            tokenizer, msgs, method=method, eot_ids=eot, chat_template_kwargs=chat_template_kwargs
        )
        finish = row.get("finish_reasons")
        if finish and "length" in finish:
            stats["cut_answers"] += finish.count("length")
            mask = unmask_cut_turns(ids, mask, finish, eot)
        if len(ids) > max_length:
            stats["truncated"] += 1
            ids, mask = ids[:max_length], mask[:max_length]
            if not any(mask):
                stats["truncated_away"] += 1
                continue
        out["index"].append(int(row.get("source_index", row.get("index", i))))
        out["input_ids"].append(ids)
        out["loss_mask"].append(mask)
        kept_msgs.append({"messages": msgs, "finish_reasons": finish})
        if preflight and len(kept_msgs) == PREFLIGHT_ROWS:
            _preflight(tokenizer, kept_msgs, out, eot, max_length)
    if not out["input_ids"]:
        raise LossMaskError(
            f"no trainable rows: {stats['no_assistant']} rows had no assistant turn and "
            f"{stats['truncated_away']} lost all assistant tokens to max_length={max_length}. "
            "Regenerate the assistant turns first (data_scripts/regenerate.py) or raise "
            "--max-length."
        )
    if preflight:
        _preflight(tokenizer, kept_msgs, out, eot, max_length)
    n_tok = sum(len(x) for x in out["input_ids"])
    n_mask = sum(sum(x) for x in out["loss_mask"])
    stats.update(
        rows=len(out["input_ids"]),
        tokens=n_tok,
        assistant_tokens=n_mask,
        assistant_share=n_mask / max(n_tok, 1),
        mask_method=used,
        end_of_turn_ids=eot,
        max_seq_len=max(len(x) for x in out["input_ids"]),
    )
    feats = datasets.Features(
        {
            "index": datasets.Value("int64"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "loss_mask": datasets.Sequence(datasets.Value("int8")),
        }
    )
    return datasets.Dataset.from_dict(out, features=feats), stats


def _preflight(tokenizer, kept, out, eot, max_length):
    rows = [
        {**meta, "input_ids": i, "loss_mask": k}
        for meta, i, k in zip(kept, out["input_ids"], out["loss_mask"])
    ]
    check_loss_masks(tokenizer, rows, eot_ids=eot, max_rows=PREFLIGHT_ROWS, max_length=max_length)


def save_tokenized(
    ds,
    out_dir: str | os.PathLike,
    stats: dict,
    *,
    target: str,
    tokenizer,
    max_length: int,
    source: str | None = None,
    extra: dict | None = None,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """`ds.save_to_disk(out_dir)` plus `manifest.json` beside the data files (and whatever
    `write_extra(dir)` adds), written whole into a temporary sibling and renamed into place,
    under `out_dir`'s writer lock: a reader sees the previous set or this one, never a mix."""
    out = check_tokenized_output(out_dir)
    with exclusive_output(out, "the tokenized set"), staged_dir(out) as tmp:
        _save(ds, tmp, stats, target, tokenizer, max_length, source, extra)
        if write_extra is not None:
            write_extra(tmp)
    return out


def _save(ds, out: Path, stats, target, tokenizer, max_length, source, extra) -> None:
    ds.save_to_disk(str(out))
    manifest = {
        "format": FORMAT,
        "target": target,
        "tokenizer": getattr(tokenizer, "name_or_path", None),
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "chat_template_hash": chat_template_hash(tokenizer),
        "generation_markers": has_generation_markers(tokenizer),
        "pad_token_id": tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
        "max_length": max_length,
        "source": source,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **stats,
        **(extra or {}),
    }
    write_text_atomic(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")


FORMAT = "dspark-tokenized-v1"
# What `save_tokenized` (with `datasets.save_to_disk`) and `tokenize_file` write.
WRITES = (MANIFEST, "state.json", "dataset_info.json", "data-*.arrow", "rejected.jsonl")


def check_tokenized_output(out_dir: str | os.PathLike, key: str = "--output") -> Path:
    """`out_dir` as a place a tokenized set may be written: a new or writable directory that
    is empty of the files it writes or holds an earlier tokenized set (which is replaced)."""
    out = require_output_dir(out_dir, key)
    manifest = out / MANIFEST
    ours = manifest.exists() and (read_json_object(manifest) or {}).get("format") == FORMAT
    if not ours:
        refuse_foreign(out, WRITES, marker=f"{FORMAT} {MANIFEST}", what="tokenize", key=key)
    return out


def check_finished_regeneration(source: Path, partial: bool) -> None:
    """A `regenerated.jsonl` whose regeneration another job writes, or (without `partial`)
    whose `summary.json` says it is unfinished, is refused; other sources pass."""
    summary = source.parent / "summary.json"
    if source.name != "regenerated.jsonl" or not (source.parent / "run.json").is_file():
        return
    refuse_if_being_written(source.parent, "the regeneration")
    try:
        done = json.loads(summary.read_text()).get("complete", True)  # older runs: finished
    except (OSError, ValueError):
        done = False
    if not done and not partial:
        raise BadInputError(
            f"{source} is an unfinished regeneration ({summary} says so: it was stopped, "
            "killed or is under way). Rerun its regenerate.py command to finish it, or pass "
            "--partial to tokenize the rows done so far"
        )


def load_manifest(data_dir: str | os.PathLike) -> dict:
    return json.loads((Path(data_dir) / MANIFEST).read_text())


@writes_output("output_dir", "the tokenized set")
def tokenize_file(
    input_path: str,
    output_dir: str,
    *,
    target: str,
    max_length: int = 2048,
    method: str = "auto",
    chat_template_kwargs=None,
    tokenizer=None,
    partial: bool = False,
    limit: int | None = None,
) -> dict:
    """Tokenize a regenerated JSONL (or any prompt source whose rows have assistant turns).

    `input_path` may join several sources with commas: their rows are tokenized into one set,
    in that order (one set is what a feature cache and `data.features` take). A regeneration
    that is unfinished (its `summary.json` says so: under way, killed, or stopped by
    `--stop-after`) or being written is refused, unless `partial` takes the rows done so far.
    `limit`: the first rows only (a point of a data-size curve cut from a larger build)."""
    sources = [p.strip() for p in str(input_path).split(",") if p.strip()]
    if not sources:
        raise BadInputError(f"--input {input_path!r} names no source")
    for src in sources:
        check_finished_regeneration(Path(src), partial)
    check_tokenized_output(output_dir)

    sets = [require_rows(load_prompts(src), src, "--input") for src in sources]
    if tokenizer is None:
        from dspark.target import load_tokenizer  # light module: defers torch

        tokenizer = load_tokenizer(target)
    rows = [row for ps in sets for row in ps.rows]
    if limit is not None:
        if len(rows) < limit:
            raise BadInputError(
                f"--limit {limit}: {input_path} holds {len(rows)} rows; answer more of it first "
                "(rerun its regenerate.py command, or --grow)"
            )
        rows = rows[:limit]
    ds, stats = tokenize_rows(
        rows,
        tokenizer,
        max_length=max_length,
        method=method,
        chat_template_kwargs=chat_template_kwargs,
    )
    stats["rejected_rows"] = sum(len(ps.rejected) for ps in sets)
    save_tokenized(
        ds,
        output_dir,
        stats,
        target=target,
        tokenizer=tokenizer,
        max_length=max_length,
        source=str(input_path),
        extra={"chat_template_kwargs": chat_template_kwargs or {}},
        write_extra=(lambda d: write_rejected(sets, d / "rejected.jsonl"))
        if stats["rejected_rows"]
        else None,
    )
    return stats
