"""What a speculative round costs against a plain AR step on this machine, and so the tau a
draft needs to pay off (break-even) and the verify length that pays best.

    python eval/cost_model.py [--target embedded] [--threads 2] [--dtype float32]
        [--layers 1 2 3 5] [--block-size 7] [--markov-rank 64] [--accept 0.7 0.6 ...]
        [--exact-rows auto|on|off] [--out runs/cost_model]
    python eval/cost_model.py --accept-from runs/quickstart/draft [--threads 2] ...

Without a draft it times random drafts of the shapes given (or `measure_costs`' defaults in
dspark/bench/cost_model.py). `--accept-from DRAFT` times that trained draft itself (its layers,
block size, rank and vocabulary) and takes its acceptance per position from its training run,
so the break-even tau and the best verify length are that draft's.

Writes cost_model.json, cost_model.md and cost_model.png (time per pass vs tokens verified).
"""

import argparse
import json
from pathlib import Path

import torch

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.bench.cost_model import (
    best_verify_length,
    break_even_tau,
    measure_costs,
    measure_draft_costs,
)
from dspark.errors import BadInputError, user_errors
from dspark.eval.auto_settings import draft_acceptance
from dspark.export import load_draft
from dspark.plotting import plt
from dspark.target import load_target


def run_acceptance(draft_dir: str, block_size: int) -> list[float]:
    """P(draft k accepted | drafts < k accepted), k = 1..block_size, from the draft's run."""
    got = draft_acceptance(draft_dir, 0.0, block_size)
    if got["accept"] is None:
        raise BadInputError(f"--accept-from: {got['source']}; pass --accept P1 P2 ... instead")
    return got["accept"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    # random drafts' shapes (None: measure_costs' defaults); a trained draft brings its own
    ap.add_argument("--layers", type=int, nargs="+", default=None)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--markov-rank", type=int, default=None)
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument(
        "--accept",
        type=float,
        nargs="*",
        default=None,
        help="P(accept k | k-1 accepted) per position",
    )
    ap.add_argument(
        "--accept-from",
        default=None,
        metavar="DRAFT_DIR",
        help="time this trained draft (its own shape) and take --accept from its held-out "
        "eval (greedy_accept@k of the results.json beside it)",
    )
    ap.add_argument(
        "--exact-rows",
        choices=("auto", "on", "off"),
        default="auto",
        help="verify passes row-exact (dspark/decoding/row_attention.py); auto: the decoder's "
        "default for this device and dtype",
    )
    ap.add_argument("--out", default="runs/cost_model")
    args = ap.parse_args()
    shape = (("draft_layers", args.layers), ("block_size", args.block_size),
             ("markov_rank", args.markov_rank))  # fmt: skip
    given = {k: v for k, v in shape if v is not None}
    draft = None
    if args.accept_from:
        if given:
            raise BadInputError(
                "--layers / --block-size / --markov-rank shape random drafts; with --accept-from "
                "the draft's own shape is timed: drop them (or drop --accept-from)"
            )
        run_acceptance(args.accept_from, 1)  # a draft without its run fails before it loads
        draft = load_draft(args.accept_from)
        args.accept = run_acceptance(args.accept_from, int(draft.config.block_size))
    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target, dtype=args.dtype)
    timing = {
        "context_len": args.context_len,
        "repeats": args.repeats,
        "exact_rows": {"auto": None, "on": True, "off": False}[args.exact_rows],
    }
    if draft is not None:
        draft.to(next(target.parameters()).dtype)
        c = measure_draft_costs(target, draft, **timing)
        c["conditions"]["draft"] = args.accept_from
    else:
        c = measure_costs(target, **given, **timing)
    c["conditions"]["target"] = args.target
    t_ar = c["t_ar"]
    lines = [
        "# Speculative round cost vs plain AR step",
        "",
        "Conditions: " + ", ".join(f"{k}={v}" for k, v in c["conditions"].items()),
        "",
        f"Plain AR step: {t_ar * 1e3:.1f} ms",
        "",
        "| tokens in the target pass (anchor + L drafts) | ms | x AR step |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {t * 1e3:.1f} | {t / t_ar:.2f} |" for n, t in c["t_verify"].items()]
    lines += [
        "",
        "| draft layers | draft round ms | break-even tau (verify all drafts) |",
        "|---|---|---|",
    ]
    g = c["conditions"]["block_size"]
    c["break_even_tau"] = {}
    for n_layers, t in c["t_draft"].items():
        be = break_even_tau(t_ar, t, c["t_verify"][g + 1])
        c["break_even_tau"][n_layers] = be
        lines.append(f"| {n_layers} | {t * 1e3:.1f} | {be:.2f} |")
    if args.accept:
        lines += ["", f"Acceptance profile {args.accept}: best verify length per draft size", ""]
        c["best"] = {}
        for n_layers in c["t_draft"]:
            best = best_verify_length(c, args.accept, n_layers)
            c["best"][n_layers] = best
            lines.append(
                f"- {n_layers} layers: L={best['L']}, tau={best['tau']:.2f}, "
                f"predicted speedup {best['speedup']:.2f}x"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_model.json").write_text(json.dumps(c, indent=2) + "\n")
    (out / "cost_model.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = list(c["t_verify"])
    ax.plot(ns, [c["t_verify"][n] / t_ar for n in ns], "o-", label="target pass (x AR step)")
    for n_layers, t in c["t_draft"].items():
        ax.plot(
            ns,
            [(t + c["t_verify"][n]) / t_ar for n in ns],
            "--",
            label=f"round, {n_layers}-layer draft",
        )
    ax.set_xlabel("tokens in the target pass (anchor + drafts)")
    ax.set_ylabel("cost / plain AR step = break-even tau")
    ax.set_title(f"{args.target} {args.dtype}, {args.threads} threads, batch 1", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "cost_model.png", dpi=120)
    print("\n".join(lines))
    print(f"-> {out}/cost_model.{{json,md,png}}")


if __name__ == "__main__":
    with user_errors("cost_model"):  # an expected mistake: one `error:` line, exit 2
        main()
