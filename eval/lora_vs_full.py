"""LoRA vs full fine-tuning of an existing draft, on the same data and step budget.

python eval/lora_vs_full.py --data TOKENIZED_DIR --out runs/lora_vs_full [--target embedded]

1. base: a fresh (warm-started) draft trained for --base-steps;
2. full: base fine-tuned for --steps, every draft weight trainable;
3. lora: base fine-tuned for --steps with draft.lora (r, alpha), adapters merged on save.
Reports the held-out probabilistic tau (the training loop's eval: 1 + expected accepted drafts
per block, from the target's own distribution; eval_fraction of --data), trainable parameters,
and wall seconds per optimizer step. Writes lora_vs_full.json and .md.
"""

import argparse
import json
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

CONF = Path(__file__).resolve().parents[1] / "conf"


def config(out: Path, args, *overrides):
    from dspark.training.schema import check, register_configs

    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose(
            "config",
            overrides=[
                "recipe=quickstart",
                "tracking=none",
                f"target.name={args.target}",
                f"trainer.output_dir={out}",
                f"data.train={args.data}",
                "data.eval=null",
                "data.eval_fraction=0.25",
                f"data.batch_size={args.batch}",
                f"data.max_length={args.max_length}",
                "trainer.eval_every=0",
                "trainer.save_every=0",
                "trainer.log_every=1",
                f"trainer.threads={args.threads}",
                *overrides,
            ],
        )
    check(cfg)
    return cfg


def train(name: str, out: Path, args, *overrides) -> dict:
    from dspark.training.loop import run

    cfg = config(out / name, args, *overrides)
    t0 = time.perf_counter()
    res = run(cfg)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    return {
        "draft": res["draft"],
        "steps": res["steps"],
        "wall_s": round(wall, 1),
        "tau_eval": res["final_eval"].get("eval/tau_probabilistic"),
        "eval_loss": res["final_eval"].get("eval/loss"),
        "train_loss_last": [r["train/loss"] for r in rows if "train/loss" in r][-1:],
    }


def trainable(draft_dir: str, lora_r: int) -> int:
    from dspark.export import load_draft
    from dspark.modeling.lora import apply_lora

    d = load_draft(draft_dir).train()
    if lora_r:
        return apply_lora(
            d,
            lora_r,
            2 * lora_r,
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
    return sum(p.numel() for p in d.parameters() if p.requires_grad)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="runs/lora_vs_full")
    p.add_argument("--target", default="embedded")
    p.add_argument("--base-steps", type=int, default=20)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    out = Path(a.out)
    res = {"base": train("base", out, a, f"trainer.max_steps={a.base_steps}")}
    base = res["base"]["draft"]
    res["full"] = train("full", out, a, f"draft.init_from={base}", f"trainer.max_steps={a.steps}")
    res["lora"] = train(
        "lora",
        out,
        a,
        f"draft.init_from={base}",
        f"draft.lora.r={a.lora_r}",
        f"draft.lora.alpha={2 * a.lora_r}",
        f"trainer.max_steps={a.steps}",
    )
    res["full"]["trainable_params"] = trainable(base, 0)
    res["lora"]["trainable_params"] = trainable(base, a.lora_r)
    for k in ("full", "lora"):
        res[k]["s_per_step"] = round(res[k]["wall_s"] / max(1, res[k]["steps"]), 2)
    cond = (
        f"target {a.target}, data {a.data} (25% held out), quickstart draft (2 layers, block 7, "
        f"rank 64), batch {a.batch}, max_length {a.max_length}, fp32, CPU, {a.threads} threads, "
        f"base {a.base_steps} steps then {a.steps} steps each; LoRA r={a.lora_r} alpha={2 * a.lora_r} "
        "on q/k/v/o/gate/up/down; wall times on a shared, contended machine (incl. eval and saves)"
    )
    summary = {"conditions": cond, **res}
    (out / "lora_vs_full.json").write_text(json.dumps(summary, indent=2))
    md = [
        f"# LoRA vs full fine-tuning\n\n{cond}\n",
        "| run | steps | held-out tau | eval loss | trainable params | s/step (wall) |",
        "|---|---|---|---|---|---|",
    ]
    for k in ("base", "full", "lora"):
        r = res[k]
        md.append(
            f"| {k} | {r['steps']} | {r['tau_eval']:.3f} | {r['eval_loss']:.4f} | {r.get('trainable_params', '')} | {r.get('s_per_step', round(r['wall_s'] / max(1, r['steps']), 2))} |"
        )
    (out / "lora_vs_full.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
