"""The human side of an STS fit: `calibration.{json,md}` and the reliability PNG.

Parallels `dspark/training/report.py` (a run's) and `dspark/eval/report.py` (a benchmark's).
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark.calibration.fit import CONFIG_KEY
from dspark.plotting import plt


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
