"""Which dtype and how many drafts to verify, decided from a measured profile (pure math).

A profile is what `dspark.dtype_probe` measured on one device for one target at one batch B,
per candidate dtype (seconds, medians):
    {"float32": {"t_ar": s, "t_verify": {n: s, ...}, "t_draft": s | None}, "bfloat16": {...}}
- `t_ar`: one plain AR step of B rows (1 token each);
- `t_verify[n]`: one target pass of B rows x n tokens with the tapped features (a speculative
  round's verify of n - 1 drafts plus the anchor; for feature capture, a forward of n tokens),
  non-decreasing in n (the probe fits the measured medians, `t_verify_measured`, with
  `nondecreasing_fit`);
- `t_draft`: one draft round (`propose`) of B rows, None without a draft;
- `t_draft_steps[L]` (optional): a draft round that drafts only the L tokens a round verifying
  L drafts needs (the decoder's full-block policy stops the Markov loop there).
Keys of `t_verify` / `t_draft_steps` may be strings (a profile read back from JSON).

Decisions, each the argmin of a job's cost per committed token:
- `plain` (benchmark baseline, regeneration): `t_ar`;
- `speculative`: min over L of `(t_draft(L) + t_verify[L + 1]) / tau(L)`, tau(L) from the
  draft's conditional acceptance per position (`expected_tokens`); without an acceptance
  profile the full block's round cost `t_draft + t_verify[gamma + 1]` (tau is then the same
  in every dtype, so the cheaper round wins);
- `capture`: `t_verify` at its largest n (a batched forward over whole rows).
This module imports nothing from dspark, so every layer (data, eval) may use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

JOBS = ("plain", "speculative", "capture")
CANDIDATES = ("float32", "bfloat16")


def nondecreasing_fit(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing sequence nearest `values` (pool adjacent violators).

    A target pass over more tokens is never cheaper, so a measured verify curve that dips (a
    noisy sample on a shared host) is pooled with its neighbours: each violating run becomes its
    mean, instead of one low sample pricing a whole verify length or dtype too cheaply."""
    blocks: list[list[float]] = []  # [mean, count] of each pooled run, left to right
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [m for m, c in blocks for _ in range(int(c))]


def _curve(p: Mapping) -> dict[int, float]:
    return {int(n): float(t) for n, t in p["t_verify"].items()}


def expected_tokens(accept: Sequence[float], n_verify: int) -> float:
    """tau of a round that verifies `n_verify` drafts: 1 + sum_k prod_{i<=k} accept_i."""
    tau, surv = 1.0, 1.0
    for a in list(accept)[:n_verify]:
        surv *= float(a)
        tau += surv
    return tau


def break_even_tau(t_ar: float, t_draft: float, t_verify: float) -> float:
    """The tau at which speculative decoding breaks even: a round's cost (draft + verify) in
    plain AR steps."""
    return (t_draft + t_verify) / t_ar


def draft_cost(p: Mapping, n_verify: int) -> float:
    """Seconds of a draft round that verifies `n_verify` drafts: `t_draft_steps[L]` where it
    was measured, else the whole block's `t_draft` (0 without a draft)."""
    steps = {int(n): float(t) for n, t in (p.get("t_draft_steps") or {}).items()}
    return steps.get(int(n_verify), float(p.get("t_draft") or 0.0))


def verify_curve(p: Mapping, accept: Sequence[float]) -> list[dict]:
    """Per verify length L = 1..min(len(accept), measured): tau, round seconds, seconds per
    committed token and predicted speedup over this dtype's plain step."""
    curve = _curve(p)
    rows = []
    for L in range(1, len(accept) + 1):
        if L + 1 not in curve:
            break
        tau = expected_tokens(accept, L)
        round_s = draft_cost(p, L) + curve[L + 1]
        rows.append(
            {
                "L": L,
                "tau": tau,
                "round_s": round_s,
                "s_per_token": round_s / tau,
                "speedup": tau * float(p["t_ar"]) / round_s,
                "break_even_tau": round_s / float(p["t_ar"]),
            }
        )
    return rows


def best_verify_length(p: Mapping, accept: Sequence[float]) -> dict:
    """The L with the highest predicted speedup (ties: the shorter L, the cheaper pass), with
    the whole curve under "curve"."""
    rows = verify_curve(p, accept)
    if not rows:
        raise ValueError("the profile has no verify pass of 2+ tokens or accept is empty")
    best = min(rows, key=lambda r: (r["s_per_token"], r["L"]))
    return dict(best) | {"curve": rows}


def job_cost(p: Mapping, job: str, accept: Sequence[float] | None = None, gamma: int = 0) -> dict:
    """Seconds per step of the job in one dtype (lower is faster) and what it came from."""
    if job == "plain":
        return {"cost_s": float(p["t_ar"]), "from": "t_ar"}
    curve = _curve(p)
    if job == "capture":
        n = max(curve)
        return {"cost_s": curve[n], "from": f"t_verify[{n}]"}
    if job != "speculative":
        raise ValueError(f"job={job!r} is not one of {JOBS}")
    if accept:
        best = best_verify_length(p, accept)
        return {"cost_s": best["s_per_token"], "from": "best L", "L": best["L"]}
    n = gamma + 1 if gamma + 1 in curve else max(curve)
    return {
        "cost_s": float(p.get("t_draft") or 0.0) + curve[n],
        "from": f"t_draft + t_verify[{n}] (no acceptance profile: full block)",
    }


def choose_dtype(
    profile: Mapping[str, Mapping],
    job: str,
    accept: Sequence[float] | None = None,
    gamma: int = 0,
) -> dict:
    """The candidate dtype with the lowest job cost: {"dtype", "job", "costs": {dtype: ...}}.
    Ties go to the first candidate in `profile` order."""
    if not profile:
        raise ValueError("an empty profile: measure at least one dtype")
    costs = {d: job_cost(p, job, accept, gamma) for d, p in profile.items()}
    best = min(costs, key=lambda d: costs[d]["cost_s"])
    return {"dtype": best, "job": job, "costs": costs}
