"""Training throughput of a recipe: tokens/s, peak memory, step time / target forward time.

    python eval/train_speed.py recipe=quickstart [--steps 6] [any distill override ...]

Prints the figures and writes them to runs/<recipe>/train_speed.{json,md}.
"""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.errors import HydraException  # noqa: E402

from dspark.errors import user_errors  # noqa: E402
from dspark.training.schema import check, register_configs  # noqa: E402
from dspark.training.speed import measure_step_cost  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("overrides", nargs="*", help="distill overrides, e.g. recipe=quickstart")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="output dir (default runs/<recipe>)")
    args = ap.parse_args()
    # Hydra's composition errors (a misspelt key) already name the key: no traceback either.
    with user_errors("train_speed", also=(HydraException,)):
        register_configs(CHECKOUT / "recipes")
        with initialize_config_dir(str(CHECKOUT / "conf"), version_base=None):
            cfg = compose("config", overrides=[*args.overrides, "trainer.output_dir=unused"])
        check(cfg)
        res = measure_step_cost(cfg, steps=args.steps, device=args.device)
    recipe = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("recipe=")), "custom")
    out = Path(args.out or f"runs/{recipe}")
    out.mkdir(parents=True, exist_ok=True)
    c = res["conditions"]
    md = (
        f"# Training step cost: recipe `{recipe}`\n\n"
        f"Conditions: target `{c['target']}` ({c['target_dtype']}, mixed precision "
        f"{c['mixed_precision']}), {c['device']} with {c['threads']} threads, batch {c['batch']} "
        f"sequences ({c['mean_tokens_per_batch']:.0f} tokens), block size {c['block_size']}, "
        f"{c['num_anchors']} anchors/sequence, {c['draft_layers']} draft layers, Markov rank "
        f"{c['markov_rank']}, median of {c['steps_timed']} steps.\n\n"
        "| figure | value |\n|---|---|\n"
        f"| target forward alone | {res['target_forward_s']:.3f} s |\n"
        f"| training step (target + draft fwd/bwd + AdamW) | {res['train_step_s']:.3f} s |\n"
        f"| step / target forward | {res['step_over_target_forward']:.2f} |\n"
        f"| training tokens/s | {res['train_tokens_per_s']:.0f} |\n"
        f"| peak memory | {res['peak_memory_mb']:.0f} MB |\n"
    )
    (out / "train_speed.json").write_text(json.dumps(res, indent=2))
    (out / "train_speed.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
