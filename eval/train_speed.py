"""Training throughput of a recipe: tokens/s, peak memory, step time / target forward time.

    python eval/train_speed.py recipe=quickstart [--steps 6] [any distill override ...]
    # fp32 vs bf16 autocast (and packing) on the same batches, losses compared step by step:
    python eval/train_speed.py recipe=quickstart --fixed-answers 128 \
        --variants trainer.mixed_precision=no trainer.mixed_precision=auto \
        trainer.mixed_precision=no,data.packing=true

Each variant is a comma-separated list of extra overrides. `--fixed-answers N` times the recipe
on prompts (`--prompts`, embedded by default; `--prompts-limit N`) answered by an N-token filler instead of
regenerated answers (step time depends on lengths only). Writes runs/<recipe>/train_speed.{json,md}.
"""

import argparse
import json
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.bench.train_speed import measure_step_cost
from dspark.errors import user_errors
from dspark.training.schema import check, register_configs

CHECKOUT = Path(__file__).resolve().parents[1]


def fixed_answer_set(
    cfg, answer_tokens: int, out: Path, prompts: str = "embedded", limit: int | None = None
) -> str:
    """A tokenized set of `prompts` with filler answers (built once, then reused)."""
    path = out / f"fixed_answers_{answer_tokens}"
    if not path.exists():
        from dspark.data.prompts.fixed_answers import filler_answer, with_fixed_answers
        from dspark.data.prompts.sources import load_prompts
        from dspark.data.tokenize import tokenize_rows
        from dspark.target import load_tokenizer

        tok = load_tokenizer(cfg.target.name)
        rows = load_prompts(prompts, limit=limit).rows
        ds, _ = tokenize_rows(
            with_fixed_answers(rows, filler_answer(tok, answer_tokens)[0]),
            tok,
            max_length=cfg.data.max_length,
        )
        ds.save_to_disk(str(path))
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("overrides", nargs="*", help="distill overrides, e.g. recipe=quickstart")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="output dir (default runs/<recipe>)")
    ap.add_argument("--variants", nargs="*", default=[""], help="comma-separated overrides each")
    ap.add_argument("--fixed-answers", type=int, default=None, metavar="N")
    ap.add_argument("--prompts", default="embedded", help="prompts of --fixed-answers")
    ap.add_argument("--prompts-limit", type=int, default=None, metavar="N")
    args = ap.parse_args()
    recipe = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("recipe=")), "custom")
    out = Path(args.out or f"runs/{recipe}")
    out.mkdir(parents=True, exist_ok=True)
    register_configs(CHECKOUT / "recipes")

    def config(extra):
        # Hydra's composition errors (a misspelt key) already name the key: no traceback either.
        with user_errors("train_speed", also=(HydraException,)):
            with initialize_config_dir(str(CHECKOUT / "conf"), version_base=None):
                overrides = [*args.overrides, *extra, "trainer.output_dir=x"]
                cfg = compose("config", overrides=overrides)
            check(cfg)
        return cfg

    data = []
    if args.fixed_answers:
        path = fixed_answer_set(
            config([]), args.fixed_answers, out, args.prompts, args.prompts_limit
        )
        data = [f"data.train={path}", "data.eval=null", "data.eval_fraction=0.01"]
    runs = []
    for v in args.variants:
        with user_errors("train_speed", also=(HydraException,)):
            res = measure_step_cost(
                config([*data, *filter(None, v.split(","))]), args.steps, args.warmup, args.device
            )
        runs.append({"variant": v or "(recipe)", **res})
    ref = runs[0]
    for r in runs:  # loss agreement with the first variant, where the batches are the same
        same = r["conditions"]["packing"] == ref["conditions"]["packing"]
        diffs = [abs(a - b) / abs(b) for a, b in zip(r["losses"], ref["losses"])] if same else []
        r["max_rel_loss_diff_vs_first"] = max(diffs) if diffs else None
    c = ref["conditions"]
    filler = f"; filler answers of {args.fixed_answers} tokens" if data else ""
    md = [
        f"# Training step cost: recipe `{recipe}`\n",
        f"Conditions: target `{c['target']}` ({c['target_dtype']}), {c['device']} with "
        f"{c['threads']} threads, batch {c['batch']} rows, max_length {c['max_length']}, block "
        f"size {c['block_size']}, {c['num_anchors']} anchors/sequence, {c['draft_layers']} draft "
        f"layers, Markov rank {c['markov_rank']}, median of {c['steps_timed']} steps after {args.warmup} "
        f"warm-up steps{filler}.\n",
        "| variant | draft precision | packing | pad share | real tokens/batch | target fwd | step "
        "| step/fwd | tokens/s | step CPU s | tokens/CPU s | peak RSS MB (cumulative) "
        "| max rel. loss diff vs first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rc, d = r["conditions"], r["max_rel_loss_diff_vs_first"]
        md.append(
            f"| {r['variant']} | {rc['mixed_precision']} | {rc['packing']} | "
            f"{100 * r['pad_share']:.1f}% | {rc['mean_tokens_per_batch']:.0f} | "
            f"{r['target_forward_s']:.3f} s | {r['train_step_s']:.3f} s | "
            f"{r['step_over_target_forward']:.2f} | {r['train_tokens_per_s']:.0f} | "
            f"{r['train_step_cpu_s']:.2f} | {r['train_tokens_per_cpu_s']:.0f} | "
            f"{r['peak_memory_mb']:.0f} | {'n/a' if d is None else f'{d:.2e}'} |"
        )
    text = "\n".join(md) + "\n"
    (out / "train_speed.json").write_text(json.dumps(runs, indent=2))
    (out / "train_speed.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
