"""What a feature cache stores per row and how big it is (see `dspark.data.features.feature_cache`).

`stored_positions` is the `positions` rule (all | loss), `Layout` the bytes per token,
`estimate` the size of a cache for a tokenized set, `check_disk` the refusal to start when
the disk lacks room; `target_dims` / `estimate_from_config` work from a target's config alone
(no weights, no hub), e.g. Qwen3-8B's `{"hidden_size": 4096, "num_hidden_layers": 36}`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.data.features.q8_0 import BLOCK as Q8_BLOCK
from dspark.errors import BadInputError, MissingPathError
from dspark.locking import refuse_if_being_written
from dspark.target import resolve_target

# How a cache stores its features -> the dtype its rows are read back in. q8_0: int8 in
# llama.cpp's blocks of 32 with an fp16 scale (`q8_0.py`), read back as bf16.
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "q8_0": torch.bfloat16}
BYTES_PER_VALUE = {"bf16": 2.0, "fp32": 4.0, "q8_0": (Q8_BLOCK + 2) / Q8_BLOCK}
POSITIONS = ("all", "loss")
INDEX_BYTES_PER_FINAL = 4  # final_positions, int32
INDEX_BYTES_PER_ROW = 3 * 8  # lengths + two offsets, int64
DEFAULT_SHARD_MB = 512
DISK_HEADROOM = 1.05  # safetensors headers, the temp file of the shard being written


class FeatureCacheError(BadInputError):
    """A cache that does not fit the run (other target, layers, data) or a bad option (a
    `UserError`: the message names the fix, the entry scripts print it as one line)."""


# ---------------------------------------------------------------------------- what is stored
def stored_positions(loss_mask: Sequence[int], positions: str) -> tuple[int, torch.Tensor]:
    """`(tapped_prefix, final_positions)` of one row: tapped is stored for `[0, tapped_prefix)`,
    final_hidden at `final_positions` (int64). See the module docstring for the `loss` rule."""
    n = len(loss_mask)
    if positions == "all":
        return n, torch.arange(n)
    if positions != "loss":
        raise FeatureCacheError(f"positions={positions!r} is not one of {POSITIONS}")
    lm = torch.as_tensor(list(loss_mask), dtype=torch.bool)
    valid = torch.zeros(n, dtype=torch.bool)
    valid[:-1] = lm[:-1] & lm[1:]
    final = valid.nonzero().flatten()
    prefix = int(final[-1]) if final.numel() else 0
    return prefix, final


@dataclass(frozen=True)
class Layout:
    """Per-token sizes of a cache: `hidden` H, `num_layers` L tapped, element size."""

    hidden: int
    num_layers: int
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise FeatureCacheError(f"dtype={self.dtype!r} is not one of {sorted(DTYPES)}")
        if self.dtype == "q8_0" and self.hidden % Q8_BLOCK:
            raise FeatureCacheError(
                f"dtype=q8_0 stores blocks of {Q8_BLOCK} values, and this target's hidden size "
                f"{self.hidden} is not a multiple of {Q8_BLOCK}; store it as bf16 (--dtype bf16)"
            )

    def _bytes(self, values: int) -> int:
        return int(values * BYTES_PER_VALUE[self.dtype])  # q8_0: whole blocks, so exact

    @property
    def tapped_bytes(self) -> int:
        return self._bytes(self.num_layers * self.hidden)

    @property
    def final_bytes(self) -> int:
        return self._bytes(self.hidden) + INDEX_BYTES_PER_FINAL

    @property
    def bytes_per_token_all(self) -> int:
        """Bytes per token with `positions=all` (tapped + final + its position index)."""
        return self.tapped_bytes + self.final_bytes

    def row_bytes(self, tapped_tokens: int, final_tokens: int) -> int:
        return (
            tapped_tokens * self.tapped_bytes
            + final_tokens * self.final_bytes
            + INDEX_BYTES_PER_ROW
        )


def row_token_counts(loss_masks, positions: str) -> list[tuple[int, int, int]]:
    """`(length, tapped_tokens, final_tokens)` per row."""
    out = []
    for lm in loss_masks:
        prefix, final = stored_positions(lm, positions)
        out.append((len(lm), prefix, int(final.numel())))
    return out


def plan_shards(row_bytes: Sequence[int], shard_bytes: int) -> list[tuple[int, int]]:
    """Consecutive row ranges `[start, end)`, each closed once it reaches `shard_bytes`."""
    plan, start, acc = [], 0, 0
    for i, b in enumerate(row_bytes):
        acc += b
        if acc >= shard_bytes:
            plan.append((start, i + 1))
            start, acc = i + 1, 0
    if start < len(row_bytes):
        plan.append((start, len(row_bytes)))
    return plan


def estimate(layout: Layout, counts: Sequence[tuple[int, int, int]] | None, positions: str) -> dict:
    """Size of a cache: bytes per token, and with `counts` (see `row_token_counts`) the total."""
    est = {
        "hidden_size": layout.hidden,
        "num_layers_tapped": layout.num_layers,
        "dtype": layout.dtype,
        "positions": positions,
        "bytes_per_token_all_positions": layout.bytes_per_token_all,
    }
    if counts is not None:
        tokens = sum(c[0] for c in counts)
        total = sum(layout.row_bytes(c[1], c[2]) for c in counts)
        est.update(
            rows=len(counts),
            tokens=tokens,
            tapped_tokens=sum(c[1] for c in counts),
            final_tokens=sum(c[2] for c in counts),
            total_bytes=total,
            bytes_per_token=total / max(tokens, 1),
        )
    return est


def format_estimate(est: dict) -> str:
    lines = [
        f"feature cache estimate: H={est['hidden_size']}, {est['num_layers_tapped']} tapped "
        f"layers, {est['dtype']}, positions={est['positions']}",
        f"  all positions: {est['bytes_per_token_all_positions']:,} bytes/token",
    ]
    if "total_bytes" in est:
        lines.append(
            f"  this set: {est['rows']:,} rows, {est['tokens']:,} tokens "
            f"(tapped kept for {est['tapped_tokens']:,}, final hidden for "
            f"{est['final_tokens']:,}) -> {est['bytes_per_token']:,.0f} bytes/token, "
            f"total {est['total_bytes'] / 2**30:.3f} GiB"
        )
    return "\n".join(lines)


def check_disk(out_dir: Path, needed: int) -> None:
    """Refuse to start when the file system of `out_dir` lacks `needed` bytes (+ headroom)."""
    probe = out_dir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed * DISK_HEADROOM > free:
        raise FeatureCacheError(
            f"not enough disk for the feature cache in {out_dir}: it needs "
            f"{needed / 2**30:.2f} GiB (+{(DISK_HEADROOM - 1) * 100:.0f}% headroom), "
            f"{free / 2**30:.2f} GiB are free. Free space, write elsewhere (--output), or store "
            f"less (--positions loss, --dtype q8_0)."
        )


# ---------------------------------------------------------------------------- the input
TOKENIZED_FIX = (
    "pass the directory tokenize_data.py (or regenerate.py --tokenize) wrote, e.g. "
    "runs/data/embedded/train/tokenized"
)


def load_tokenized(data_dir: str | os.PathLike, key: str = "--data"):
    """The tokenized set (`save_to_disk`, with input_ids and loss_mask) at `data_dir`, else a
    `UserError` saying what the path is instead and which directory to pass."""
    from datasets import (  # start-up: keeps cache_features --help fast
        Dataset,
        load_from_disk,
    )

    p = Path(data_dir).expanduser()
    if not p.exists():
        raise MissingPathError(f"{key} {data_dir}: no such directory; {TOKENIZED_FIX}")
    if not p.is_dir():
        raise FeatureCacheError(f"{key} {data_dir} is a file, not a tokenized set; {TOKENIZED_FIX}")
    if not (p / "state.json").exists():
        if (p / "tokenized" / "state.json").exists():
            hint = f" (did you mean {key} {p / 'tokenized'}?)"
        elif (p / "manifest.json").exists() and (p / "shard_00000.safetensors").exists():
            hint = " (it is a feature cache, the output of this script)"
        elif (p / "regenerated.jsonl").exists():
            hint = " (it is a regeneration; tokenize it first with tokenize_data.py)"
        else:
            hint = ""
        raise FeatureCacheError(
            f"{key} {data_dir} is not a tokenized set: it has no state.json{hint}; {TOKENIZED_FIX}"
        )
    refuse_if_being_written(p, key)
    ds = load_from_disk(str(p))
    if not isinstance(ds, Dataset):
        raise FeatureCacheError(f"{key} {data_dir} holds several splits; pass one split's dir")
    missing = {"input_ids", "loss_mask"} - set(ds.column_names)
    if missing:
        raise FeatureCacheError(
            f"{key} {data_dir} lacks columns {sorted(missing)}, so it is not a tokenized set; "
            f"{TOKENIZED_FIX}"
        )
    return ds


# ---------------------------------------------------------------------------- from a config
def target_dims(spec: str) -> dict:
    """`hidden_size` and `num_hidden_layers` of a target without loading its weights.

    `spec` is inline JSON (`{"hidden_size": 4096, "num_hidden_layers": 36}`), a config.json
    file, or a target spec `load_target` accepts (its config is read, nothing else; a GGUF
    file is a target, prepared once)."""
    text = spec.strip()
    is_gguf = text.lower().endswith(".gguf")
    if text.startswith("{") or (Path(text).expanduser().is_file() and not is_gguf):
        inline = text.startswith("{")
        try:
            cfg = json.loads(text if inline else Path(text).expanduser().read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            where = repr(text) if inline else text
            raise FeatureCacheError(
                f"target config {where} is not valid JSON ({e}); pass e.g. "
                '\'{"hidden_size": 4096, "num_hidden_layers": 36}\' or a config.json'
            ) from None
        if not isinstance(cfg, dict):
            raise FeatureCacheError(f"target config {spec!r} is not a JSON object")
    else:
        from transformers import AutoConfig  # start-up: keeps cache_features --help fast

        cfg = AutoConfig.from_pretrained(resolve_target(text)).to_dict()
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
    missing = [k for k in ("hidden_size", "num_hidden_layers") if k not in cfg]
    if missing:
        raise FeatureCacheError(f"target config {spec!r} lacks {missing}")
    return {
        "hidden_size": int(cfg["hidden_size"]),
        "num_hidden_layers": int(cfg["num_hidden_layers"]),
    }


def resolve_layer_ids(num_hidden_layers: int, layer_ids=None, num_layers_tapped: int = 5) -> list:
    """The draft's default taps (`default_target_layer_ids`) unless `layer_ids` are given."""
    from dspark.config import default_target_layer_ids  # start-up: keeps cache_features --help fast

    n = int(num_hidden_layers)
    if layer_ids:
        ids = [int(i) for i in layer_ids]
        bad = [i for i in ids if not 0 <= i < n - 1]
        if bad:
            raise FeatureCacheError(
                f"--layer-ids {bad} cannot be tapped in a {n}-layer target (valid: 0..{n - 2}, "
                "the final layer never); pass ids in range, or none for the draft's default"
            )
        return ids
    if num_layers_tapped < 1:
        raise FeatureCacheError(f"--num-layers-tapped {num_layers_tapped}: must be >= 1")
    return default_target_layer_ids(n, num_layers_tapped)


def estimate_from_config(
    dims: dict,
    layer_ids: Sequence[int],
    *,
    data_dir: str | os.PathLike | None = None,
    dtype: str = "bf16",
    positions: str = "all",
) -> dict:
    """`estimate` from target dims alone (+ the tokenized set's loss masks when given)."""
    counts = None
    if data_dir is not None:
        counts = row_token_counts(load_tokenized(data_dir)["loss_mask"], positions)
    est = estimate(Layout(dims["hidden_size"], len(layer_ids), dtype), counts, positions)
    est["layer_ids"] = list(layer_ids)
    return est
