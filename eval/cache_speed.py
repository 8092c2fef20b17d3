"""Training tokens/s on cached target features vs online capture (same run config, one process).

    python eval/cache_speed.py recipe=quickstart [--epochs 3] [--dtype bf16] [--positions all]
        [any distill override, e.g. data.train=DIR]

Writes the feature cache, then runs the training loop for `--epochs` online and on the cache;
prints the figures and writes them to runs/<recipe>/cache_speed.{json,md} (or --out).
"""

import argparse
import json
from pathlib import Path

from hydra import compose, initialize_config_dir

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.bench.cache_speed import measure_cache_speedup
from dspark.training.schema import check, register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("overrides", nargs="*", help="distill overrides, e.g. recipe=quickstart")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--positions", default="all", choices=("all", "loss"))
    ap.add_argument("--out", default=None, help="output dir (default runs/<recipe>/cache_speed)")
    args = ap.parse_args()
    register_configs()
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose("config", overrides=[*args.overrides, "trainer.output_dir=unused"])
    check(cfg)
    recipe = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("recipe=")), "custom")
    out = Path(args.out or f"runs/{recipe}/cache_speed")
    res = measure_cache_speedup(
        cfg, out, epochs=args.epochs, dtype=args.dtype, positions=args.positions
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "cache_speed.json").write_text(json.dumps(res, indent=2))
    c, on, ca = res["conditions"], res["online"], res["cached"]
    md = (
        f"# Training on cached features vs online capture: recipe `{recipe}`\n\n"
        f"Conditions: target `{c['target']}` ({c['target_dtype']}), cache {c['cache_dtype']} "
        f"positions={c['cache_positions']} layers {c['layer_ids']}; data `{c['data']}` "
        f"({c['data_rows']} rows, {c['data_tokens']} tokens), {c['epochs']:g} epochs, batch "
        f"{c['batch']}, block size {c['block_size']}, {c['num_anchors']} anchors/sequence, "
        f"{c['draft_layers']} draft layers, Markov rank {c['markov_rank']}, mixed precision "
        f"{c['mixed_precision']}, {c['device']} with {c['threads']} threads, torch {c['torch']}. "
        "Both runs are the training loop in the same process, one after the other.\n\n"
        "| figure | online capture | cached features |\n|---|---|---|\n"
        f"| training tokens/s (whole run) | {on['tokens_per_s']:.0f} | {ca['tokens_per_s']:.0f} |\n"
        f"| optimizer steps | {on['steps']} | {ca['steps']} |\n"
        f"| whole run: wall s / CPU s | {on['run_wall_s']:.0f} / {on['run_cpu_s']:.0f} | "
        f"{ca['run_wall_s']:.0f} / {ca['run_cpu_s']:.0f} |\n"
        f"| final train loss | {on['final_train_loss']:.4f} | {ca['final_train_loss']:.4f} |\n"
        f"| held-out loss | {on['final_eval_loss']:.4f} | {ca['final_eval_loss']:.4f} |\n"
        f"| peak memory (MB) | {on['peak_memory_mb']:.0f} | {ca['peak_memory_mb']:.0f} |\n\n"
        f"Speedup (tokens/s): **{res['speedup_tokens_per_s']:.2f}x**; by whole-run CPU "
        f"seconds (robust to other jobs on the machine): {res['speedup_cpu_s']:.2f}x. "
        "Writing the cache took "
        f"{res['cache_write_s']:.1f} s ({res['cache_bytes'] / 2**20:.1f} MiB, "
        f"{res['cache_bytes_per_token']:,.0f} bytes/token); with it, cache + {c['epochs']:g} "
        f"cached epochs vs {c['epochs']:g} online epochs: {res['end_to_end_speedup']:.2f}x.\n"
    )
    (out / "cache_speed.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
