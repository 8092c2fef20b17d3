"""The human side of a run: `results.json`, `report.md` and a training-curve PNG.

Parallels `dspark/eval/report.py` (a benchmark's) and `dspark/calibration/report.py` (an STS
fit's).
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark.fileio import dumps_strict
from dspark.plotting import plt


def _curves(out: Path, curve_metrics: list[str]) -> Path | None:
    """Loss and the objective's own acceptance metrics (`curve_metrics`) over steps."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [{k: float("nan") if v is None else v for k, v in r.items()} for r in rows]
    train = [r for r in rows if "train/loss" in r]
    if not train:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    steps = [r["step"] for r in train]
    a.plot(steps, [r["train/loss"] for r in train], label="train loss")
    ev = [r for r in rows if "eval/loss" in r]
    if ev:
        a.plot([r["step"] for r in ev], [r["eval/loss"] for r in ev], "o-", label="held-out loss")
    a.set_xlabel("optimizer step")
    a.legend()
    for name, color in zip(curve_metrics, ("C0", "C1", "C2", "C3"), strict=False):
        key = f"train/{name}"
        if any(key in r for r in train):
            b.plot(
                steps,
                [r.get(key, float("nan")) for r in train],
                color=color,
                alpha=0.5,
                label=f"train {name}",
            )
        if any(f"eval/{name}" in r for r in ev):
            b.plot(
                [r["step"] for r in ev if f"eval/{name}" in r],
                [r[f"eval/{name}"] for r in ev if f"eval/{name}" in r],
                "o-",
                color=color,
                label=f"held-out {name}",
            )
    b.set_xlabel("optimizer step")
    b.legend()
    fig.tight_layout()
    png = out / "training_curves.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _calibration_lines(out: Path, cal: dict | None) -> list[str]:
    """The end-of-training STS fit (trainer.calibrate_prompts): reliability before/after."""
    if not cal:
        return []
    if "skipped" in cal:
        return ["", f"Confidence calibration (STS) skipped: {cal['skipped']}."]
    from dspark.calibration.report import summary_table  # light module: defers torch

    c = cal["conditions"]
    png = Path(cal["written_to"]).parent / "calibration_reliability.png"
    return [
        "",
        "## Confidence calibration (STS)",
        "",
        f"{c['requests']} held-out prompts decoded by the published draft ({c['max_new_tokens']} "
        f"new tokens, T=0, full-block verification, {c['device']} {c['dtype']}); fit on "
        f"{cal['fit_requests']} requests, scored on {cal['test_requests']} "
        f"(n={cal['n_test']} survival labels). Temperatures written to `{cal['written_to']}`.",
        "",
        *summary_table(cal),
        "",
        f"![reliability]({_relative(png, out)})",
    ]


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _vocab_lines(vocab: dict | None) -> list[str]:
    """A reduced draft vocabulary: its size and the share of supervised tokens it covers."""
    if not vocab:
        return []
    if "file" not in vocab:
        return ["", f"Draft vocabulary: {vocab['size']} tokens, from `{vocab.get('from')}`."]
    return [
        "",
        f"Draft vocabulary: the {vocab['size']} most frequent supervised tokens "
        f"(`{vocab['file']}`), covering {100 * vocab['coverage']:.2f}% of them.",
    ]


def _time_lines(results: dict) -> list[str]:
    """Wall hours of the training steps (every job of the run) and, on a feature cache, of the
    target's passes that wrote it and its head's pass over it."""

    def h(s: float | None) -> str:
        return "not on record" if s is None else f"{s / 3600:.2f} h"

    total = results.get("train_seconds_total", results.get("train_seconds"))
    lines = ["", f"Time (wall): training steps {h(total)} over every job of the run"]
    cost = results.get("feature_cache")
    if cost:
        lines[-1] += (f"; the feature cache ({cost['rows']:,} rows) written in "
                      f"{h(cost.get('cache_s'))}, the target head's pass over it "
                      f"{h(cost.get('head_pass_s'))}")  # fmt: skip
    lines[-1] += "."
    return lines


def write_report(out: Path, results: dict, run_config: dict) -> None:
    (out / "results.json").write_text(dumps_strict(results, indent=2, default=str))
    c = results["conditions"]
    ev = results["final_eval"]
    last = results.get("last_train", {})
    lines = [
        f"# Distillation report: {out}",
        "",
        f"Conditions: target `{c['target']}` ({c['target_dtype']}), device {c['device']} x "
        f"{c['processes']} process(es), mixed precision {c['mixed_precision']}, block size "
        f"{c['block_size']}, {c['batch_per_device']} "
        f"{'packed rows' if c.get('packing') else 'sequences'}/device/micro-step x "
        f"{c['grad_accum']} accumulation, torch threads {c['torch_threads']}, "
        f"data `{run_config['data']['train']}`.",
        *_vocab_lines(c.get("draft_vocab")),
        "",
        f"Draft written to `{results['draft']}` after {results['steps']} optimizer steps.",
        "",
        "| held-out metric | value |",
        "|---|---|",
    ]
    lines += [
        f"| {k.removeprefix('eval/')} | {v:.4f} |"
        for k, v in ev.items()
        if k != "step" and isinstance(v, float)
    ]
    if last:
        lines += [
            "",
            f"Last logged training step: {last.get('step')}, "
            f"{last.get('tokens_per_s', 0):.0f} tokens/s, peak memory "
            f"{last.get('peak_memory_mb', 0):.0f} MB.",
        ]
    lines += _time_lines(results)
    lines += _calibration_lines(out, results.get("calibration"))
    png = _curves(out, results.get("curve_metrics", []))
    if png:
        lines += ["", f"![training curves]({png.name})"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
