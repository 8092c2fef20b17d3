"""The load sweep's report: each scheduler policy against the best fixed policy per load, the
Markdown and the PNG plots (`load_sweep.py` measures; this renders its results.json)."""

from __future__ import annotations

import math
from pathlib import Path

from dspark.plotting import plt

# the sweep's policies, in the order its tables and plots list them (load_sweep.py's docstring)
POLICIES = ("ar", "full", "threshold", "scheduler", "scheduler_ragged")


def table(results: dict) -> dict:
    """`{"gains": {scheduler: {load: {best_fixed, gain_total, vs_ar_total}}}}`: each scheduler
    policy against the best fixed policy (ar, full, threshold) at every load."""
    by: dict[str, dict[int, dict]] = {}  # policy -> load -> cell
    for cell in results["cells"].values():
        by.setdefault(cell["policy"], {})[cell["load"]] = cell
    gains: dict[str, dict[int, dict]] = {}
    fixed = [p for p in ("ar", "full", "threshold") if p in by]
    for sched in ("scheduler", "scheduler_ragged"):
        if sched not in by or not fixed:
            continue
        gains[sched] = {}
        for load, cell in by[sched].items():
            best = max((by[p][load]["total_tokens_per_s"] or 0, p) for p in fixed if load in by[p])
            ar = by.get("ar", {}).get(load)

            def vs_ar(key: str, cell=cell, ar=ar) -> float | None:
                """This cell's `key` over AR's at the same load, minus 1."""
                return None if ar is None else (cell.get(key) or 0) / (ar.get(key) or math.nan) - 1

            gains[sched][load] = {
                "best_fixed": best[1],
                "gain_total": (cell["total_tokens_per_s"] or 0) / best[0] - 1 if best[0] else None,
                "vs_ar_total": vs_ar("total_tokens_per_s"),
                "vs_ar_full_load": vs_ar("full_load_tokens_per_s"),
            }
    return {"gains": gains}


def render_markdown(results: dict, plots: dict[str, str]) -> str:
    c = results["conditions"]
    f = lambda x, d=1: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    lines = [
        "# Load sweep",
        "",
        "Conditions: " + ", ".join(f"{k} `{v}`" for k, v in c.items()) + ".",
        "",
        "Total / per-user tokens/s are decode-phase figures (prefill excluded). full-load = "
        "tokens/s over the rounds where all `load` requests were live (the closed batch's "
        "tail, where requests that drafted ahead have finished, is a lower load; a server "
        "refills those slots). verify/req = verify tokens per request per round (1 + drafts "
        "verified); padded = tokens the padded verify pass computed per round; draft/verify "
        "= time ratio per round.",
        "",
        "| load | policy | total tok/s | full-load tok/s | per-user tok/s | tau | verify/req | "
        "padded/round | draft ms | verify ms | draft/verify | == AR |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cells = sorted(
        results["cells"].values(), key=lambda x: (x["load"], POLICIES.index(x["policy"]))
    )
    for x in cells:
        match = x.get("matches_ar")
        lines.append(
            f"| {x['load']} | {x['policy']} | {f(x['total_tokens_per_s'])} | "
            f"{f(x.get('full_load_tokens_per_s'))} | "
            f"{f(x['per_user_tokens_per_s'], 2)} | {f(x['tau'], 2)} | "
            f"{f(x['verify_tokens_per_request_round'], 2)} | "
            f"{f(x['padded_tokens_per_round'])} | {f(x['draft_ms_per_round'])} | "
            f"{f(x['verify_ms_per_round'])} | {f(x['draft_over_verify'], 2)} | "
            f"{'n/a' if match is None else f'{100 * match:.0f}%'} |"
        )
    gains = results.get("table", {}).get("gains", {})
    for sched, per_load in gains.items():
        lines += ["", f"`{sched}` vs the best fixed policy (ar, full, threshold) at each load:", ""]
        lines += [
            "| load | best fixed | gain (total tok/s) | vs AR | vs AR at full load |",
            "|---|---|---|---|---|",
        ]
        for load in sorted(per_load, key=int):
            g = per_load[load]
            pct = lambda v: "n/a" if v is None else f"{100 * v:+.1f}%"  # noqa: E731
            lines.append(
                f"| {load} | {g['best_fixed']} | {pct(g['gain_total'])} | "
                f"{pct(g['vs_ar_total'])} | {pct(g.get('vs_ar_full_load'))} |"
            )
    if plots:
        lines += [""] + [f"![{k}]({v})" for k, v in plots.items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, out_dir: Path) -> dict[str, str]:
    c = results["conditions"]
    sub = (
        f"{Path(str(c.get('target'))).name}, draft {c.get('draft_kind')}, block "
        f"{c.get('block_size')}, T={c.get('temperature')}, {c.get('max_new_tokens')} new tok, "
        f"{c.get('device')} {c.get('dtype')} {c.get('threads')} thr"
    )
    by: dict[str, list[dict]] = {}  # policy -> its cells
    for cell in results["cells"].values():
        by.setdefault(cell["policy"], []).append(cell)
    made = {}
    for key, ylabel, fname in (
        ("total_tokens_per_s", "total tokens/s (decode)", "throughput_vs_load.png"),
        ("per_user_tokens_per_s", "per-user tokens/s (decode)", "per_user_vs_load.png"),
    ):
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for i, policy in enumerate(p for p in POLICIES if p in by):
            pts = sorted((x["load"], x[key]) for x in by[policy] if x[key] is not None)
            if pts:
                ax.plot(*zip(*pts), "o-", color=f"C{i}", label=policy)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="concurrent requests", ylabel=ylabel)
        ax.set_title(f"{ylabel} vs load\n{sub}", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=120)
        plt.close(fig)
        made[key] = fname
    return made
