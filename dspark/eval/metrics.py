"""Acceptance and speed metrics from the decoder's per-round record (`GenerationOutput`).

Parallels `dspark/calibration/metrics.py`, the calibration metrics of the same rounds'
confidences.

Conventions (paper section 6, block size gamma):
- a round verifies `v` drafts and accepts the first `a <= v` of them, then commits `a + 1`
  tokens (the correction or bonus token); `tau = mean(a + 1)` over all rounds of all
  requests (round-pooled), `tau_no_bonus = mean(a)`;
- position k (1-based) is a trial when it was verified (`v >= k`) and every draft before it
  was accepted (`a >= k - 1`); conditional acceptance `P(accept k | k-1 accepted)` =
  rounds with `a >= k` / trials at k; survival `P(first k all accepted)` is the product of the
  conditionals up to k, which equals `#(a >= k) / #rounds` when every round verifies the full
  block, and stays an estimate of the draft's own survival when a confidence threshold
  shortens verification (`realised_survival` is the plain `#(a >= k) / #rounds`);
- verify rate = mean drafts verified per round / block size.
"""

from __future__ import annotations

import math


def _flat(per_request: list[list[int]]) -> list[int]:
    return [int(x) for rounds in per_request for x in rounds]


def acceptance_stats(accept_lengths, verify_lengths, block_size: int) -> dict:
    """Tau, per-position conditional acceptance and survival, verify rate, counts."""
    acc, ver = _flat(accept_lengths), _flat(verify_lengths)
    if len(acc) != len(ver):
        raise ValueError(f"{len(acc)} accept lengths but {len(ver)} verify lengths")
    bad = [(a, v) for a, v in zip(acc, ver) if not 0 <= a <= v <= block_size]
    if bad:
        raise ValueError(
            f"rounds with impossible (accepted, verified) {bad[:5]} for block {block_size}"
        )
    rounds = len(acc)
    conditional, survival, realised, trials = [], [], [], []
    running: float | None = 1.0
    for k in range(1, block_size + 1):
        n = sum(1 for a, v in zip(acc, ver) if v >= k and a >= k - 1)
        hits = sum(1 for a in acc if a >= k)
        cond = hits / n if n else None
        running = running * cond if (cond is not None and running is not None) else None
        conditional.append(cond)
        survival.append(running)
        realised.append(hits / rounds if rounds else None)
        trials.append(n)
    return {
        "rounds": rounds,
        "tau": (sum(acc) + rounds) / rounds if rounds else None,
        "tau_no_bonus": sum(acc) / rounds if rounds else None,
        "conditional_acceptance": conditional,
        "survival": survival,
        "realised_survival": realised,
        "trials_per_position": trials,
        "verify_rate": sum(ver) / (rounds * block_size) if rounds else None,
        "drafted": rounds * block_size,
        "verified": sum(ver),
        "accepted": sum(acc),
        "block_size": block_size,
    }


def throughput(tokens: int, seconds: float) -> dict:
    return {
        "tokens": int(tokens),
        "seconds": float(seconds),
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
    }


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0 or math.isnan(den):
        return None
    return num / den
