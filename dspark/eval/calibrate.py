"""Fit the confidence head's STS temperatures on held-out prompts and ship them with the draft.

Decodes held-out prompts with full-block verification and RAW confidences (so every position
has a label), fits Sequential Temperature Scaling (method doc section 4) on the even-indexed
requests, scores the odd-indexed ones before/after, and writes the temperatures into the
draft's `config.json` as `confidence_temperatures` (which `DSparkConfig` reads and the decoder
applies). The default prompt sets (mbpp, math500) are neither training data nor the
benchmark's default sets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dspark.eval import calibration as cal

CONFIG_KEY = "confidence_temperatures"


def write_temperatures(draft_dir: str | os.PathLike, temperatures: list[float] | None) -> Path:
    """Set (or with None remove) `confidence_temperatures` in `draft_dir/config.json`, atomically."""
    path = Path(draft_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: pass a draft saved with save_pretrained")
    config = json.loads(path.read_text())
    if temperatures is None:
        config.pop(CONFIG_KEY, None)
    else:
        config[CONFIG_KEY] = [float(t) for t in temperatures]
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def collect(decoder, prompts: list[list[int]], max_new_tokens: int, batch_size: int, eos, seed):
    """Per-request `round_matrices` triples (raw confidences) from decoding `prompts`."""
    gamma = decoder.gamma
    per_request = []
    for lo in range(0, len(prompts), batch_size):
        out = decoder.generate(
            prompts[lo : lo + batch_size], max_new_tokens, eos_token_id=eos, seed=seed + lo
        )
        for c, a, v in zip(out.confidences, out.accept_lengths, out.verify_lengths):
            per_request.append(cal.round_matrices([c], [a], [v], gamma))
    return per_request


def fit_on_prompts(
    target,
    draft,
    prompts: list[list[int]],
    eos,
    *,
    max_new_tokens: int,
    batch_size: int,
    bins: int,
    seed: int,
    temperature: float = 0.0,
    max_length: int | None = None,
) -> dict | None:
    """Decode `prompts` with full-block verification and raw confidences, fit STS on the
    even-indexed requests and score the odd ones: the fit (None when no draft was verified)
    with the decoding conditions under "conditions" (callers add what the prompts were)."""
    from dspark.decoding import SpeculativeDecoder

    if max_length is None:
        max_length = int(getattr(target.config, "max_position_embeddings", 0) or 32768)
    decoder = SpeculativeDecoder(
        target,
        draft,
        temperature=temperature,
        verify_policy="full",
        calibrate=False,
        max_length=max_length,
    )
    torch.manual_seed(seed)
    per_request = collect(decoder, prompts, max_new_tokens, batch_size, eos, seed)
    fit = cal.sts_split_fit(per_request, bins)
    if fit is None:
        return None
    param = next(target.parameters())
    conditions = {
        "requests": len(prompts),
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "block_size": decoder.gamma,
        "verification": "full block, raw confidences",
        "bins": bins,
        "device": str(param.device),
        "dtype": str(param.dtype).replace("torch.", ""),
        "seed": seed,
    }
    return {"conditions": conditions, **fit}


def run(args) -> dict:
    """`args`: draft, target, datasets, bench_dir, num_prompts, max_new_tokens, temperature,
    batch_size, bins, seed, device, dtype, write, output_dir (see eval/calibrate.py)."""
    from dspark.eval.prompts import load_dataset, render
    from dspark.eval.runner import eos_ids, load_models

    target, tokenizer, draft, spec = load_models(args)
    if getattr(draft, "confidence_head", None) is None:
        raise ValueError(f"the draft at {args.draft} has no confidence head: nothing to calibrate")
    prompts = []
    for name in args.datasets:
        convs = load_dataset(name, args.bench_dir, args.num_prompts)
        prompts += [render(tokenizer, c, []) for c in convs]
    result = fit_on_prompts(
        target,
        draft,
        prompts,
        eos_ids(tokenizer, target),
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        bins=args.bins,
        seed=args.seed,
        temperature=args.temperature,
    )
    if result is None:
        raise ValueError("no verified drafts were recorded: raise max_new_tokens or num_prompts")
    result["conditions"] = {
        "draft": os.path.abspath(args.draft),
        "target": spec,
        "datasets": list(args.datasets),
        "num_prompts_per_dataset": args.num_prompts,
        **result["conditions"],
    }
    if args.write:
        result["written_to"] = str(write_temperatures(args.draft, result["temperatures"]))
    return result


def write_report(res: dict, out: Path) -> str:
    """`calibration_reliability.png`, `calibration.json` and `calibration.md` in `out`; returns
    the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    res["plot"] = reliability_png(res, out / "calibration_reliability.png").name
    (out / "calibration.json").write_text(json.dumps(res, indent=2) + "\n")
    md = render_markdown(res) + f"\n![reliability]({res['plot']})\n"
    (out / "calibration.md").write_text(md)
    return md


def summary_table(res: dict) -> list[str]:
    """ECE / Brier / AUROC of the survival view before and after STS (Markdown rows)."""
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    num = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    return [
        "| survival view | before | after STS |",
        "|---|---|---|",
        f"| ECE | {pct(res['ece_before'])} | {pct(res['ece_after'])} |",
        f"| Brier | {num(res['brier_before'])} | {num(res['brier_after'])} |",
        f"| AUROC | {num(res['auroc_before'])} | {num(res['auroc_after'])} |",
    ]


def render_markdown(res: dict) -> str:
    c = res["conditions"]
    num = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    lines = [
        "# Confidence calibration (STS)",
        "",
        f"Conditions: draft `{c['draft']}`, target `{c['target']}`, prompts "
        f"{', '.join(c['datasets'])} ({c['requests']} requests, first turn), "
        f"{c['max_new_tokens']} new tokens, T={c['temperature']}, block {c['block_size']}, "
        f"{c['verification']}, {c['bins']} bins, {c['device']} {c['dtype']}, seed {c['seed']}. "
        f"Fit on {res['fit_requests']} requests, scored on {res['test_requests']} "
        f"(n={res['n_test']} survival labels).",
        "",
        *summary_table(res),
        "",
        "Temperatures T_k: " + ", ".join(f"{t:.3f}" for t in res["temperatures"]),
    ]
    if res.get("written_to"):
        lines += ["", f"Written to `{res['written_to']}` (key `{CONFIG_KEY}`)."]
    lines += ["", "| bin | n | mean conf before | accepted before | n | mean conf after | "
              "accepted after |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for b0, b1 in zip(res["bins_before"], res["bins_after"]):
        lines.append(
            f"| {b0['lo']:.2f}-{b0['hi']:.2f} | {b0['count']} | {num(b0['confidence'])} | "
            f"{num(b0['accuracy'])} | {b1['count']} | {num(b1['confidence'])} | "
            f"{num(b1['accuracy'])} |"
        )
    return "\n".join(lines) + "\n"


def reliability_png(res: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4.6))
    ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect")
    for key, ece_key, style in (
        ("bins_before", "ece_before", "o--"),
        ("bins_after", "ece_after", "s-"),
    ):
        pts = [(b["confidence"], b["accuracy"]) for b in res[key] if b["count"]]
        if pts:
            xs, ys = zip(*pts)
            label = f"{key.split('_')[1]} STS (ECE {100 * res[ece_key]:.1f}%)"
            ax.plot(xs, ys, style, label=label)
    c = res["conditions"]
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted survival", ylabel="realised survival")
    ax.set_title(
        f"Survival reliability, held-out requests\n{Path(str(c['target'])).name}, block "
        f"{c['block_size']}, T={c['temperature']}, {c['max_new_tokens']} new tok",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
