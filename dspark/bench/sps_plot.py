"""Markdown and a PNG of an SPS profile: step time and SPS(B) per live-request count."""

from __future__ import annotations

from pathlib import Path

from dspark.decoding.sps import SPSProfile
from dspark.plotting import plt


def profile_markdown(prof: SPSProfile, target: str) -> str:
    m = prof.meta
    lines = [
        "# SPS profile (verify steps per second)",
        "",
        f"Conditions: target `{target}`, device `{m.get('device')}`, dtype `{m.get('dtype')}`, "
        f"{m.get('threads')} threads, context {m.get('context_len')} tokens, gamma "
        f"{m.get('gamma')}, median of {m.get('reps')} reps ({m.get('source')}, "
        f"{m.get('smoothing', 'no smoothing')}). A step = one verify pass [rows x width] "
        "(target forward with taps and logits, argmax, draft context write).",
        "",
        "| rows \\ width | " + " | ".join(str(w) for w in prof.widths) + " | draft round |",
        "|---|" + "---|" * (len(prof.widths) + 1),
    ]
    for i, r in enumerate(prof.rows):
        cells = [f"{1e3 * t:.1f} ms" for t in prof.times[i]]
        draft = f"{1e3 * prof.draft_times[i]:.1f} ms" if prof.draft_times else "n/a"
        lines.append(f"| {r} | " + " | ".join(cells) + f" | {draft} |")
    return "\n".join(lines) + "\n"


def plot_profile(prof: SPSProfile, path: Path, gamma: int) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for i, r in enumerate(prof.rows):
        bs = list(range(r, r * (gamma + 1) + 1, max(1, r // 4)))
        axes[0].plot([r * w for w in prof.widths], [1e3 * t for t in prof.times[i]], "o-",
                     color=f"C{i % 10}", label=f"{r} requests")  # fmt: skip
        axes[1].plot(bs, [prof.sps(b, r) for b in bs], "-", color=f"C{i % 10}", label=f"R={r}")
    axes[0].set(xlabel="verify tokens (rows x width)", ylabel="step time (ms)", xscale="log")
    axes[1].set(xlabel="token batch B", ylabel="SPS(B) (steps/s)", xscale="log", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    m = prof.meta
    fig.suptitle(
        f"SPS profile: {Path(str(m.get('target', ''))).name}, {m.get('device')}, {m.get('dtype')}, "
        f"{m.get('threads')} threads, context {m.get('context_len')}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
