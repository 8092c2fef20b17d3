"""Offline target-feature cache: run the frozen target once over a tokenized set, train many times.

Layout of a cache directory (format `dspark-features-v1`):
- `manifest.json`: the settings it was made with (target name + identity, `layer_ids`, `dtype`,
  `positions`, the tokenized set's hash, rows and tokens, batch and shard sizes), the shard
  plan, and one entry per finished shard (`file`, `rows [start, end)`, token counts, `bytes`,
  `sha256`, and `rows_sha256`, the hash of its rows' tokens by which a cache of a grown set
  links it: `shard_reuse`); `complete` once every shard is written.
- `shard_NNNNN.safetensors`, one per planned group of consecutive rows, each holding the rows
  concatenated along tokens:
  `tapped [T_t, L*H]` and `final_hidden [T_f, H]` (in `dtype`: bf16 by default, fp32, or
  q8_0: int8 with fp16 scales `tapped_scales [T_t, L*H/32]` and `final_hidden_scales
  [T_f, H/32]` beside them, llama.cpp's Q8_0 blocks (`q8_0.py`), read back as bf16),
  `lengths [n]` (each row's token count), `tapped_offsets [n+1]`, `final_offsets [n+1]`
  (int64 prefix sums into the two tensors) and `final_positions [T_f]` (int32, the position
  in its row of each stored final-hidden vector).

What is stored (`positions`):
- `all`: every token's tapped features and post-norm final hidden state.
- `loss`: only what the DSpark objective reads. A slot's target distribution comes from the
  final hidden state at p+k, and a supervised slot needs the loss mask at p+k and p+k+1, so
  `final_hidden` is kept only at positions q with `loss_mask[q] and loss_mask[q+1]` (the valid
  anchor positions of `losses.valid_anchor_mask`). A block anchored at p attends to the
  context features at every position < p, and the last valid anchor is the last such q, so
  `tapped` is kept for the row prefix `[0, last_q)` (none when a row has no valid anchor). The
  reader fills the positions it did not store with zeros; the objective never reads them
  (tests/test_feature_cache.py checks that both options give the same losses).

Writing is resumable: shards are planned up front from the row lengths (a byte budget per
shard), a shard is computed whole (in batches of similar-length rows) and written atomically
(temp file + rename), and a finished shard is never rewritten. So a killed run, rerun with the same
settings, produces byte-identical shards to an uninterrupted one.

The per-row rule, sizes and the estimator live in `dspark.data.features.feature_layout` (re-exported
here), the reader and the training `Dataset` in `dspark.data.features.feature_dataset`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from dspark.data.collate import PadCollator
from dspark.data.features import q8_0
from dspark.data.features.feature_layout import (  # noqa: F401  (re-exported: one import for users)
    DTYPES,
    POSITIONS,
    FeatureCacheError,
    Layout,
    check_disk,
    estimate,
    estimate_from_config,
    format_estimate,
    load_tokenized,
    plan_shards,
    resolve_layer_ids,
    row_token_counts,
    stored_positions,
    target_dims,
)
from dspark.data.features.shard_reuse import link_shard, offered_shards, rows_sha256
from dspark.data.outputs import read_json_object, refuse_foreign, require_output_dir
from dspark.errors import BadInputError
from dspark.fileio import file_sha256
from dspark.locking import writes_output
from dspark.target.capture import OnlineTargetCapture

FORMAT = "dspark-features-v1"
MANIFEST = "manifest.json"
DEFAULT_SHARD_MB = 512


# ---------------------------------------------------------------------------- identities
def dataset_hash(data_dir: str | os.PathLike) -> str:
    """SHA-256 of a `save_to_disk` dataset's data files (names and bytes, in `state.json`
    order). Not every `*.arrow`: `datasets` writes `cache-*.arrow` files beside them when a
    run splits or selects rows."""
    root = Path(data_dir).expanduser()
    state = root / "state.json"
    if state.exists():
        files = [root / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    else:
        files = sorted(root.glob("data-*.arrow"))
    if not files:
        raise FeatureCacheError(f"{root} holds no .arrow files; is it a tokenized dataset dir?")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


PROBE_TENSORS = 8
PROBE_VALUES = 4


def target_identity(model) -> dict:
    """What makes two loaded targets the same: architecture dims plus a weight probe.

    The probe is `PROBE_VALUES` evenly spaced elements of `PROBE_TENSORS` evenly spaced
    parameters (as floats); `same_target` compares it with a bf16-sized tolerance, so the
    same checkpoint loaded in fp32, bf16 or fp16 matches and another checkpoint does not.
    """
    cfg = model.config
    params = [p for _, p in model.named_parameters()]
    n = len(params)
    pick = sorted({i * (n - 1) // (PROBE_TENSORS - 1) for i in range(PROBE_TENSORS)})
    probe: list[float] = []
    for i in pick:
        flat = params[i].detach().reshape(-1)
        m = flat.numel()  # integer spacing: a float linspace misses the last index of big ones
        idx = torch.tensor([k * (m - 1) // (PROBE_VALUES - 1) for k in range(PROBE_VALUES)])
        probe.extend(float(v) for v in flat[idx.to(flat.device)].float().cpu())
    return {
        "model_type": cfg.model_type,
        "hidden_size": int(cfg.hidden_size),
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "vocab_size": int(cfg.vocab_size),
        "probe": probe,
    }


def same_target(a: dict, b: dict) -> bool:
    keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")
    if any(a.get(k) != b.get(k) for k in keys) or len(a["probe"]) != len(b["probe"]):
        return False
    pa, pb = torch.tensor(a["probe"]), torch.tensor(b["probe"])
    return bool(torch.allclose(pa, pb, rtol=1e-2, atol=1e-3))


# ---------------------------------------------------------------------------- manifest
def read_manifest(cache_dir: str | os.PathLike) -> dict:
    path = Path(cache_dir).expanduser() / MANIFEST
    if not path.exists():
        raise FeatureCacheError(
            f"{path.parent} is not a feature cache (no {MANIFEST}); make one with "
            "`python data_scripts/cache_features.py --target ... --data ... --output ...`"
        )
    m = read_json_object(path)
    if m is None or m.get("format") != FORMAT:
        kind = "is not a JSON object" if m is None else f"has format {m.get('format')!r}"
        raise FeatureCacheError(
            f"{path.parent} is not a feature cache: its {MANIFEST} {kind}, not a {FORMAT} "
            "manifest; pass a feature cache directory (cache_features.py --output)"
        )
    return m


def check_cache_output(out_dir: str | os.PathLike, key: str = "--output") -> Path:
    """`out_dir` as a place a feature cache may be written: new, or writable and holding no
    files of the names a cache writes unless it is a feature cache (which is resumed)."""
    out = require_output_dir(out_dir, key)
    manifest = out / MANIFEST
    if manifest.exists():
        m = read_json_object(manifest)
        if m is None or m.get("format") != FORMAT:
            raise BadInputError(
                f"{key} {out}: {manifest} is not a feature cache's (format "
                f"{(m or {}).get('format')!r}, not {FORMAT!r}) and would be overwritten; pass "
                f"a new {key} directory, or move that file away"
            )
    else:  # the settings are written before any shard, so a shard here is not ours
        refuse_foreign(out, ("shard_*.safetensors",), marker=MANIFEST, what="cache_features")
    return out


def _write_json_atomic(path: Path, obj: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def shard_name(k: int) -> str:
    return f"shard_{k:05d}.safetensors"


# ---------------------------------------------------------------------------- writer
Stored = dict[str, torch.Tensor]  # a row's tapped or final features as the shard keeps them


def _stored(name: str, x: torch.Tensor, dtype: str) -> Stored:
    """`{name: x}` in the cache's `dtype`, on the CPU; q8_0 adds `{name}_scales`."""
    if dtype != "q8_0":
        return {name: x.to(DTYPES[dtype]).cpu()}
    q, d = q8_0.quantize(x)
    return {name: q.cpu(), f"{name}_scales": d.cpu()}


def _shard_tensors(feats: list[tuple[Stored, Stored, torch.Tensor, int]]) -> dict:
    """Concatenate per-row `(tapped {name: [t, ...]}, final {name: [f, ...]}, final_positions
    [f], length)` (the dicts as `_stored` gives them)."""
    zero = torch.zeros(1, dtype=torch.long)
    parts = {
        name: torch.cat([p[name] for p in rows]).contiguous()
        for rows in ([f[0] for f in feats], [f[1] for f in feats])
        for name in rows[0]
    }
    return {
        **parts,
        "final_positions": torch.cat([f[2] for f in feats]).to(torch.int32),
        "lengths": torch.tensor([f[3] for f in feats], dtype=torch.long),
        "tapped_offsets": torch.cat(
            [zero, torch.tensor([len(f[0]["tapped"]) for f in feats]).cumsum(0)]
        ),
        "final_offsets": torch.cat(
            [zero, torch.tensor([len(f[1]["final_hidden"]) for f in feats]).cumsum(0)]
        ),
    }


def _compute_shard(
    capture, rows, pad_id: int, batch_size: int, positions: str, dtype, device, on_batch=None
):
    """Features of `rows` (dicts with input_ids, loss_mask), in their order, computed in
    batches of `batch_size` rows of similar length (the shard's rows sorted by length, ties by
    position: a set of 37-512-token rows in dataset order pads batches of 8 to ~1.4x its tokens,
    sorted to ~1.02x); `on_batch(n_rows)` after each batch (progress)."""
    collate = PadCollator(pad_id)
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]["input_ids"]), i))
    out: list = [None] * len(rows)
    for b0 in range(0, len(order), batch_size):
        idx = order[b0 : b0 + batch_size]
        chunk = [rows[i] for i in idx]
        batch = {k: v.to(device) for k, v in collate(chunk).items()}
        feats = capture(batch)
        for j, (i, row) in enumerate(zip(idx, chunk)):
            prefix, final_pos = stored_positions(row["loss_mask"], positions)
            tapped = _stored("tapped", feats.tapped[j, :prefix], dtype)
            final = _stored("final_hidden", feats.final_hidden[j, final_pos.to(device)], dtype)
            out[i] = (tapped, final, final_pos, len(row["input_ids"]))
        if on_batch is not None:
            on_batch(len(chunk))
    return out


@writes_output("out_dir", "the feature cache")
def write_cache(
    target,
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    layer_ids: Sequence[int],
    target_name: str,
    pad_token_id: int,
    dtype: str = "bf16",
    positions: str = "all",
    batch_size: int = 8,
    shard_mb: float = DEFAULT_SHARD_MB,
    progress: bool = True,
    reuse_from: Sequence[str | os.PathLike] = (),
) -> dict:
    """Run `target` once over the tokenized set at `data_dir`, writing shards into `out_dir`.

    Returns the manifest. Resumable: rerun with the same arguments; other settings against an
    existing cache are refused. Refuses to start when the disk lacks room for what is left.
    `reuse_from`: caches of a set this one grew from, whose shards over the same rows are
    linked instead of computed (`shard_reuse`).
    """
    layout = Layout(int(target.config.hidden_size), len(layer_ids), dtype)  # checks the dtype
    if positions not in POSITIONS:
        raise FeatureCacheError(f"positions={positions!r} is not one of {POSITIONS}")
    capture = OnlineTargetCapture(target, layer_ids)  # checks the layer ids
    data_dir, out = Path(data_dir).expanduser(), check_cache_output(out_dir)
    ds = load_tokenized(data_dir)
    ds = ds.select_columns(["input_ids", "loss_mask"])
    counts = row_token_counts(ds["loss_mask"], positions)
    est = estimate(layout, counts, positions)
    row_bytes = [layout.row_bytes(c[1], c[2]) for c in counts]
    plan = plan_shards(row_bytes, int(shard_mb * 2**20))
    settings = {
        "target": target_name,
        "target_identity": target_identity(target),
        "target_dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
        "layer_ids": capture.layer_ids,
        "hidden_size": layout.hidden,
        "dtype": dtype,
        "positions": positions,
        "data_hash": dataset_hash(data_dir),
        "data_rows": len(ds),
        "data_tokens": est["tokens"],
        "batch_size": int(batch_size),
        "shard_bytes": int(shard_mb * 2**20),
    }
    manifest: dict[str, Any] = {"format": FORMAT, "settings": settings, "data": str(data_dir)}
    if (out / MANIFEST).exists():
        old = read_manifest(out)
        if old["settings"] != settings:
            diff = sorted(k for k in settings if old["settings"].get(k) != settings[k])
            raise FeatureCacheError(
                f"{out} holds a feature cache made with other settings ({', '.join(diff)} "
                "differ); rerun with the same arguments to resume, or use another --output"
            )
        done = {s["file"]: s for s in old["shards"]}
    else:
        done = {}
    rows_hash = [rows_sha256(ds, a, b) for a, b in plan]
    offered, notes = offered_shards(settings, [(Path(c), read_manifest(c)) for c in reuse_from])
    for note in notes:
        print(f"cache_features: {note}")
    linkable = {k for k, (a, b) in enumerate(plan) if (a, b, rows_hash[k]) in offered}
    todo = sum(
        sum(row_bytes[a:b])
        for k, (a, b) in enumerate(plan)
        if shard_name(k) not in done and k not in linkable
    )
    check_disk(out, todo)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".shard_*"):  # temp files of a killed run
        stale.unlink()
    manifest.update(estimate=est, plan=[list(p) for p in plan], num_shards=len(plan))

    def save_manifest(shards: dict, complete: bool) -> None:
        entries = [shards[shard_name(k)] for k in range(len(plan)) if shard_name(k) in shards]
        _write_json_atomic(out / MANIFEST, {**manifest, "shards": entries, "complete": complete})

    # Settings first: a shard file without a manifest entry is then always one of ours.
    save_manifest(done, complete=False)

    done_rows = sum(b - a for k, (a, b) in enumerate(plan) if shard_name(k) in done)
    bar = tqdm(
        total=len(ds), initial=done_rows, desc="cache features", unit="row", disable=not progress
    )
    device = next(target.parameters()).device
    reused = 0
    for k, (a, b) in enumerate(plan):
        name = shard_name(k)
        if name in done:
            continue
        path = out / name
        shown = bar.n
        sha256 = None  # a linked shard's, checked as it was linked
        if not path.exists() and k in linkable:
            src, entry = offered[(a, b, rows_hash[k])]
            if link_shard(src, path, entry["sha256"]):
                reused, sha256 = reused + 1, entry["sha256"]
        if not path.exists():  # a shard renamed into place before a kill is complete: keep it
            rows = [ds[i] for i in range(a, b)]
            feats = _compute_shard(
                capture,
                rows,
                pad_token_id,
                batch_size,
                positions,
                dtype,
                device,
                bar.update,
            )
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
            os.close(fd)
            # One metadata key: safetensors writes its metadata map in hash order, and two
            # keys could swap between runs (the shard must be byte-identical on a rerun).
            save_file(_shard_tensors(feats), tmp, metadata={"dspark": f"{FORMAT} rows {a}:{b}"})
            os.replace(tmp, path)
        tensors_meta = _shard_counts(path)
        done[name] = {
            "file": name,
            "rows": [a, b],
            **tensors_meta,
            "bytes": path.stat().st_size,
            "sha256": sha256 or file_sha256(path),
            "rows_sha256": rows_hash[k],
        }
        save_manifest(done, complete=False)
        bar.update(shown + (b - a) - bar.n)
    bar.close()
    if reuse_from:
        print(f"cache_features: {reused} of {len(plan)} shards linked from other caches")
    save_manifest(done, complete=True)
    return read_manifest(out)


def _shard_counts(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return {
            "tapped_tokens": int(f.get_slice("tapped").get_shape()[0]),
            "final_tokens": int(f.get_slice("final_hidden").get_shape()[0]),
        }
