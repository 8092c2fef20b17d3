"""Training throughput on cached target features vs online capture, measured in one process.

Its command line is `eval/cache_speed.py`, a thin entry script of the same name.

Both runs are the real training loop (`loop.run`) on the same run config, data and seed for
the same number of epochs; only `data.features` differs. Each run logs once, at its last step,
so its `tokens_per_s` covers the whole run (every batch's data loading, target forward when
online, draft forward/backward, optimizer). The cache is written first, in the same process,
and timed, so the end-to-end cost (cache + cached epochs vs online epochs) is reported too.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dspark.data.features import feature_cache as fc
from dspark.target import load_target
from dspark.training import loop


def measure_cache_speedup(
    cfg,
    out_dir: str | Path,
    *,
    epochs: float = 3.0,
    dtype: str = "bf16",
    positions: str = "all",
    cache_batch_size: int = 8,
) -> dict:
    """Cache `cfg.data.train` for `cfg.target`, then train `epochs` online and on the cache."""
    out = Path(out_dir)
    if cfg.data.eval:
        raise ValueError("run the comparison without data.eval (held-out rows come from train)")
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    base = OmegaConf.merge(
        cfg,
        {
            "trainer": {
                "epochs": float(epochs),
                "max_steps": None,
                "log_every": 10**9,  # one log record, at the last step: whole-run tokens/s
                "eval_every": 0,
                "save_every": 0,
                "resume": False,
            },
            "tracking": {"backend": "none"},
        },
    )
    cache_dir = out / "features"
    shutil.rmtree(cache_dir, ignore_errors=True)
    target, tok = load_target(cfg.target.name, dtype=cfg.target.dtype)
    ids = fc.resolve_layer_ids(
        target.config.num_hidden_layers,
        cfg.draft.target_layer_ids,
        cfg.draft.num_target_layers_tapped,
    )
    t0 = time.perf_counter()
    manifest = fc.write_cache(
        target,
        cfg.data.train,
        cache_dir,
        layer_ids=ids,
        target_name=cfg.target.name,
        pad_token_id=tok.pad_token_id,
        dtype=dtype,
        positions=positions,
        batch_size=cache_batch_size,
    )
    cache_s = time.perf_counter() - t0
    del target

    runs = {}
    for mode, extra in (("online", {}), ("cached", {"data": {"features": str(cache_dir)}})):
        run_cfg = OmegaConf.merge(base, {"trainer": {"output_dir": str(out / mode)}}, extra)
        shutil.rmtree(out / mode, ignore_errors=True)
        t0, c0 = time.perf_counter(), time.process_time()
        res = loop.run(run_cfg)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        last = res["last_train"]
        runs[mode] = {
            "tokens_per_s": last["tokens_per_s"],
            "steps": res["steps"],
            "run_wall_s": wall,
            # CPU seconds of the whole run (build, train, final eval, save): unlike wall time,
            # barely moved by other jobs on a shared machine; overheads dilute the ratio.
            "run_cpu_s": cpu,
            "final_train_loss": last.get("train/loss"),
            "final_eval_loss": res["final_eval"].get("eval/loss"),
            "peak_memory_mb": last.get("peak_memory_mb"),
        }
    tokens = manifest["settings"]["data_tokens"]
    cache_bytes = sum(s["bytes"] for s in manifest["shards"])
    online_train_s = epochs * tokens / runs["online"]["tokens_per_s"]
    cached_train_s = epochs * tokens / runs["cached"]["tokens_per_s"]
    return {
        "online": runs["online"],
        "cached": runs["cached"],
        "speedup_tokens_per_s": runs["cached"]["tokens_per_s"] / runs["online"]["tokens_per_s"],
        "speedup_cpu_s": runs["online"]["run_cpu_s"] / runs["cached"]["run_cpu_s"],
        "cache_write_s": cache_s,
        "cache_bytes": cache_bytes,
        "cache_bytes_per_token": cache_bytes / tokens,
        "end_to_end_speedup": online_train_s / (cache_s + cached_train_s),
        "conditions": {
            "target": cfg.target.name,
            "target_dtype": cfg.target.dtype,
            "cache_dtype": dtype,
            "cache_positions": positions,
            "layer_ids": ids,
            "data": str(cfg.data.train),
            "data_rows": manifest["settings"]["data_rows"],
            "data_tokens": tokens,
            "epochs": epochs,
            "batch": cfg.data.batch_size,
            "block_size": cfg.draft.block_size,
            "num_anchors": cfg.draft.num_anchors,
            "draft_layers": cfg.draft.num_hidden_layers,
            "markov_rank": cfg.draft.markov_rank,
            "mixed_precision": cfg.trainer.mixed_precision,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    }
