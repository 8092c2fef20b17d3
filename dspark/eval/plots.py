"""PNG plots from `results.json`: acceptance per position, speedups, reliability diagram.

Each figure's title carries its conditions (target, block, sampling, batch, device).
"""

from __future__ import annotations

from pathlib import Path

from dspark.plotting import plt


def _subtitle(c: dict) -> str:
    samp = "greedy" if c["temperature"] == 0 else f"T={c['temperature']}"
    return (
        f"target {Path(str(c['target'])).name}, block {c['block_size']}, {samp}, "
        f"batch {c['batch_size']}, {c['max_new_tokens']} new tok, {c['device']} {c['dtype']}"
    )


def acceptance_plot(results: dict, path: Path) -> Path:
    c = results["conditions"]
    ks = list(range(1, c["block_size"] + 1))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (name, d) in enumerate(results["datasets"].items()):
        color = f"C{i % 10}"
        a = d["acceptance"]
        cond = [float("nan") if x is None else x for x in a["conditional_acceptance"]]
        surv = [float("nan") if x is None else x for x in a["survival"]]
        tau = "n/a" if a["tau"] is None else f"{a['tau']:.2f}"
        ax.plot(ks, cond, "o-", color=color, label=f"{name} P(k | k-1) (tau {tau})")
        ax.plot(ks, surv, "s--", color=color, alpha=0.6, label=f"{name} survival")
    ax.set(xlabel="draft position k", ylabel="acceptance", ylim=(0, 1.02), xticks=ks)
    ax.set_title("Acceptance per position\n" + _subtitle(c), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def speedup_plot(results: dict, path: Path) -> Path:
    c = results["conditions"]
    names = list(results["datasets"])
    series = {
        "dspark spec / dspark AR": [d["speed"]["speedup"] for d in results["datasets"].values()]
    }
    for b in c["baselines"]:
        if b == "hf_generate":
            continue
        series[f"{b} / hf_generate"] = [
            d["baselines"][b]["speedup_vs_hf_generate"] for d in results["datasets"].values()
        ]
    if "hf_generate" in c["baselines"]:
        series["dspark spec / hf_generate"] = [
            d["speculative_vs_baselines"]["hf_generate"] for d in results["datasets"].values()
        ]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names) + 3), 4.2))
    width = 0.8 / len(series)
    for j, (label, vals) in enumerate(series.items()):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [v or 0.0 for v in vals], width, label=label, color=f"C{j}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("wall-clock speedup (x)")
    ax.set_title("Speedup per dataset\n" + _subtitle(c), fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def reliability_plot(results: dict, path: Path) -> Path | None:
    calib = results.get("calibration")
    if not calib:
        return None
    c = results["conditions"]
    views = [v for v in ("conditional", "survival") if v in calib]
    fig, axes = plt.subplots(1, len(views), figsize=(5 * len(views), 4.6), squeeze=False)
    for ax, view in zip(axes[0], views):
        ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect")
        curves = [("all", calib[view]["bins"], calib[view]["ece"])]
        curves += [
            (name, d["calibration"][view]["bins"], d["calibration"][view]["ece"])
            for name, d in results["datasets"].items()
            if d.get("calibration") and view in d["calibration"]
        ]
        sts = results.get("sts")
        if view == "survival" and sts:
            curves.append(("all, after STS (held-out)", sts["bins_after"], sts["ece_after"]))
        for i, (name, bins, e) in enumerate(curves):
            pts = [(b["confidence"], b["accuracy"]) for b in bins if b["count"]]
            if not pts:
                continue
            xs, ys = zip(*pts)
            style = "o-" if name == "all" else ".--"
            ax.plot(
                xs,
                ys,
                style,
                color=f"C{i}",
                lw=2 if name == "all" else 1,
                label=f"{name} (ECE {100 * e:.1f}%)" if e is not None else name,
            )
        ax.set(
            xlim=(0, 1),
            ylim=(0, 1),
            xlabel="predicted confidence",
            ylabel="realised acceptance",
            title=f"{view} view",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Confidence reliability\n" + _subtitle(c), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def make_plots(results: dict, out_dir: Path) -> dict[str, str]:
    """Write every plot that applies; returns {name: file name relative to out_dir}."""
    out_dir = Path(out_dir)
    made = {
        "acceptance": acceptance_plot(results, out_dir / "acceptance_per_position.png"),
        "speedup": speedup_plot(results, out_dir / "speedup.png"),
        "reliability": reliability_plot(results, out_dir / "reliability.png"),
    }
    return {k: p.name for k, p in made.items() if p is not None}
