"""llama.cpp flag choice from a fitted round cost and recorded confidences, against by-hand
figures (dspark/bench/llama_cpp_flags.py)."""

import math

import numpy as np
import pytest

from dspark.bench import llama_cpp_flags as F

NAN = math.nan


def _rows(cost: F.RoundCost, modes):
    """Synthetic llama.cpp runs: (n_max, rounds, drafted) -> decode_ms the cost model gives."""
    return [
        {
            "n_max": n,
            "rounds": r,
            "drafted": d,
            "decode_ms": r * (cost.plain_step_ms + cost.base_ms + cost.per_slot_ms * n)
            + cost.per_draft_ms * d,
        }  # fmt: skip
        for n, r, d in modes
    ]


def test_fit_recovers_the_coefficients_that_made_the_runs():
    truth = F.RoundCost(13.5, 9.0, 2.5, 0.75)
    rows = _rows(truth, [(1, 800, 700), (6, 700, 4000), (6, 900, 60), (3, 750, 2000)])
    fit = F.fit_round_cost(rows, 13.5)
    for a, b in zip(fit.as_dict().values(), truth.as_dict().values(), strict=True):
        assert a == pytest.approx(b, rel=1e-9)


def test_fit_never_returns_a_negative_cost():
    # runs where drafting more looks cheaper (noise): the verify term is fixed at 0, not < 0
    rows = [
        {"n_max": 1, "rounds": 100, "drafted": 100, "decode_ms": 100 * 20.0},
        {"n_max": 1, "rounds": 100, "drafted": 10, "decode_ms": 100 * 20.5},
        {"n_max": 4, "rounds": 100, "drafted": 400, "decode_ms": 100 * 26.0},
    ]
    fit = F.fit_round_cost(rows, 10.0)
    assert fit.per_draft_ms == 0.0
    assert min(fit.base_ms, fit.per_slot_ms) >= 0.0
    # with the verify term gone, base + per_slot * n fits rounds' 10.25 / 16 ms by hand
    assert fit.base_ms + fit.per_slot_ms == pytest.approx(10.25, abs=0.2)


def test_drafted_slots_stop_at_the_first_low_confidence_and_at_nan():
    conf = np.array([[0.9, 0.2, 0.9], [0.6, 0.7, NAN], [0.1, 0.9, 0.9]])
    assert F.drafted_slots(conf, 3, 0.5).tolist() == [1, 2, 0]
    assert F.drafted_slots(conf, 3, 0.0).tolist() == [3, 2, 3]  # p_min 0: only the record ends
    assert F.drafted_slots(conf, 1, 0.0).tolist() == [1, 1, 1]


def test_predict_by_hand():
    cost = F.RoundCost(10.0, 4.0, 1.0, 0.5)
    conf = np.array([[0.8, 0.5], [0.3, 0.9]])
    surv = F.calibrated_survival(conf, None)  # uncalibrated: the cumulative product
    np.testing.assert_allclose(surv, [[0.8, 0.4], [0.3, 0.27]])
    p = F.predict(cost, conf, surv, 2, 0.4)
    # round 1 drafts 2 (0.8, 0.5 >= 0.4): 1 + 0.8 + 0.4 tokens, 10 + 4 + 2 + 1 ms
    # round 2 drafts 0 (0.3 < 0.4): 1 token, 10 + 4 + 2 ms
    assert p["tau"] == pytest.approx((2.2 + 1.0) / 2)
    assert p["round_ms"] == pytest.approx((17.0 + 16.0) / 2)
    assert p["tokens_per_s"] == pytest.approx(1e3 * 3.2 / 33.0)
    assert p["drafted_per_round"] == pytest.approx(1.0)


def test_sts_temperatures_change_the_survival():
    conf = np.array([[0.8, 0.5]])
    z = math.log(0.8 / 0.2)
    s = F.calibrated_survival(conf, [2.0, 1.0])
    assert s[0, 0] == pytest.approx(1 / (1 + math.exp(-z / 2)))
    assert s[0, 1] == pytest.approx(s[0, 0] * 0.5)


def test_choice_prefers_short_blocks_when_a_slot_is_expensive_and_long_when_cheap():
    conf = np.array([[0.9, 0.9, 0.9, 0.9]] * 4 + [[0.2, 0.2, 0.2, 0.2]] * 4)
    surv = F.calibrated_survival(conf, None)
    dear = F.RoundCost(10.0, 1.0, 6.0, 0.0)  # every computed slot costs 0.6 plain steps
    cheap = F.RoundCost(10.0, 1.0, 0.1, 3.0)  # slots cheap, each verified draft dear
    best_dear, table = F.choose_flags(dear, conf, surv, 4)
    best_cheap, _ = F.choose_flags(cheap, conf, surv, 4)
    assert best_dear == max(table, key=lambda r: r["tokens_per_s"])
    assert len(table) == 4 * len(F.P_MIN_CHOICES)
    assert best_dear["n_max"] < best_cheap["n_max"]
    assert best_cheap["n_max"] == 4
    # the confident half drafts, the doubtful half does not: a cut between 0.2 and 0.9 wins
    assert 0.2 < best_cheap["p_min"] <= 0.9
    assert F.needed_tau(dear, 1, 1) == pytest.approx(1.7)


def _simulated_engine(truth: F.RoundCost, conf, surv):
    """`run_modes` of an engine whose rounds cost `truth` and accept with survival `surv`."""
    from dspark.bench.llama_cpp import Completion, ModeRun

    def fake_run_modes(settings, modes, prompts, max_new_tokens, progress=print):
        out = {"set": {}}
        for m in modes:
            if m.spec == "none":
                out["set"][m.name] = ModeRun(m, [Completion("x", 100, 100 * truth.plain_step_ms)])
                continue
            d = F.drafted_slots(conf, m.n_max, m.p_min)
            rounds = 600  # 100 passes over the 6 recorded rounds
            drafted = int(d.sum()) * 100
            ms = sum(truth.round_ms(m.n_max, x) for x in d) * 100
            accepted = int(round(100 * sum(surv[i, : d[i]].sum() for i in range(len(d)))))
            c = Completion("x", rounds + accepted, ms, drafted, accepted)
            out["set"][m.name] = ModeRun(m, [c])
        return out

    return fake_run_modes


def test_tune_by_model_fits_the_simulated_engine_and_takes_its_choice(monkeypatch):
    """`tune(how="model")` on an engine simulated from a known cost and known confidences: the
    fitted cost is that cost, and the chosen mode is the by-hand best of `choose_flags`."""
    from dspark.bench import llama_cpp_tune as tu

    truth = F.RoundCost(12.0, 8.0, 2.0, 1.0)
    conf = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]] * 3 + [[0.3, 0.2, 0.2, 0.2, 0.2, 0.2]] * 3)
    surv = F.calibrated_survival(conf, None)
    monkeypatch.setattr(tu, "run_modes", _simulated_engine(truth, conf, surv))
    rounds = {"conf": conf, "survival": surv, "count": 6, "calibrated": False, "decoder": "x"}
    chosen, info = tu.tune(None, 7, True, {"set": [[1]]}, 16, print, how="model", rounds=rounds)
    assert len(info["grid"]) == 4  # the probe, not the grid
    # the engine accepts what the recorded rounds say: no shift
    assert info["acceptance_shift"]["logits"] == pytest.approx(0.0, abs=0.01)
    for k, v in truth.as_dict().items():
        assert info["cost"][k] == pytest.approx(v, rel=1e-6), k
    best, _ = F.choose_flags(truth, conf, surv, 6)
    assert (chosen.n_max, chosen.p_min) == (best["n_max"], best["p_min"])
    # the probe's predictions reproduce what the simulated engine measured
    for g in info["grid"]:
        assert g["predicted"]["tokens_per_s"] == pytest.approx(g["tokens_per_s"], rel=1e-3)


def test_shift_survival_moves_each_slot_by_the_same_logits_by_hand():
    conf = np.array([[0.8, 0.5, NAN]])
    surv = F.calibrated_survival(conf, None)  # 0.8, 0.4, NaN
    moved = F.shift_survival(surv, math.log(0.25))  # odds x 1/4: 0.8 -> 0.5, 0.5 -> 0.2
    assert moved[0, 0] == pytest.approx(0.5)
    assert moved[0, 1] == pytest.approx(0.5 * 0.2)
    assert math.isnan(moved[0, 2])
    assert F.shift_survival(surv, 0.0)[0, :2] == pytest.approx(surv[0, :2])


def test_tune_moves_the_acceptance_to_what_the_engine_accepted(monkeypatch):
    """An engine that accepts less than the bundled decoder's rounds say (every slot's odds
    divided by e^1.5, as a quantized target does): the fit finds that shift, and the choice is
    the by-hand best under the engine's own acceptance, not the one the rounds alone give."""
    from dspark.bench import llama_cpp_tune as tu

    truth = F.RoundCost(10.0, 1.0, 1.0, 2.0)
    conf = np.array([[0.95, 0.9, 0.9, 0.9, 0.9, 0.9]] * 6)
    recorded = F.calibrated_survival(conf, None)
    engine = F.shift_survival(recorded, -1.5)
    monkeypatch.setattr(tu, "run_modes", _simulated_engine(truth, conf, engine))
    rounds = {"conf": conf, "survival": recorded, "count": 6, "calibrated": False,
              "decoder": "x"}  # fmt: skip
    chosen, info = tu.tune(None, 7, True, {"set": [[1]]}, 16, print, how="model", rounds=rounds)
    sh = info["acceptance_shift"]
    assert sh["logits"] == pytest.approx(-1.5, abs=0.02)
    assert sh["tau_bundled"] > sh["tau_llama_cpp"]
    right, _ = F.choose_flags(truth, conf, engine, 6)
    naive, _ = F.choose_flags(truth, conf, recorded, 6)
    assert (chosen.n_max, chosen.p_min) == (right["n_max"], right["p_min"])
    assert naive["n_max"] > right["n_max"]  # the rounds alone would draft longer
    for g in info["grid"]:
        assert g["predicted"]["tau"] == pytest.approx(g["tau"], rel=0.01)


def test_the_report_says_how_far_llama_cpp_accepted_from_the_recorded_rounds():
    from dspark.bench.llama_cpp_report import cost_model_lines

    pick = {
        "n_max": 1,
        "p_min": 0.2,
        "tokens_per_s": 126.7,
        "tau": 1.4,
        "plain_tokens_per_s": 131.6,
    }
    tuning = {
        "cost": F.RoundCost(7.6, 1.64, 1.4, 0.0).as_dict(),
        "model_choice": pick,
        "how": "model",
        "rounds": {"count": 201, "decoder": "bundled", "calibrated": False},
        "acceptance_shift": {"logits": -0.83, "tau_bundled": 1.82, "tau_llama_cpp": 1.49},
    }
    text = "\n".join(cost_model_lines(tuning))
    assert "moved by -0.83 logits" in text
    assert "their tau 1.49" in text and "predict 1.82" in text
    assert "tau >= 1.40" in text  # (7.6 + 1.64 + 1.4) / 7.6, no verify curve, per draft 0
    del tuning["acceptance_shift"]
    assert "uncalibrated confidence)." in "\n".join(cost_model_lines(tuning))
