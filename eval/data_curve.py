"""The tau-versus-data curve of one recipe shape: every point a draft trained, at equal epochs,
on the first N conversations of one data build (make smollm2-point N=...), read back from its
run directory; one table, one PNG, and what the next doubling of data would buy.

    python eval/data_curve.py runs/curve --output runs/curve/report
    python eval/data_curve.py runs/curve --recorded docs/data_curve_points.json  # + earlier points

Per point (RUN_ROOT/n<N>/): held-out `tau_greedy` (training's results.json), decoder tau per
bench set (benchmark/results.json), the wall seconds of the training and of its feature cache
(training's `feature_cache`), and the data's CPU-hours: the
answering runs' (--build, its runs.jsonl) prorated to N rows, and the sampling of the
target-written prompts those rows use (--mix, --prompt-set). The last doubling's gain in tau
per set is the slope the report quotes. What limits a point: the draft's tau on its own
training rows in the last epoch (blocks-weighted over metrics.jsonl) against held-out. A draft
that does no better on rows it has seen five times than on new ones (gap < FIT_GAP) cannot be
lifted by more rows of the same kind: its capacity limits it. A wider gap is what it learnt
from its rows and does not carry over: more data closes it. The held-out set is another kind of
prompt than the mix, so that gap also holds the shift between kinds; where a point has them
(`make smollm2-seen-unseen N=...`), the decoder's tau on prompts of the mix the draft trained
on and on prompts of the same mix after its N rows measures the same gap without the shift.
Each point names the machine it trained on (training hours and CPU-hours compare only within
one machine kind).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.data.build_status import runs_cpu_s
from dspark.data.outputs import read_json_rows
from dspark.data.prompts.seen_unseen import SETS as SEEN_UNSEEN
from dspark.errors import BadInputError, user_errors
from dspark.fileio import dumps_strict, write_text_atomic
from dspark.plotting import plt
from dspark.training.run_status import step_pace

# tau on the training rows minus held-out tau below which a point counts as capacity-limited
FIT_GAP = 0.05


def last_epoch_train_tau(log: list[dict]) -> float | None:
    """Blocks-weighted mean of the logged train/tau_greedy (`log`: metrics.jsonl's rows) over
    the run's last epoch."""
    rows = [r for r in log if "train/tau_greedy" in r]
    if not rows:
        return None
    last = max(r.get("epoch", 0) for r in rows)
    rows = [r for r in rows if r.get("epoch", 0) == last]
    weights = [float(r.get("train/blocks", 1.0)) for r in rows]
    return sum(w * r["train/tau_greedy"] for w, r in zip(weights, rows)) / sum(weights)


def limit_of(point: dict) -> str | None:
    train, held = point.get("train_tau_greedy"), point.get("held_out_tau_greedy")
    if train is None or held is None:
        return None
    return "data" if train - held >= FIT_GAP else "capacity"


def bench_taus(bench: dict) -> dict:
    """Decoder tau per set of a benchmark's results.json."""
    return {k: (v.get("acceptance") or {}).get("tau") for k, v in bench["datasets"].items()}


def seen_unseen_tau(run: Path) -> dict | None:
    """`{"seen", "unseen"}` decoder tau (`make smollm2-seen-unseen`); None where not both."""
    paths = {name: run / "seen_unseen" / name / "results.json" for name in SEEN_UNSEEN}
    if not all(p.is_file() for p in paths.values()):
        return None
    return {name: bench_taus(json.loads(p.read_text())).get(name) for name, p in paths.items()}


def stepping_s(log: list[dict], steps: int | None) -> float | None:
    """Seconds of a run's training steps at their logged pace (`log`: metrics.jsonl's rows;
    `step_pace`: the gaps of a pause, a kill or a job's start left out), so a point trained in
    chunks beside other work counts its steps alone; None where the log gives no pace."""
    pace = step_pace(log)
    return None if pace is None or not steps else pace * steps


def features_s(cost: dict | None) -> float | None:
    """Wall seconds of a run's feature cache (training's `feature_cache`): the target's passes
    writing it plus its head's pass over it; None where the cache's pace is not on record."""
    if not cost or cost.get("cache_s") is None:
        return None
    return cost["cache_s"] + (cost.get("head_pass_s") or 0.0)


def read_point(run: Path) -> dict:
    n = int(re.fullmatch(r"n(\d+)", run.name).group(1))  # type: ignore[union-attr]
    res = json.loads((run / "results.json").read_text())
    log = read_json_rows(run / "metrics.jsonl")
    wall = res.get("train_seconds_total", res.get("train_seconds"))
    point = {"n": n, "steps": res.get("steps"),
             "held_out_tau_greedy": res["final_eval"].get("eval/tau_greedy"),
             "train_s": stepping_s(log, res.get("steps")) or wall,
             "train_wall_s": wall,
             "features_s": features_s(res.get("feature_cache")),
             "train_tau_greedy": last_epoch_train_tau(log),
             "machine": (res.get("conditions") or {}).get("device_name"),
             "seen_unseen_tau": seen_unseen_tau(run)}  # fmt: skip
    point["limit"] = limit_of(point)
    bench = run / "benchmark" / "results.json"
    if bench.is_file():
        b = json.loads(bench.read_text())
        point["tau"] = bench_taus(b)
        # a run from before training recorded its machine: its benchmark's, as a rule the same
        point["machine"] = point["machine"] or (b.get("conditions") or {}).get("device_name")
    else:
        point["tau"] = {}
    return point


def prompt_cpu_s(folder: Path) -> float:
    """CPU seconds a target-written prompt set spent per prompt it kept: per sample over the
    runs on record, times the samples drawn per prompt kept."""
    summary = json.loads((folder / "summary.json").read_text())
    per_sample = runs_cpu_s(folder / "runs.jsonl", "generated_this_run", "generated_this_run")
    return (per_sample or 0.0) * summary["generated"] / max(summary["kept"], 1)


def mix_sources(mix: Path, n: int) -> list[str]:
    """The `source` of each of the mix's first n rows."""
    with open(mix, encoding="utf-8") as f:
        return [json.loads(line)["source"] for line, _ in zip(f, range(n))]


def data_cpu_hours(points: list[dict], answers: Path | None, mix: Path | None,
                   prompt_sets: dict[str, Path]) -> None:  # fmt: skip
    """Set each point's `answers_cpu_h` (the build's answering CPU per row, times N) and
    `prompts_cpu_h` (per source, its CPU per prompt kept, times those among the first N rows
    of the mix); None where the build's files were not given."""
    per_row = None
    if answers is not None and (answers / "runs.jsonl").is_file():
        per_row = runs_cpu_s(answers / "runs.jsonl", "generated_tokens", "rows_done")
    points = [p for p in points if not p.get("recorded")]  # those keep their own figures
    if not points:
        return
    per_prompt = {source: prompt_cpu_s(folder) for source, folder in prompt_sets.items()}
    sources = mix_sources(mix, max(p["n"] for p in points)) if mix and per_prompt else None
    for p in points:
        p["answers_cpu_h"] = None if per_row is None else per_row * p["n"] / 3600
        p["prompts_cpu_h"] = None if sources is None else sum(
            per_prompt.get(s, 0.0) for s in sources[: p["n"]]) / 3600  # fmt: skip


def recorded_points(path: Path, have: set[int]) -> list[dict]:
    """The points of an earlier report's curve.json (another build or machine) whose N has no
    run here, each marked with the file it comes from; its figures are taken as recorded."""
    try:
        pts = json.loads(path.read_text(encoding="utf-8")).get("points")
    except (OSError, ValueError, AttributeError) as e:
        raise BadInputError(f"--recorded {path}: {e}; expected a curve.json that "
                            "eval/data_curve.py wrote") from None  # fmt: skip
    if not isinstance(pts, list) or not all(isinstance(p, dict) and "n" in p for p in pts):
        raise BadInputError(f"--recorded {path}: no list of points with an `n` each; expected a "
                            "curve.json that eval/data_curve.py wrote")  # fmt: skip
    return [{**p, "n": int(p["n"]), "tau": p.get("tau") or {}, "recorded": str(path)}
            for p in pts if int(p["n"]) not in have]  # fmt: skip


def _source_dir(arg: str) -> tuple[str, Path]:
    source, sep, folder = arg.partition("=")
    if not sep or not (Path(folder) / "runs.jsonl").is_file():
        raise BadInputError(f"--prompt-set {arg}: expected SOURCE=DIR, DIR a prompt set with a "
                            "runs.jsonl (magpie_prompts.py --output DIR)")  # fmt: skip
    return source, Path(folder)


def doubling_gain(points: list[dict], key) -> float | None:
    """tau gained from the second-largest point to the largest, per doubling of N."""
    pts = [(p["n"], key(p)) for p in points if key(p) is not None]
    if len(pts) < 2:
        return None
    (n0, t0), (n1, t1) = pts[-2], pts[-1]
    return (t1 - t0) / math.log2(n1 / n0)


def render(points: list[dict], sets: list[str], gains: dict) -> str:
    def f(v, spec):
        return "" if v is None else format(v, spec)

    def seen(p):
        su = p.get("seen_unseen_tau") or {}
        return "" if not su else f"{f(su.get('seen'), '.2f')} / {f(su.get('unseen'), '.2f')}"

    columns = ["N", "steps", "held-out tau_greedy", "train tau_greedy (last epoch)", "limit",
               *sets, "seen / unseen tau", "prompts CPU-h", "answers CPU-h", "features h",
               "train h", "machine"]  # fmt: skip
    head = "| " + " | ".join(columns) + " |"
    lines = ["# tau against data", "", head, "|" + "---|" * len(columns)]
    for p in points:
        taus = " | ".join([f(p["tau"].get(s), ".2f") for s in sets] + [seen(p)])
        tr, fs = p.get("train_s"), p.get("features_s")
        mark = "*" if p.get("recorded") else ""
        lines.append(f"| {p['n']}{mark} | {p['steps']} | {f(p.get('held_out_tau_greedy'), '.3f')} | "
                     f"{f(p.get('train_tau_greedy'), '.3f')} | {p.get('limit') or ''} | {taus} | "
                     f"{f(p.get('prompts_cpu_h'), '.2f')} | {f(p.get('answers_cpu_h'), '.2f')} | "
                     f"{f(None if fs is None else fs / 3600, '.2f')} | "
                     f"{f(None if tr is None else tr / 3600, '.2f')} | {p.get('machine') or ''} |")  # fmt: skip
    lines += ["", "tau gained by the last doubling of data: " + ", ".join(
        f"{k} {v:+.3f}" for k, v in gains.items() if v is not None) + ".",
        f"limit: `data` where the draft's tau on its training rows (last epoch) exceeds held-out "
        f"by {FIT_GAP} or more (what more rows would close), `capacity` below that.",
        "seen / unseen: the decoder's tau on prompts of the mix the draft trained on and on "
        "prompts of the same mix it never saw (`make smollm2-seen-unseen`): their gap, free of "
        "the held-out set's other kind of prompt, is what more rows of the mix can close.",
        "features h: the target's passes writing the point's feature cache and its head's pass "
        "over it; train h: the training steps at their logged pace, pauses and job starts left "
        "out (the run's wall time where its log gives none); wall hours on the point's "
        "machine, both."]  # fmt: skip
    lines += [f"`*`: as recorded in {src} (another build's rows; a doubling across builds "
              "also holds the difference between their draws)."
              for src in sorted({p["recorded"] for p in points if p.get("recorded")})]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder holding one n<N>/ run directory per point")
    ap.add_argument("--build", default=None, help="the data build's answers (its runs.jsonl)")
    ap.add_argument("--mix", default=None, help="the build's prompt mix (mix.jsonl)")
    ap.add_argument("--prompt-set", action="append", default=[], metavar="SOURCE=DIR",
                    help="a target-written prompt set of the mix (magpie_prompts.py's output)")  # fmt: skip
    ap.add_argument("--recorded", default=None, metavar="CURVE_JSON",
                    help="an earlier report's curve.json: its points of N not run under ROOT "
                    "join the table and plot as recorded (marked *)")  # fmt: skip
    ap.add_argument("--output", default=None, help="default: ROOT/report")
    a = ap.parse_args(argv)
    with user_errors("data_curve"):
        root = Path(a.root)
        runs = sorted((p for p in root.glob("n*") if (p / "results.json").is_file()),
                      key=lambda p: int(p.name[1:]))  # fmt: skip
        if not runs and not a.recorded:
            raise BadInputError(f"{root} holds no n<N>/results.json: train a point first "
                                "(make smollm2-point N=1500)")  # fmt: skip
        points = [read_point(r) for r in runs]
        if a.recorded:
            points += recorded_points(Path(a.recorded), {p["n"] for p in points})
            points.sort(key=lambda p: p["n"])
        prompt_sets = dict(_source_dir(x) for x in a.prompt_set)
        data_cpu_hours(points, Path(a.build) if a.build else None,
                       Path(a.mix) if a.mix else None, prompt_sets)  # fmt: skip
        sets = sorted({s for p in points for s in p["tau"]})
        gains = {"held-out": doubling_gain(points, lambda p: p.get("held_out_tau_greedy"))}
        gains.update({s: doubling_gain(points, lambda p, s=s: p["tau"].get(s)) for s in sets})
        out = Path(a.output or root / "report")
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "curve.json", dumps_strict(
            {"points": points, "doubling_gain": gains}, indent=2) + "\n")  # fmt: skip
        report = write_text_atomic(out / "curve.md", render(points, sets, gains))
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
