"""Cost model: expected tokens and the best verify length by hand; the measurement runs on the
decoder's own parts for every verify length and draft size."""

import pytest

from dspark.bench.cost_model import best_verify_length, expected_tokens, measure_costs


def test_expected_tokens_by_hand():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.9, 0.1, 1.0], 3) == pytest.approx(1 + 0.9 + 0.09 + 0.09)


def test_best_verify_length_trades_tokens_for_cost():
    # AR step 10 ms; drafting 5 ms; verifying n tokens costs 10 + 4 * (n - 1) ms.
    costs = {
        "t_ar": 10.0,
        "t_draft": {2: 5.0},
        "t_verify": {n: 10.0 + 4 * (n - 1) for n in range(1, 6)},
    }
    accept = [0.8, 0.5, 0.1, 0.1]
    best = best_verify_length(costs, accept, 2)
    by_hand = {L: expected_tokens(accept, L) * 10 / (5 + 10 + 4 * L) for L in range(1, 5)}
    assert best["L"] == max(by_hand, key=by_hand.get) == 2
    assert best["speedup"] == pytest.approx(by_hand[2])


def test_measure_costs_on_a_tiny_target(tiny_target):
    target, _ = tiny_target("llama")
    c = measure_costs(
        target, draft_layers=(1, 2), block_size=3, markov_rank=8, context_len=32, repeats=2
    )
    assert set(c["t_verify"]) == {1, 2, 3, 4} and set(c["t_draft"]) == {1, 2}
    assert c["t_ar"] > 0 and all(t > 0 for t in c["t_verify"].values())
    assert c["conditions"]["block_size"] == 3 and c["conditions"]["batch"] == 1


def test_accept_from_a_draft_without_a_run_is_one_error_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run(
        [sys.executable, "eval/cost_model.py", "--accept-from", str(tmp_path / "draft")],
        cwd=Path(__file__).resolve().parents[1], env=dict(os.environ), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"cost_model: error: --accept-from: no results.json with final_eval "
        f"eval/greedy_accept@k in {tmp_path / 'draft'} or its parent (a training run's draft "
        "has one); pass --accept P1 P2 ... instead"
    ]
