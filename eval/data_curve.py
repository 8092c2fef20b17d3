"""The tau-versus-data curve of one recipe shape: every point a draft trained, at equal epochs,
on the first N conversations of one data build (make smollm2-point N=...), read back from its
run directory; one table, one PNG, and what the next doubling of data would buy.

    python eval/data_curve.py runs/curve --output runs/curve/report

Per point (RUN_ROOT/n<N>/): held-out `tau_greedy` (training's results.json), decoder tau per
bench set (benchmark/results.json), the training's wall seconds, and the data's CPU-hours, the
build's regeneration time (its runs.jsonl) prorated to N rows. The last doubling's gain in tau
per set is the slope the report quotes: near zero, the draft's capacity (not data) limits it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import BadInputError, user_errors


def read_point(run: Path) -> dict:
    n = int(re.fullmatch(r"n(\d+)", run.name).group(1))  # type: ignore[union-attr]
    res = json.loads((run / "results.json").read_text())
    point = {"n": n, "steps": res.get("steps"),
             "held_out_tau_greedy": res["final_eval"].get("eval/tau_greedy"),
             "train_s": res.get("train_seconds_total", res.get("train_seconds"))}  # fmt: skip
    bench = run / "benchmark" / "results.json"
    if bench.is_file():
        b = json.loads(bench.read_text())
        point["tau"] = {k: (v.get("acceptance") or {}).get("tau") for k, v in b["datasets"].items()}
    else:
        point["tau"] = {}
    return point


def data_cpu_hours(build: Path | None, n: int) -> float | None:
    """The build's regeneration CPU-hours (wall x threads over its steps) prorated to n rows."""
    if build is None or not (build / "runs.jsonl").is_file():
        return None
    steps = [json.loads(x) for x in (build / "runs.jsonl").read_text().splitlines() if x.strip()]
    rows = sum(s.get("rows_done", 0) for s in steps)
    cpu_s = sum(s.get("elapsed_s", 0.0) * (s.get("threads") or 1) for s in steps)
    return None if rows == 0 else cpu_s * min(n, rows) / rows / 3600


def doubling_gain(points: list[dict], key) -> float | None:
    """tau gained from the second-largest point to the largest, per doubling of N."""
    pts = [(p["n"], key(p)) for p in points if key(p) is not None]
    if len(pts) < 2:
        return None
    (n0, t0), (n1, t1) = pts[-2], pts[-1]
    return (t1 - t0) / math.log2(n1 / n0)


def render(points: list[dict], sets: list[str], gains: dict) -> str:
    head = "| N | steps | held-out tau_greedy | " + " | ".join(sets) + " | data CPU-h | train h |"
    lines = ["# tau against data", "", head, "|" + "---|" * (len(sets) + 5)]
    for p in points:
        taus = " | ".join("" if p["tau"].get(s) is None else f"{p['tau'][s]:.2f}" for s in sets)
        h = p.get("held_out_tau_greedy")
        cpu = p.get("data_cpu_h")
        tr = p.get("train_s")
        lines.append(f"| {p['n']} | {p['steps']} | {'' if h is None else f'{h:.3f}'} | {taus} | "
                     f"{'' if cpu is None else f'{cpu:.2f}'} | "
                     f"{'' if tr is None else f'{tr / 3600:.2f}'} |")  # fmt: skip
    lines += ["", "tau gained by the last doubling of data: " + ", ".join(
        f"{k} {v:+.3f}" for k, v in gains.items() if v is not None) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder holding one n<N>/ run directory per point")
    ap.add_argument("--build", default=None, help="the data build's answers (its runs.jsonl)")
    ap.add_argument("--output", default=None, help="default: ROOT/report")
    a = ap.parse_args(argv)
    with user_errors("data_curve"):
        root = Path(a.root)
        runs = sorted((p for p in root.glob("n*") if (p / "results.json").is_file()),
                      key=lambda p: int(p.name[1:]))  # fmt: skip
        if not runs:
            raise BadInputError(f"{root} holds no n<N>/results.json: train a point first "
                                "(make smollm2-point N=1500)")  # fmt: skip
        points = [read_point(r) for r in runs]
        for p in points:
            p["data_cpu_h"] = data_cpu_hours(Path(a.build) if a.build else None, p["n"])
        sets = sorted({s for p in points for s in p["tau"]})
        gains = {"held-out": doubling_gain(points, lambda p: p.get("held_out_tau_greedy"))}
        gains.update({s: doubling_gain(points, lambda p, s=s: p["tau"].get(s)) for s in sets})
        out = Path(a.output or root / "report")
        out.mkdir(parents=True, exist_ok=True)
        from dspark.fileio import dumps_strict, write_text_atomic

        write_text_atomic(out / "curve.json", dumps_strict(
            {"points": points, "doubling_gain": gains}, indent=2) + "\n")  # fmt: skip
        report = write_text_atomic(out / "curve.md", render(points, sets, gains))
        import matplotlib  # optional: matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional: matplotlib

        fig, ax = plt.subplots(figsize=(6, 4))
        ns = [p["n"] for p in points]
        ax.plot(ns, [p.get("held_out_tau_greedy") for p in points], "k-o", label="held-out")
        for s in sets:
            ax.plot(ns, [p["tau"].get(s) for p in points], marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("conversations")
        ax.set_ylabel("tau")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "curve.png", dpi=110)
    print(report.read_text())


if __name__ == "__main__":
    main()
