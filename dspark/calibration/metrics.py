"""Calibration of the confidence head: ECE, AUROC, Brier, reliability bins, and STS.

Parallels `dspark/eval/metrics.py`, the benchmark's acceptance and speed metrics of the same
rounds.

Two views of the same confidences (method doc sections 1 and 4):
- conditional: c_k against "draft k accepted", over rounds where drafts 1..k-1 were accepted
  and k was verified (the event c_k is trained to predict);
- survival: a_k = prod_{i<=k} c_i against "drafts 1..k all accepted", over rounds where k was
  verified (what the prefix scheduler ranks slots by).
Sequential Temperature Scaling fits one temperature per position on the survival view.
"""

from __future__ import annotations

import numpy as np

DEFAULT_BINS = 20
_EPS = 1e-7


def _arrays(probs, labels):
    p = np.asarray(probs, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    if p.shape != y.shape:
        raise ValueError(f"{p.size} probabilities but {y.size} labels")
    return p, y


def _bin_index(p: np.ndarray, n_bins: int) -> np.ndarray:
    return np.minimum((p * n_bins).astype(np.int64), n_bins - 1)


def reliability_bins(probs, labels, n_bins: int = DEFAULT_BINS) -> list[dict]:
    """Equal-width bins over [0, 1]: count, mean confidence and accepted fraction per bin."""
    p, y = _arrays(probs, labels)
    idx = _bin_index(p, n_bins)
    out = []
    for b in range(n_bins):
        sel = idx == b
        n = int(sel.sum())
        out.append(
            {
                "lo": b / n_bins,
                "hi": (b + 1) / n_bins,
                "count": n,
                "confidence": float(p[sel].mean()) if n else None,
                "accuracy": float(y[sel].mean()) if n else None,
            }
        )
    return out


def ece(probs, labels, n_bins: int = DEFAULT_BINS) -> float | None:
    """Expected calibration error: sum over equal-width bins of (n_b / N) |mean p - mean y|."""
    p, y = _arrays(probs, labels)
    if p.size == 0:
        return None
    idx = _bin_index(p, n_bins)
    sum_p = np.bincount(idx, weights=p, minlength=n_bins)
    sum_y = np.bincount(idx, weights=y, minlength=n_bins)
    return float(np.abs(sum_p - sum_y).sum() / p.size)


def auroc(probs, labels) -> float | None:
    """Area under the ROC curve by the Mann-Whitney rank formula (ties get average ranks)."""
    p, y = _arrays(probs, labels)
    pos = y > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(p.size, dtype=np.float64)
    sorted_p = p[order]
    i = 0
    while i < p.size:  # average ranks over runs of ties
        j = i
        while j + 1 < p.size and sorted_p[j + 1] == sorted_p[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def brier(probs, labels) -> float | None:
    p, y = _arrays(probs, labels)
    return float(np.mean((p - y) ** 2)) if p.size else None


def summarize(probs, labels, n_bins: int = DEFAULT_BINS) -> dict:
    p, y = _arrays(probs, labels)
    return {
        "n": int(p.size),
        "positive_rate": float(y.mean()) if p.size else None,
        "mean_confidence": float(p.mean()) if p.size else None,
        "ece": ece(p, y, n_bins),
        "auroc": auroc(p, y),
        "brier": brier(p, y),
        "bins": reliability_bins(p, y, n_bins),
    }


def round_matrices(confidences, accept_lengths, verify_lengths, block_size: int):
    """Per-round matrices `[rounds, gamma]` from the decoder's record.

    Returns `(conf, accepted, verified)`: conf holds c_k (NaN where not recorded),
    `accepted[r, k-1] = a_r >= k` (the prefix up to k survived), `verified[r, k-1] = k <= v_r`
    and a confidence exists for k.
    """
    rows_c, rows_a, rows_v = [], [], []
    for req_c, req_a, req_v in zip(confidences, accept_lengths, verify_lengths):
        for c, a, v in zip(req_c, req_a, req_v):
            c = [float(x) for x in (c if c is not None else [])]
            n = min(len(c), int(v), block_size)
            row = np.full(block_size, np.nan)
            row[:n] = c[:n]
            rows_c.append(row)
            rows_a.append(np.arange(1, block_size + 1) <= int(a))
            rows_v.append(np.arange(1, block_size + 1) <= n)
    if not rows_c:
        empty = np.zeros((0, block_size))
        return empty, empty.astype(bool), empty.astype(bool)
    return np.stack(rows_c), np.stack(rows_a), np.stack(rows_v)


def conditional_view(conf, accepted, verified):
    """(c_k, accepted_k, position k) over trials: k verified and drafts before k accepted."""
    prev_ok = np.ones_like(accepted)
    prev_ok[:, 1:] = accepted[:, :-1]
    sel = verified & prev_ok
    pos = np.broadcast_to(np.arange(1, conf.shape[1] + 1), conf.shape)
    return conf[sel], accepted[sel].astype(np.float64), pos[sel]


def survival_probs(conf) -> np.ndarray:
    """a_k = prod_{i<=k} c_i per round (NaN past the last recorded confidence)."""
    return np.cumprod(conf, axis=1)


def survival_view(conf, accepted, verified):
    surv = survival_probs(conf)
    pos = np.broadcast_to(np.arange(1, conf.shape[1] + 1), conf.shape)
    return surv[verified], accepted[verified].astype(np.float64), pos[verified]


def to_logits(conf) -> np.ndarray:
    c = np.clip(np.asarray(conf, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(c) - np.log1p(-c)


def default_grid() -> np.ndarray:
    return np.unique(np.concatenate([np.geomspace(0.05, 20.0, 241), [1.0]]))


def apply_temperatures(logits, temperatures) -> np.ndarray:
    """Survival probabilities prod_{i<=k} sigmoid(z_i / T_i) under per-position temperatures."""
    z = np.asarray(logits, dtype=np.float64)
    t = np.asarray(temperatures, dtype=np.float64)[: z.shape[1]]
    return np.cumprod(1.0 / (1.0 + np.exp(-z[:, : t.size] / t)), axis=1)


def sequential_temperature_scaling(
    logits, accepted, verified, n_bins: int = DEFAULT_BINS, grid=None
) -> list[float]:
    """Sequential Temperature Scaling (method doc section 4).

    For k = 1..gamma in order, grid-search T_k minimising the ECE of the survival
    prod_{i<=k} sigmoid(z_i / T_i) against the prefix-acceptance labels (rounds where k was
    verified), with T_1..T_{k-1} fixed at their fitted values. Positions without data keep 1.
    """
    z = np.asarray(logits, dtype=np.float64)
    acc = np.asarray(accepted, dtype=bool)
    ver = np.asarray(verified, dtype=bool)
    grid = default_grid() if grid is None else np.asarray(grid, dtype=np.float64)
    temps: list[float] = []
    prefix = np.ones(z.shape[0])  # prod_{i<k} sigmoid(z_i / T_i), fitted so far
    for k in range(z.shape[1]):
        sel = ver[:, k]
        zk = np.where(sel, z[:, k], 0.0)
        best_t, best_key = 1.0, None
        if sel.any():
            labels = acc[sel, k]
            for t in grid:
                probs = prefix[sel] / (1.0 + np.exp(-zk[sel] / t))
                err = ece(probs, labels, n_bins)
                assert err is not None  # sel.any(): at least one labelled row
                key = (round(err, 12), abs(np.log(t)))  # ties: nearest 1
                if best_key is None or key < best_key:
                    best_t, best_key = float(t), key
        temps.append(best_t)
        prefix = prefix / (1.0 + np.exp(-zk / best_t))
    return temps


def sts_split_fit(per_request: list[tuple], n_bins: int = DEFAULT_BINS) -> dict | None:
    """Fit STS on even-indexed requests, score survival ECE / Brier on the odd ones.

    `per_request`: one `round_matrices(...)` triple per request (raw confidences). With fewer
    than two requests the fit is scored in-sample (and says so). None without any data.
    """
    if not per_request or not any(m[2].any() for m in per_request):
        return None
    held_out = len(per_request) >= 2

    def stack(sel):
        chosen = [m for i, m in enumerate(per_request) if sel(i)]
        return tuple(np.concatenate([m[j] for m in chosen]) for j in range(3))

    fit = stack(lambda i: i % 2 == 0 or not held_out)
    test = stack(lambda i: i % 2 == 1 or not held_out)
    temps = sequential_temperature_scaling(to_logits(fit[0]), fit[1], fit[2], n_bins)
    conf, acc, ver = test
    raw = survival_probs(conf)[ver]
    scaled = apply_temperatures(to_logits(conf), temps)[ver]
    labels = acc[ver].astype(np.float64)
    return {
        "temperatures": temps,
        "fit_requests": "even-indexed" if held_out else "all (in-sample: < 2 requests)",
        "test_requests": "odd-indexed" if held_out else "all (in-sample)",
        "n_test": int(labels.size),
        "ece_before": ece(raw, labels, n_bins),
        "ece_after": ece(scaled, labels, n_bins),
        "brier_before": brier(raw, labels),
        "brier_after": brier(scaled, labels),
        "auroc_before": auroc(raw, labels),
        "auroc_after": auroc(scaled, labels),
        "bins_before": reliability_bins(raw, labels, n_bins),
        "bins_after": reliability_bins(scaled, labels, n_bins),
    }
