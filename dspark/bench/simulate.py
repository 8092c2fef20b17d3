"""Replay the decoder's acceptance traces against an SPS profile: per-user speed and throughput
per verify policy and load, for a device one may not have.

Its command line is `eval/simulate.py`, a thin entry script of the same name.

Traces (the load sweep's `traces.jsonl`, policy `full`): per request, per round, the draft's
confidences c_1..c_gamma (as the policy saw them) and the accepted count a when all of them
were verified. Verifying only the first l drafts of that round would have accepted min(a, l)
(at T=0 exactly; at T>0 too, under the same random draws), so one full-block trace answers
"what would policy P have committed" for every P. Rounds are replayed in order per request
(cycling when a policy needs more rounds than were recorded, since it commits less per round).

Time per simulated round at R live requests = draft round time t_draft(R) (when drafted)
+ verify pass time t(R, width) from the profile + a fixed host overhead per round. `engine`
says how a round's verify lengths become a pass: `padded` (this repository's decoder: width
= 1 + max l_r) or `ragged` (a serving engine packing B = sum(1 + l_r) tokens: width = B / R).
The policies mirror the decoder's: ar, full, threshold, scheduler (padded pricing, draft
skipping), scheduler_ragged (the published per-slot algorithm). Decode phase only (prefill
excluded), EOS ignored (every request generates `max_new_tokens`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dspark.decoding.draft_gate import MAX_PROBE_INTERVAL, PROBE_INTERVAL, DraftGate
from dspark.decoding.scheduler import schedule_padded, schedule_ragged
from dspark.decoding.sps import SPSProfile

POLICIES = ("ar", "full", "threshold", "scheduler", "scheduler_ragged")


@dataclass
class TraceRound:
    survival: list[float]  # a_1..a_gamma (prod of confidences)
    accepted: int  # drafts accepted when all len(survival) were verified


def load_traces(path: str | Path, policy: str = "full") -> dict[int, list[list[TraceRound]]]:
    """`{load: [per-request rounds]}` from a traces.jsonl (only rounds with every confidence)."""
    by_load: dict[int, list[list[TraceRound]]] = {}
    gamma = 0
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["policy"] == policy]
    if not rows:
        raise ValueError(f"{path} holds no traces of policy {policy!r}; run the sweep with it")
    for r in rows:
        for c in r["confidences"]:
            gamma = max(gamma, len(c))
    for r in rows:
        rounds = []
        for c, a, v in zip(r["confidences"], r["accept_lengths"], r["verify_lengths"]):
            if len(c) == gamma and v == gamma:  # budget-capped last rounds say less
                rounds.append(TraceRound(np.cumprod(c).tolist(), int(a)))
        if rounds:
            by_load.setdefault(int(r["load"]), []).append(rounds)
    return by_load


def _lengths(policy, surv, caps, profile, gamma, threshold):
    rows = len(caps)
    cap_t = torch.tensor(caps)
    if policy == "full":
        return list(caps)
    if policy == "threshold":
        out = []
        for a, cap in zip(surv, caps):
            n = 0
            while n < len(a) and a[n] >= threshold:
                n += 1
            out.append(min(max(n, 1), cap))
        return out
    table = profile.table(rows, gamma)
    fn = schedule_ragged if policy == "scheduler_ragged" else schedule_padded
    return fn(torch.tensor(surv, dtype=torch.float32), table, cap_t).tolist()


def new_gate(
    policy: str,
    profile: SPSProfile,
    gamma: int,
    probe_interval: int = PROBE_INTERVAL,
    max_probe_interval: int = MAX_PROBE_INTERVAL,
) -> DraftGate | None:
    """The decoder's draft gate for a scheduler policy (None: the policy drafts every round)."""
    if not policy.startswith("scheduler"):
        return None
    return DraftGate.for_profile(
        profile,
        gamma,
        ragged=policy == "scheduler_ragged",
        interval=probe_interval,
        max_interval=max_probe_interval,
    )


def simulate(
    streams: list[list[TraceRound]],
    load: int,
    policy: str,
    profile: SPSProfile,
    *,
    max_new_tokens: int,
    threshold: float = 0.5,
    engine: str = "padded",
    overhead_s: float = 0.0,
    probe_interval: int = PROBE_INTERVAL,
    max_probe_interval: int = MAX_PROBE_INTERVAL,
    skip_drafts: bool = True,
    gate: DraftGate | None = None,
) -> dict:
    """One (load, policy) cell: decode-phase tokens/s total and per user, tau, widths.

    Scheduler policies skip drafts through the decoder's own `DraftGate` (a fresh one, or
    `gate` to carry its history over from earlier loads, as one decoder serving every load
    does)."""
    if engine not in ("padded", "ragged"):
        raise ValueError(f"engine={engine!r}; use padded or ragged")
    gamma = len(streams[0][0].survival)
    made = [1] * load  # the prefill's token
    pos = [0] * load
    finish = [0.0] * load
    clock, rounds, committed_rounds, accepted_total, widths, tokens = 0.0, 0, 0, 0, [], []
    if not skip_drafts:
        gate = None
    elif gate is None:
        gate = new_gate(policy, profile, gamma, probe_interval, max_probe_interval)
    while True:
        live = [i for i in range(load) if made[i] < max_new_tokens]
        if not live:
            break
        r = len(live)
        caps = [min(gamma, max_new_tokens - made[i] - 1) for i in live]
        if policy == "ar" or (gate is not None and not gate.should_draft(r, max(caps))):
            lens, drafted, trace = [0] * r, False, None
        else:
            trace = [
                streams[i % len(streams)][pos[i] % len(streams[i % len(streams)])] for i in live
            ]
            surv = [t.survival for t in trace]
            lens = _lengths(policy, surv, caps, profile, gamma, threshold)
            drafted = True
            if gate is not None:
                gate.observe(surv, lens, [min(t.accepted, n) for t, n in zip(trace, lens)])
        width = 1 + max(lens) if engine == "padded" else (r + sum(lens)) / r
        step = profile.step_time(r, width)
        clock += step + overhead_s + (profile.draft_time(r) if drafted else 0.0)
        widths.append(width)
        tokens.append(r + sum(lens))
        rounds += 1
        for k, i in enumerate(live):
            acc = min(trace[k].accepted, lens[k]) if trace is not None else 0  # None: AR step
            made[i] = min(max_new_tokens, made[i] + acc + 1)
            if drafted:
                pos[i] += 1
                committed_rounds += 1
                accepted_total += acc
            if made[i] >= max_new_tokens:
                finish[i] = clock
    total = sum(m - 1 for m in made)
    per_user = [(m - 1) / f for m, f in zip(made, finish) if f > 0]
    return {
        "load": load,
        "policy": policy,
        "total_tokens_per_s": total / clock if clock > 0 else None,
        "per_user_tokens_per_s": float(np.mean(per_user)) if per_user else None,
        "tau": (accepted_total + committed_rounds) / committed_rounds if committed_rounds else None,
        "rounds": rounds,
        "mean_width": float(np.mean(widths)) if widths else None,
        "verify_tokens_per_round": float(np.mean(tokens)) if tokens else None,
        "decode_s": clock,
    }


def predict(
    traces: dict[int, list[list[TraceRound]]],
    profile: SPSProfile,
    loads: list[int],
    policies: list[str],
    **kw,
) -> list[dict]:
    """Every (load, policy) cell; a load without its own traces uses all traces pooled."""
    pooled = [s for streams in traces.values() for s in streams]
    out = []
    gates: dict[str, DraftGate | None] = {}  # one per policy, carried across loads in order
    gamma = len(pooled[0][0].survival) if pooled else 0
    intervals = {k: kw[k] for k in ("probe_interval", "max_probe_interval") if k in kw}
    for load in loads:
        streams = traces.get(load) or pooled
        for policy in policies:
            if policy not in gates:
                gates[policy] = new_gate(policy, profile, gamma, **intervals)
            out.append(simulate(streams, load, policy, profile, gate=gates[policy], **kw))
    return out


def compare(predicted: list[dict], measured: dict) -> dict:
    """Prediction error against a load sweep's results.json (same traces, same device)."""
    rows: list[dict] = []
    errs: dict[str, list[float]] = {"total": [], "per_user": []}
    for p in predicted:
        m = measured["cells"].get(f"{p['load']}/{p['policy']}")
        if m is None:
            continue
        row = {"load": p["load"], "policy": p["policy"]}
        for key, name in (("total_tokens_per_s", "total"), ("per_user_tokens_per_s", "per_user")):
            pv, mv = p[key], m[key]
            row[f"{name}_predicted"], row[f"{name}_measured"] = pv, mv
            err = pv / mv - 1 if pv and mv else None
            row[f"{name}_error"] = err
            if err is not None:
                errs[name].append(abs(err))
        rows.append(row)
    summary = {f"mean_abs_error_{k}": float(np.mean(v)) if v else None for k, v in errs.items()} | {
        f"max_abs_error_{k}": float(np.max(v)) if v else None for k, v in errs.items()
    }
    return {"rows": rows, **summary}


def render_markdown(res: dict) -> str:
    c = res["conditions"]
    f = lambda x, d=1: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    pct = lambda x: "n/a" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
    lines = [
        "# Simulated load sweep",
        "",
        "Conditions: " + ", ".join(f"{k} `{v}`" for k, v in c.items()) + ".",
        "",
        "| load | policy | total tok/s | per-user tok/s | tau | mean width | verify tok/round |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in res["predicted"]:
        lines.append(
            f"| {p['load']} | {p['policy']} | {f(p['total_tokens_per_s'])} | "
            f"{f(p['per_user_tokens_per_s'], 2)} | {f(p['tau'], 2)} | {f(p['mean_width'], 2)} | "
            f"{f(p['verify_tokens_per_round'])} |"
        )
    cmp = res.get("comparison")
    if cmp:
        lines += [
            "",
            "## Predicted vs measured (same traces, same device)",
            "",
            f"Mean |error|: total {100 * (cmp['mean_abs_error_total'] or 0):.1f}%, per user "
            f"{100 * (cmp['mean_abs_error_per_user'] or 0):.1f}% (max "
            f"{100 * (cmp['max_abs_error_total'] or 0):.1f}% / "
            f"{100 * (cmp['max_abs_error_per_user'] or 0):.1f}%).",
            "",
            "| load | policy | total pred | total meas | error | per-user pred | per-user meas | "
            "error |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in cmp["rows"]:
            lines.append(
                f"| {r['load']} | {r['policy']} | {f(r['total_predicted'])} | "
                f"{f(r['total_measured'])} | {pct(r['total_error'])} | "
                f"{f(r['per_user_predicted'], 2)} | {f(r['per_user_measured'], 2)} | "
                f"{pct(r['per_user_error'])} |"
            )
    return "\n".join(lines) + "\n"
