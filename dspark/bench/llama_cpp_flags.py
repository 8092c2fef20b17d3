"""llama.cpp's `draft-dspark` flags (`--spec-draft-n-max`, `--spec-draft-p-min`) chosen from a
cost curve measured in llama.cpp and the draft's calibrated confidence. Pure functions.

Cost model. A plain llama.cpp decode step costs `s` ms. A `draft-dspark` round costs
`s + base + per_slot * n_max + per_draft * drafted`:
- `base`: the draft's fixed work per round (it takes in the accepted tokens' target features,
  sets up its graph) whatever it drafts;
- `per_slot`: its block over the `n_max` slots it always computes (backbone, lm_head and
  confidence per slot), even where `p_min` then keeps fewer;
- `per_draft`: the target's verify work per drafted token beyond its one-token step.
llama.cpp reports per mode its decode time, tokens, drafted and accepted counts, so every
measured mode is one equation `rounds * (s + base + per_slot * n_max) + per_draft * drafted =
decode ms`; `fit_round_cost` solves them (least squares, non-negative).

Acceptance model. Rounds recorded by the bundled decoder on held-out prompts (full-block
verification, RAW confidences `c [R, gamma]`, NaN where unrecorded): llama.cpp drafts the
leading slots k <= n_max with `c_k >= p_min` (it stops at the first below, comparing the raw
sigmoid), and each drafted slot k is accepted with the STS-calibrated survival
`S_k = prod_{i<=k} sigmoid(z_i / T_i)` (T the draft's `confidence_temperatures`, 1 when
uncalibrated). A round yields `1 + sum_{k<=drafted} S_k` tokens (the bonus counted), so
`predicted tok/s = sum tokens / sum round ms`. llama.cpp's target is not the bundled decoder's
(quantized weights and activations) and it reads the draft's export, so it accepts less or
more than those rounds say: `fit_acceptance_shift` moves every slot's acceptance by one logit
shift `b`, `S_k = prod_{i<=k} sigmoid(logit(s_i) + b)`, fitted so the measured modes' accepted
drafts are what llama.cpp counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

P_MIN_CHOICES = tuple(round(0.1 * i, 1) for i in range(10))  # 0 (off), 0.1 .. 0.9


@dataclass(frozen=True)
class RoundCost:
    plain_step_ms: float
    base_ms: float
    per_slot_ms: float
    per_draft_ms: float
    # measured target passes `{n tokens: ms}` (llama_cpp_curve.py): where given, a round's
    # verify work beyond its one-token step is `V(1 + drafted) - V(1)` (interpolated), in
    # place of `per_draft_ms * drafted`
    verify_ms: dict[int, float] | None = None

    def extra_verify_ms(self, drafted: float) -> float:
        if not self.verify_ms:
            return self.per_draft_ms * drafted
        ns = sorted(self.verify_ms)
        v = np.interp(1 + drafted, ns, [self.verify_ms[n] for n in ns])
        return float(v - np.interp(1, ns, [self.verify_ms[n] for n in ns]))

    def round_ms(self, n_max: float, drafted: float) -> float:
        return (
            self.plain_step_ms
            + self.base_ms
            + self.per_slot_ms * n_max
            + self.extra_verify_ms(drafted)
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        if d["verify_ms"] is None:  # priced linearly: the three fitted coefficients say it all
            del d["verify_ms"]
        return d


def fit_round_cost(
    rows: list[dict], plain_step_ms: float, verify_ms: dict[int, float] | None = None
) -> RoundCost:
    """`rows`: measured draft-dspark modes, each with `n_max`, `rounds`, `drafted` and
    `decode_ms` (over all its requests). Non-negative least squares on the three unknowns
    (an active set: a coefficient the unconstrained fit makes negative is fixed at 0). With a
    measured verify curve `verify_ms`, its part is taken off each row and only the draft's
    work (`base`, `per_slot`) is fitted: each row's drafts spread evenly over its rounds."""
    if not rows:
        raise ValueError("fitting llama.cpp's round cost needs at least one measured draft mode")
    a = np.array([[r["rounds"], r["rounds"] * r["n_max"], r["drafted"]] for r in rows], float)
    b = np.array([r["decode_ms"] - r["rounds"] * plain_step_ms for r in rows], float)
    free = [0, 1, 2]
    if verify_ms:
        curve = RoundCost(plain_step_ms, 0.0, 0.0, 0.0, dict(verify_ms))
        b -= np.array(
            [r["rounds"] * curve.extra_verify_ms(r["drafted"] / max(r["rounds"], 1)) for r in rows]
        )
        free = [0, 1]
    coef = np.zeros(3)
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[free] = sol
            break
        free.pop(int(np.argmin(sol)))  # the most negative leaves the fit
    base, per_slot, per_draft = (float(x) for x in coef)
    return RoundCost(float(plain_step_ms), base, per_slot, per_draft,
                     verify_ms=dict(verify_ms) if verify_ms else None)  # fmt: skip


def calibrated_survival(conf: np.ndarray, temperatures) -> np.ndarray:
    """`[R, gamma]` survival `prod_{i<=k} sigmoid(logit(c_i) / T_i)`; NaN stays NaN."""
    c = np.clip(np.asarray(conf, float), 1e-6, 1 - 1e-6)
    z = np.log(c) - np.log1p(-c)
    t = (
        np.ones(c.shape[1])
        if temperatures is None
        else np.asarray(temperatures, float)[: c.shape[1]]
    )
    return np.cumprod(1.0 / (1.0 + np.exp(-z / t)), axis=1)


def drafted_slots(conf: np.ndarray, n_max: int, p_min: float) -> np.ndarray:
    """`[R]` slots llama.cpp keeps per round: leading k <= n_max with c_k >= p_min (and
    recorded: a NaN ends the round's record, as at the end of a generation)."""
    c = np.asarray(conf, float)[:, :n_max]
    keep = ~np.isnan(c) & (c >= p_min if p_min > 0 else True)
    return np.cumprod(keep, axis=1).sum(axis=1)


def shift_survival(survival: np.ndarray, shift: float) -> np.ndarray:
    """`[R, gamma]` survival with each slot's acceptance given the slots before it accepted,
    `s_k = S_k / S_{k-1}`, moved by `shift` logits; NaN stays NaN."""
    s = np.asarray(survival, float)
    prev = np.concatenate([np.ones((s.shape[0], 1)), s[:, :-1]], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.clip(s / prev, 1e-6, 1 - 1e-6)
    z = np.log(p) - np.log1p(-p) + shift
    return np.cumprod(1.0 / (1.0 + np.exp(-z)), axis=1)


def round_tokens(conf: np.ndarray, survival: np.ndarray, n_max: int, p_min: float):
    """`[R]` drafted slots and expected tokens (the bonus counted) of `(n_max, p_min)` rounds."""
    d = drafted_slots(conf, n_max, p_min)
    surv = np.nan_to_num(np.asarray(survival, float)[:, :n_max])
    upto = np.arange(1, surv.shape[1] + 1)[None, :] <= d[:, None]
    return d, 1.0 + (surv * upto).sum(axis=1)


def modes_tau(measured: list[dict], conf=None, survival=None) -> float:
    """tau over `measured` modes (each `n_max`, `p_min`, `tau`, `rounds`), weighted by their
    rounds: as measured, or with `conf` and `survival` as the recorded rounds predict it
    (each mode's prediction the mean over those rounds)."""
    rounds = sum(m["rounds"] for m in measured) or 1
    if survival is None:
        return sum(m["rounds"] * m["tau"] for m in measured) / rounds
    return (
        sum(
            m["rounds"] * float(round_tokens(conf, survival, m["n_max"], m["p_min"])[1].mean())
            for m in measured
        )
        / rounds
    )


def fit_acceptance_shift(conf, survival, measured: list[dict], bound: float = 6.0) -> float:
    """The logit shift `b` (within +-`bound`) under which the recorded rounds predict the
    accepted drafts llama.cpp counted over `measured` modes: `modes_tau` predicted = measured.
    Predicted acceptance rises with `b`, so bisection finds it."""
    want = modes_tau(measured)

    def predicted(b: float) -> float:
        return modes_tau(measured, conf, shift_survival(survival, b))

    lo, hi = -bound, bound
    if predicted(lo) >= want:
        return lo
    if predicted(hi) <= want:
        return hi
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if predicted(mid) < want else (lo, mid)
    return 0.5 * (lo + hi)


def predict(cost: RoundCost, conf: np.ndarray, survival: np.ndarray, n_max: int, p_min: float):
    """Predicted tau, ms per round and tok/s of `(n_max, p_min)` over the recorded rounds."""
    d, tokens = round_tokens(conf, survival, n_max, p_min)
    ms = np.array([cost.round_ms(n_max, x) for x in d])
    return {
        "n_max": int(n_max),
        "p_min": float(p_min),
        "tau": float(tokens.mean()),
        "drafted_per_round": float(d.mean()),
        "round_ms": float(ms.mean()),
        "tokens_per_s": float(1e3 * tokens.sum() / ms.sum()),
        "plain_tokens_per_s": 1e3 / cost.plain_step_ms,
    }


def choose_flags(cost: RoundCost, conf, survival, max_n: int, p_grid=P_MIN_CHOICES):
    """The `(n_max, p_min)` of the highest predicted tok/s over n_max 1..max_n x `p_grid`, and
    every prediction. When none beats plain decoding the best one is still returned: callers
    compare `tokens_per_s` with `plain_tokens_per_s`."""
    table = [predict(cost, conf, survival, n, p) for n in range(1, max_n + 1) for p in p_grid]
    return max(table, key=lambda r: r["tokens_per_s"]), table


def needed_tau(cost: RoundCost, n_max: int, drafted: float) -> float:
    """The tau a round of `n_max` slots and `drafted` kept drafts must reach to break even."""
    return cost.round_ms(n_max, drafted) / cost.plain_step_ms
