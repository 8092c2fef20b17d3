"""ECE / AUROC / Brier against independent computations; STS fixes a miscalibrated head."""

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from dspark.calibration import metrics as cal


def _ece_loop(p, y, n_bins):
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        sel = [(pi, yi) for pi, yi in zip(p, y) if lo <= pi < hi or (b == n_bins - 1 and pi == 1.0)]
        if sel:
            total += (
                len(sel) / len(p) * abs(np.mean([s[0] for s in sel]) - np.mean([s[1] for s in sel]))
            )
    return total


def test_ece_by_hand():
    p, y = [0.1, 0.12, 0.9, 0.95], [0, 1, 1, 1]
    # bins (20): {0.1, 0.12} -> |0.11 - 0.5| * 2/4; {0.9} -> 0.1/4; {0.95} -> 0.05/4
    assert cal.ece(p, y, 20) == pytest.approx(0.195 + 0.025 + 0.0125)


def test_ece_brier_match_loops_on_random_data():
    rng = np.random.default_rng(0)
    p = rng.random(500)
    p[:5] = [0.0, 1.0, 0.05, 0.5, 0.999]
    y = (rng.random(500) < p**2).astype(float)
    assert cal.ece(p, y, 20) == pytest.approx(_ece_loop(p, y, 20))
    assert cal.brier(p, y) == pytest.approx(sum((a - b) ** 2 for a, b in zip(p, y)) / len(p))
    bins = cal.reliability_bins(p, y, 20)
    assert sum(b["count"] for b in bins) == 500


def test_auroc_matches_pairs_and_scipy_with_ties():
    rng = np.random.default_rng(1)
    y = rng.random(300) < 0.4
    p = np.round(np.clip(0.3 * y + rng.normal(0.4, 0.2, 300), 0, 1), 1)  # many ties
    pos, neg = p[y], p[~y]
    pairs = np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])
    assert cal.auroc(p, y) == pytest.approx(pairs)
    u = mannwhitneyu(pos, neg).statistic
    assert cal.auroc(p, y) == pytest.approx(u / (len(pos) * len(neg)))
    assert cal.auroc([0.2, 0.8], [1, 1]) is None


def test_round_matrices_and_views():
    conf = [[[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]], [[0.9, 0.3]]]
    acc, ver = [[2, 0], [1]], [[3, 3], [2]]
    c, a, v = cal.round_matrices(conf, acc, ver, block_size=3)
    assert c.shape == (3, 3) and np.isnan(c[2, 2])
    assert v.tolist() == [[True] * 3, [True] * 3, [True, True, False]]
    assert a.tolist() == [[True, True, False], [False] * 3, [True, False, False]]
    p, y, k = cal.conditional_view(c, a, v)
    # round 1: k=1,2,3 (k=3 reached after 2 accepts); round 2: k=1; round 3: k=1,2
    assert k.tolist() == [1, 2, 3, 1, 1, 2]
    assert p.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.9, 0.3])
    assert y.tolist() == [1, 1, 0, 0, 1, 0]
    sp, sy, sk = cal.survival_view(c, a, v)
    assert sk.tolist() == [1, 2, 3, 1, 2, 3, 1, 2]
    assert sp[:3].tolist() == pytest.approx([0.9, 0.72, 0.504])
    assert sy.tolist() == [1, 1, 0, 0, 0, 0, 1, 0]


def _synthetic(n, gamma, overconfidence, rng):
    """Rounds whose true conditional acceptance is sigmoid(z0); the head reports z0 * factor."""
    z0 = rng.normal(0.8, 1.2, size=(n, gamma))
    true = 1 / (1 + np.exp(-z0))
    ok = rng.random((n, gamma)) < true
    accepted = np.cumprod(ok, axis=1).astype(bool)  # prefix acceptance
    verified = np.ones((n, gamma), dtype=bool)
    return z0 * overconfidence, accepted, verified


def test_sts_lowers_ece_on_held_out_data():
    rng = np.random.default_rng(0)
    z_fit, a_fit, v_fit = _synthetic(4000, 4, 3.0, rng)
    z_test, a_test, v_test = _synthetic(4000, 4, 3.0, rng)
    temps = cal.sequential_temperature_scaling(z_fit, a_fit, v_fit, n_bins=20)
    assert len(temps) == 4
    assert all(1.5 < t < 6.0 for t in temps)  # undoes the x3 over-confidence
    raw = cal.survival_probs(1 / (1 + np.exp(-z_test)))
    scaled = cal.apply_temperatures(z_test, temps)
    before = cal.ece(raw[v_test], a_test[v_test])
    after = cal.ece(scaled[v_test], a_test[v_test])
    assert after < 0.5 * before
    assert after < 0.03


def test_sts_is_identity_on_calibrated_data_and_skips_empty_positions():
    rng = np.random.default_rng(2)
    z, a, v = _synthetic(6000, 2, 1.0, rng)
    v[:, 1] = False  # no data at k=2
    temps = cal.sequential_temperature_scaling(z, a, v)
    assert 0.8 < temps[0] < 1.25
    assert temps[1] == 1.0


def test_to_logits_inverts_sigmoid():
    c = np.array([0.1, 0.5, 0.9])
    assert (1 / (1 + np.exp(-cal.to_logits(c)))) == pytest.approx(c)
