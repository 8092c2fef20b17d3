"""Predict per-user speed and throughput per verify policy from recorded acceptance traces.

    # check against a real sweep on this device (same traces, same profile):
    python eval/simulate.py --traces runs/load_sweep/traces.jsonl \
        --measured runs/load_sweep/results.json --profile PROFILE.json
    # size another device: its profile (eval/profile_sps.py there) or a roofline model
    python eval/simulate.py --traces runs/load_sweep/traces.jsonl --engine ragged \
        --roofline weight_bytes=16e9 hbm_bytes_per_s=4.8e12 flops_per_s=990e12 \
        overhead_s=0.002 draft_weight_bytes=1.6e9 draft_overhead_s=0.001 \
        --loads 1 2 4 8 16 32 64 128 --max-new-tokens 256

Writes simulate.json and simulate.md to --out. Library: dspark/bench/simulate.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces", required=True, help="a load sweep's traces.jsonl")
    ap.add_argument("--profile", default=None, help="an SPS profile JSON (eval/profile_sps.py)")
    ap.add_argument("--roofline", nargs="+", default=None, help="key=value Roofline inputs")
    ap.add_argument("--measured", default=None, help="the sweep's results.json to compare with")
    ap.add_argument("--loads", nargs="+", type=int, default=None)
    ap.add_argument("--policies", nargs="+", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--threshold", type=float, default=None)
    ap.add_argument("--engine", choices=["padded", "ragged"], default="padded")
    ap.add_argument("--overhead-ms", type=float, default=0.0, help="host time per round")
    ap.add_argument("--out", default=None, help="default: the traces' folder")
    args = ap.parse_args()

    from dspark.bench import simulate as sim
    from dspark.decoding.sps import Roofline, SPSProfile, default_rows, default_widths

    measured = json.loads(Path(args.measured).read_text()) if args.measured else None
    mc = measured["conditions"] if measured else {}
    loads = args.loads or mc.get("loads") or [1, 2, 4, 8, 16, 32]
    policies = args.policies or mc.get("policies") or list(sim.POLICIES)
    max_new = args.max_new_tokens or mc.get("max_new_tokens") or 64
    threshold = args.threshold if args.threshold is not None else mc.get("threshold", 0.5)
    traces = sim.load_traces(args.traces)
    gamma = len(next(iter(traces.values()))[0][0].survival)
    if args.roofline:
        kw = {k: float(v) for k, v in (x.split("=", 1) for x in args.roofline)}
        roof = Roofline(**{**kw, "gamma": gamma})
        profile = roof.profile(default_rows(max(loads)), default_widths(gamma))
    elif args.profile:
        profile = SPSProfile.load(args.profile)
    else:
        raise SystemExit("pass --profile PROFILE.json or --roofline key=value ...")
    predicted = sim.predict(
        traces, profile, loads, policies, max_new_tokens=max_new, threshold=threshold,
        engine=args.engine, overhead_s=args.overhead_ms / 1e3,
    )  # fmt: skip
    res = {
        "conditions": {
            "traces": str(Path(args.traces).resolve()),
            "profile": args.profile or "roofline",
            "profile_meta": profile.meta,
            "engine": args.engine,
            "loads": loads,
            "max_new_tokens": max_new,
            "threshold": threshold,
            "overhead_ms_per_round": args.overhead_ms,
            "block_size": gamma,
        },
        "predicted": predicted,
    }
    if measured:
        res["comparison"] = sim.compare(predicted, measured)
    out = Path(args.out or Path(args.traces).parent)
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulate.json").write_text(json.dumps(res, indent=2) + "\n")
    md = sim.render_markdown(res)
    (out / "simulate.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
