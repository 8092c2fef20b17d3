"""Ablation table over the drafts of a training sweep (equal data, steps and seed).

    python train/distill.py -m recipe=ablation draft=dspark,dspark_gated,dspark_rnn,dflash \
        draft.enable_confidence_head=... draft.init=...        # see README: the ablation
    python eval/ablation.py runs/sweeps/<stamp> [--sets gsm8k humaneval mt-bench]
        [--num-prompts 8] [--max-new-tokens 128] [--temperatures 0 1] [--threads 2]

Writes ablation.json and ablation.md into the sweep dir (or --out): per draft, its final
held-out metrics and decoder tau per set and temperature, with the conditions.
"""

import argparse
import json
from pathlib import Path

import torch

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.bench.ablation import decoder_tau, render_table, training_summary
from dspark.errors import user_errors
from dspark.eval.prompts import load_dataset, render
from dspark.modeling import DSparkDraftModel
from dspark.target import load_target


def label_of(run: Path) -> str:
    over = run / ".hydra" / "overrides.yaml"
    if over.exists():
        items = [
            x.strip("- \n'\"") for x in over.read_text().splitlines() if x.strip().startswith("-")
        ]
        # what the arm changed: not the recipe, the tracker or Hydra's own keys
        skip = ("recipe=", "tracking=", "hydra.")
        return " ".join(i for i in items if not i.startswith(skip)) or run.name
    return run.name


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", help="a sweep dir (its numbered jobs) or run dirs")
    ap.add_argument("--sets", nargs="+", default=["gsm8k", "humaneval", "mt-bench"])
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runs = []
    for r in map(Path, args.runs):
        jobs = (
            sorted((p for p in r.iterdir() if (p / "results.json").exists()), key=lambda p: p.name)
            if not (r / "results.json").exists()
            else [r]
        )
        runs += jobs
    if not runs:
        raise SystemExit(f"no finished training runs (results.json) under {args.runs}")
    first = DSparkDraftModel.from_pretrained(runs[0] / "draft")
    target, tok = load_target(first.config.target_name_or_path)
    prompts = {
        s: [render(tok, turns, []) for turns in load_dataset(s, args.bench_dir, args.num_prompts)]
        for s in args.sets
    }
    rows = []
    for run in runs:
        draft = DSparkDraftModel.from_pretrained(run / "draft").eval()
        row = {
            "label": label_of(run),
            "run": str(run),
            "train": training_summary(run),
            "decoder": {},
        }
        for t in args.temperatures:
            for s in args.sets:
                row["decoder"][f"{s}@{t:g}"] = decoder_tau(
                    target,
                    tok,
                    draft,
                    prompts[s],
                    temperature=t,
                    max_new_tokens=args.max_new_tokens,
                )
                print(
                    f"{row['label']:<50} {s}@T={t:g}: tau {row['decoder'][f'{s}@{t:g}']['tau']:.2f}",
                    flush=True,
                )
        rows.append(row)
    conditions = {
        "target": first.config.target_name_or_path,
        "target_dtype": str(next(target.parameters()).dtype),
        "sets": args.sets,
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "turns": "first",
        "batch": 1,
        "block_size": first.config.block_size,
        "threads": args.threads,
        "device": "cpu",
        "decoder_tau": "mean tokens per round, bonus counted",
    }
    out = Path(args.out or (args.runs[0] if len(args.runs) == 1 else "runs/ablation"))
    out.mkdir(parents=True, exist_ok=True)
    table = render_table(rows, args.sets, args.temperatures)
    (out / "ablation.json").write_text(
        json.dumps({"conditions": conditions, "rows": rows}, indent=2) + "\n"
    )
    md = [
        "# Ablation at equal budget",
        "",
        "Conditions: " + ", ".join(f"{k}={v}" for k, v in conditions.items()),
        "",
        table,
        "",
    ]
    (out / "ablation.md").write_text("\n".join(md))
    print(table)
    print(f"-> {out}/ablation.{{json,md}}")


if __name__ == "__main__":
    with user_errors("ablation"):  # an expected mistake: one `error:` line, exit 2
        main()
