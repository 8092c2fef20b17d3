"""The verify-cost curve from llama-bench, and the flag tuner pricing verification by it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark.bench.llama_cpp_curve import bench_command, parse_curve, relative
from dspark.bench.llama_cpp_flags import RoundCost, choose_flags, fit_round_cost


def test_parse_llama_bench_json():
    out = json.dumps([
        {"n_prompt": 1, "n_gen": 0, "n_depth": 128, "avg_ns": 9_000_000},
        {"n_prompt": 2, "n_gen": 0, "n_depth": 128, "avg_ns": 10_530_000},
        {"n_prompt": 4, "n_gen": 0, "n_depth": 128, "avg_ns": 11_880_000},
        {"n_prompt": 0, "n_gen": 16, "n_depth": 128, "avg_ns": 1},  # a generation test: not ours
    ])  # fmt: skip
    curve = parse_curve(out)
    assert curve == {1: 9.0, 2: 10.53, 4: 11.88}
    assert relative(curve) == {1: 1.0, 2: 1.17, 4: 1.32}
    with pytest.raises(ValueError, match="no prompt-pass"):
        parse_curve("[]")
    cmd = bench_command("lb", "t.gguf", 2, depth=128, max_n=3)
    assert cmd[cmd.index("-p") + 1] == "1,2,3" and cmd[cmd.index("-d") + 1] == "128"


def test_a_curve_prices_verify_work_by_what_was_measured():
    curve = {1: 10.0, 2: 11.0, 3: 14.0, 4: 14.5}  # a 4-row kernel: 4 tokens barely dearer than 3
    cost = RoundCost(10.0, 2.0, 1.0, 99.0, curve)
    assert cost.round_ms(3, 3) == pytest.approx(10 + 2 + 3 + (14.5 - 10))  # per_draft unused
    assert cost.round_ms(3, 1.5) == pytest.approx(10 + 2 + 3 + (12.5 - 10))  # interpolated
    # the fit recovers the draft's own work once the curve's part is taken off
    rows = []
    for n_max, drafted_per_round in ((1, 1.0), (3, 3.0), (3, 2.0)):
        rounds = 100
        ms = rounds * cost.round_ms(n_max, drafted_per_round)
        rows.append({"n_max": n_max, "rounds": rounds, "drafted": rounds * drafted_per_round,
                     "decode_ms": ms})  # fmt: skip
    fit = fit_round_cost(rows, 10.0, curve)
    assert fit.base_ms == pytest.approx(2.0) and fit.per_slot_ms == pytest.approx(1.0)
    assert fit.per_draft_ms == 0.0 and fit.verify_ms == curve


def test_the_tuner_lands_where_the_kernels_are_cheap():
    """Every draft accepted with survival 0.6 per slot: with a linear verify price n_max 1 is
    best; with a curve whose 4-token pass costs little more than 2, n_max 3 wins."""
    R, g = 200, 4
    conf = np.full((R, g), 0.9)
    surv = np.cumprod(np.full((R, g), 0.6), axis=1)
    linear = RoundCost(10.0, 1.0, 0.5, 5.0)
    cheap4 = RoundCost(10.0, 1.0, 0.5, 0.0, {1: 10.0, 2: 15.0, 3: 16.0, 4: 16.5})
    pick_linear, _ = choose_flags(linear, conf, surv, 3, p_grid=(0.0,))
    pick_curve, _ = choose_flags(cheap4, conf, surv, 3, p_grid=(0.0,))
    assert pick_linear["n_max"] == 1 and pick_curve["n_max"] == 3
