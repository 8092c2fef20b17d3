"""Read an offline feature cache (see `dspark.data.features.feature_cache`) as training rows.

`FeatureCache(dir)` opens a finished cache, `validate` refuses one made for another target,
layer set or tokenized set, and `row(i)` gives row i's `tapped [n, L*H]` and
`final_hidden [n, H]` (zeros where a `positions=loss` cache stored nothing; a q8_0 cache's
dequantized to bf16).
`CachedFeatureDataset` pairs a tokenized dataset (with its original row numbers in a column)
with the cache, so a shuffled, split or subset loader still gets each row's own features;
`PadCollator` pads the feature tensors like `input_ids`.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from dspark.data.features import q8_0
from dspark.data.features.feature_cache import (
    DTYPES,
    FeatureCacheError,
    dataset_hash,
    read_manifest,
    same_target,
    stored_positions,
)

ROW_COLUMN = "cache_row"  # the row's number in the tokenized set the cache was made from


class FeatureCache:
    """Random access to the rows of a finished feature cache."""

    def __init__(self, cache_dir: str | os.PathLike) -> None:
        self.dir = Path(cache_dir).expanduser()
        self.manifest = read_manifest(self.dir)
        if not self.manifest.get("complete"):
            raise FeatureCacheError(
                f"the feature cache in {self.dir} is unfinished "
                f"({len(self.manifest['shards'])}/{self.manifest['num_shards']} shards); rerun "
                "the same `data_scripts/cache_features.py` command to finish it"
            )
        self.settings = self.manifest["settings"]
        self.shards = self.manifest["shards"]
        self._starts = [s["rows"][0] for s in self.shards]
        self._open: dict[int, tuple] = {}

    def __len__(self) -> int:
        return int(self.settings["data_rows"])

    @property
    def layer_ids(self) -> list[int]:
        return list(self.settings["layer_ids"])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype rows are read back in (bf16 for a q8_0 cache)."""
        return DTYPES[self.settings["dtype"]]

    def validate(
        self,
        *,
        target_identity: dict | None = None,
        layer_ids: Sequence[int] | None = None,
        data_dir: str | os.PathLike | None = None,
        what: str = "data.features",
    ) -> None:
        """Raise `FeatureCacheError` naming the mismatch and the fix."""
        s = self.settings
        fix = (
            f"make a cache for this run with `python data_scripts/cache_features.py` "
            f"(or drop {what} to capture features online)"
        )
        if target_identity is not None and not same_target(s["target_identity"], target_identity):
            raise FeatureCacheError(
                f"{what}={self.dir} was made for target {s['target']!r} "
                f"({s['target_identity']['model_type']}, {s['target_identity']['num_hidden_layers']}"
                f" layers), not this run's target (its config or weights differ); {fix}"
            )
        if layer_ids is not None and [int(i) for i in layer_ids] != self.layer_ids:
            raise FeatureCacheError(
                f"{what}={self.dir} holds target layers {self.layer_ids}, but the draft taps "
                f"{list(layer_ids)} (draft.target_layer_ids); {fix}"
            )
        if data_dir is not None:
            got = dataset_hash(data_dir)
            if got != s["data_hash"]:
                raise FeatureCacheError(
                    f"{what}={self.dir} was made from another tokenized set than {data_dir} "
                    f"(data hash {s['data_hash'][:12]}... vs {got[:12]}...); {fix}"
                )

    def _shard(self, k: int):
        """(safe_open handle, lengths, tapped_offsets, final_offsets, final_positions)."""
        if k not in self._open:
            f = safe_open(str(self.dir / self.shards[k]["file"]), framework="pt")
            self._open[k] = (
                f,
                f.get_tensor("lengths"),
                f.get_tensor("tapped_offsets"),
                f.get_tensor("final_offsets"),
                f.get_tensor("final_positions").long(),
            )
        return self._open[k]

    def row(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row i of the tokenized set: `(tapped [n, L*H], final_hidden [n, H])`, stored dtype."""
        loc = self._locate(i)
        f, j, n, t_off = loc[:4]
        t0, t1 = int(t_off[j]), int(t_off[j + 1])
        tapped_part = self._read(f, "tapped", t0, t1)
        if t1 - t0 == n:  # positions=all: nothing to fill
            return tapped_part, self._final(loc)
        tapped = tapped_part.new_zeros((n, tapped_part.shape[-1]))
        tapped[: t1 - t0] = tapped_part
        return tapped, self._final(loc)

    def _read(self, f, name: str, a: int, b: int) -> torch.Tensor:
        """Rows `[a, b)` of shard tensor `name` in `self.dtype` (a q8_0 cache's dequantized)."""
        part = f.get_slice(name)[a:b]
        if self.settings["dtype"] != "q8_0":
            return part
        return q8_0.dequantize(part, f.get_slice(f"{name}_scales")[a:b], self.dtype)

    def final_row(self, i: int) -> torch.Tensor:
        """Row i's `final_hidden [n, H]` alone (zeros where nothing was stored)."""
        return self._final(self._locate(i))

    def _final(self, loc) -> torch.Tensor:
        f, j, n, _, f_off, f_pos = loc
        q0, q1 = int(f_off[j]), int(f_off[j + 1])
        final_part = self._read(f, "final_hidden", q0, q1)
        if q1 - q0 == n:
            return final_part
        final = final_part.new_zeros((n, final_part.shape[-1]))
        final[f_pos[q0:q1]] = final_part
        return final

    def shard_of(self, i: int) -> int:
        """The index in `shards` of the shard holding row `i`."""
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} outside the cache's {len(self)} rows")
        return bisect.bisect_right(self._starts, i) - 1

    def _locate(self, i: int):
        """`(handle, row in shard, tokens, tapped_offsets, final_offsets, final_positions)`."""
        k = self.shard_of(i)
        f, lengths, t_off, f_off, f_pos = self._shard(k)
        j = i - self.shards[k]["rows"][0]
        return f, j, int(lengths[j]), t_off, f_off, f_pos

    def __getstate__(self):  # DataLoader workers reopen the shards themselves
        state = dict(self.__dict__)
        state["_open"] = {}
        return state


class CachedFeatureDataset(Dataset):
    """Rows of a tokenized (sub)set with their cached features.

    `ds` needs `input_ids`, `loss_mask` and `ROW_COLUMN` (the row number in the set the cache
    was made from; `load_datasets` adds it before any split or subset).
    """

    def __init__(self, ds, cache: FeatureCache, summaries: Mapping | None = None) -> None:
        """`summaries` (optional, `summarize_rows`): cache row -> `(logsumexp [n], argmax
        [n])` of the target's logits, added to each row as `final_logsumexp` /
        `final_argmax`."""
        if ROW_COLUMN not in ds.column_names:
            raise ValueError(f"the dataset needs a {ROW_COLUMN!r} column (its rows' numbers)")
        self.ds = ds
        self.cache = cache
        self.summaries = summaries

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        r = self.ds[int(i)]
        tapped, final = self.cache.row(int(r[ROW_COLUMN]))
        if tapped.shape[0] != len(r["input_ids"]):
            raise FeatureCacheError(
                f"row {r[ROW_COLUMN]}: {len(r['input_ids'])} tokens but {tapped.shape[0]} "
                f"cached positions in {self.cache.dir}; the cache belongs to another set"
            )
        row = {
            "input_ids": r["input_ids"],
            "loss_mask": r["loss_mask"],
            "tapped": tapped,
            "final_hidden": final,
        }
        if self.summaries is not None:
            row["final_logsumexp"], row["final_argmax"] = self.summaries[int(r[ROW_COLUMN])]
        return row


def summarize_rows(
    ds,
    cache: FeatureCache,
    summarize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    *,
    batch_positions: int = 2048,
    progress: bool = True,
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per cache row of `ds` (a tokenized (sub)set with `ROW_COLUMN`): `(logsumexp [n] fp32,
    argmax [n] long)` of `summarize(final_hidden [N, H])` at the positions the objective can
    read (the valid anchors, `stored_positions(..., "loss")`), zero elsewhere. One pass of
    the target's head over the set, `batch_positions` vectors at a time, instead of one per
    training step."""
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    pending: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []  # row, n, positions, [p, H]

    def flush() -> None:
        if not pending:
            return
        lse, top = summarize(torch.cat([v for *_, v in pending]))
        at = 0
        for row, n, pos, v in pending:
            lse_row, top_row = torch.zeros(n), torch.zeros(n, dtype=torch.long)
            lse_row[pos] = lse[at : at + len(v)].float().cpu()
            top_row[pos] = top[at : at + len(v)].long().cpu()
            out[row] = (lse_row, top_row)
            at += len(v)
        pending.clear()

    cols = ds.select_columns([ROW_COLUMN, "loss_mask"])
    masks = {int(r): m for r, m in zip(cols[ROW_COLUMN], cols["loss_mask"], strict=True)}
    rows = sorted(masks)
    queued = 0
    for row in tqdm(rows, desc="target summaries", unit="row", disable=not progress):
        mask = masks[row]
        pos = stored_positions(mask, "loss")[1]
        pending.append((row, len(mask), pos, cache.final_row(row)[pos]))
        queued += len(pos)
        if queued >= batch_positions:
            flush()
            queued = 0
    flush()
    return out
