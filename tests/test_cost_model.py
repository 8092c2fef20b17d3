"""Cost model: expected tokens and the best verify length by hand; the measurement runs on the
decoder's own parts for every verify length and draft size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ScriptedClock, make_draft

import dspark.timing
from dspark.bench.cost_model import (
    best_verify_length,
    break_even_tau,
    expected_tokens,
    measure_costs,
    measure_draft_costs,
    speedup,
)
from dspark.decoding.round_cost import RoundBench

ROOT = Path(__file__).resolve().parents[1]


def cost_model(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "eval/cost_model.py", *args], cwd=ROOT, env=dict(os.environ),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


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


def test_measure_costs_on_a_tiny_target(tiny_target, monkeypatch):
    """Each figure is the median of its own timed calls, in the order the module doc lists
    them (AR step, verify of n = 1..block + 1 tokens, a draft round per layer count); the
    break-even tau and the speedup follow from them by the module's formulas."""
    target, _ = tiny_target("llama")
    # figure k (0: t_ar, 1-4: t_verify[1..4], 5-6: t_draft[1, 2]) times 3 calls whose median
    # is (k + 1) / 100, the other two calls above and below it
    med = [(k + 1) / 100 for k in range(7)]
    clock = ScriptedClock([d for m in med for d in (m + 0.004, m - 0.003, m)])
    monkeypatch.setattr(dspark.timing, "time", clock)
    c = measure_costs(
        target, draft_layers=(1, 2), block_size=3, markov_rank=8, context_len=32, repeats=3
    )
    assert clock.reads == 2 * 3 * 7  # every figure timed 3 times, nothing else
    assert c["t_ar"] == pytest.approx(med[0])
    assert c["t_verify"] == pytest.approx({n: med[n] for n in (1, 2, 3, 4)})
    assert c["t_draft"] == pytest.approx({1: med[5], 2: med[6]})
    assert c["conditions"]["block_size"] == 3 and c["conditions"]["batch"] == 1
    assert c["conditions"]["repeats"] == 3 and c["conditions"]["context_len"] == 32
    # a 2-layer draft verifying all 3 drafts: (t_draft + t_verify[4]) / t_ar = 0.12 / 0.01
    assert break_even_tau(c["t_ar"], c["t_draft"][2], c["t_verify"][4]) == pytest.approx(12.0)
    # accept 0.5 each: L = 1, 2, 3 commit 1.5, 1.75, 1.875 tokens for 0.07 + t_verify[L + 1]
    # = 0.10, 0.11, 0.12 s: 66.7, 62.9, 64.0 ms a token, so L = 2
    best = best_verify_length(c, [0.5, 0.5, 0.5], 2)
    assert best["L"] == 2 and best["tau"] == pytest.approx(1.75)
    assert best["speedup"] == pytest.approx(1.75 * 0.01 / 0.11)
    assert speedup(1.75, c["t_ar"], c["t_draft"][2], c["t_verify"][3]) == pytest.approx(
        best["speedup"]
    )


def test_a_trained_draft_is_timed_in_its_own_shape(tiny_target, monkeypatch):
    """The draft handed in is the one timed, at its own block size and Markov rank: the target
    passes cover anchor + its 3 drafts, and its 2 layers name its one draft figure."""
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, num_hidden_layers=2, markov_rank=8, block_size=3)
    med = [(k + 1) / 100 for k in range(6)]  # t_ar, t_verify[1..4], t_draft[2]
    clock = ScriptedClock([d for m in med for d in (m + 0.004, m - 0.003, m)])
    monkeypatch.setattr(dspark.timing, "time", clock)
    timed = []
    real = RoundBench.time_draft

    def spy(self, repeats, d=None, warmup=1, steps=None):
        timed.append(d)
        return real(self, repeats, d, warmup, steps)

    monkeypatch.setattr(RoundBench, "time_draft", spy)
    c = measure_draft_costs(target, draft, context_len=32, repeats=3)
    assert clock.reads == 2 * 3 * 6
    assert timed == [draft]
    assert c["t_verify"] == pytest.approx({n: med[n] for n in (1, 2, 3, 4)})
    assert c["t_draft"] == pytest.approx({2: med[5]})
    assert c["conditions"]["block_size"] == 3 and c["conditions"]["markov_rank"] == 8


def saved_draft(tiny_target, run: Path) -> Path:
    """A block-3 draft of the tiny llama target saved as training saves one (<run>/draft)."""
    target, tok = tiny_target("llama")
    make_draft(target, tok, num_hidden_layers=1, block_size=3).save_pretrained(run / "draft")
    return run / "draft"


def test_accept_from_times_that_draft_with_its_acceptance(tiny_target, tmp_path):
    """`--accept-from` on a block-3 draft: its acceptance per position (the run's three
    greedy_accept@k) and its shape, not the random drafts' block 7."""
    draft = saved_draft(tiny_target, tmp_path / "run")
    final = {f"eval/greedy_accept@{k}": a for k, a in ((1, 0.8), (2, 0.6), (3, 0.4))}
    (tmp_path / "run" / "results.json").write_text(json.dumps({"final_eval": final}))
    out = tmp_path / "out"
    proc = cost_model(
        "--target", "tiny-llama", "--accept-from", str(draft), "--context-len", "16",
        "--repeats", "1", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    c = json.loads((out / "cost_model.json").read_text())
    assert c["conditions"]["block_size"] == 3 and c["conditions"]["draft"] == str(draft)
    assert sorted(c["t_verify"]) == ["1", "2", "3", "4"] and list(c["t_draft"]) == ["1"]
    assert [r["L"] for r in c["best"]["1"]["all"]] == [1, 2, 3]
    # the chosen L's tau from the run's acceptance: 1 + 0.8 + 0.8 * 0.6 + ... up to L drafts
    taus = {1: 1.8, 2: 1.8 + 0.48, 3: 1.8 + 0.48 + 0.48 * 0.4}
    assert c["best"]["1"]["tau"] == pytest.approx(taus[c["best"]["1"]["L"]])


def test_accept_from_a_draft_without_a_run_is_one_error_line(tiny_target, tmp_path):
    draft = saved_draft(tiny_target, tmp_path / "run")
    proc = cost_model("--target", "tiny-llama", "--accept-from", str(draft))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"cost_model: error: --accept-from: no results.json with final_eval "
        f"eval/greedy_accept@k in {draft} or its parent (a training run's draft "
        "has one); pass --accept P1 P2 ... instead"
    ]


def test_shape_flags_beside_a_trained_draft_are_one_error_line(tmp_path):
    proc = cost_model("--accept-from", str(tmp_path / "draft"), "--block-size", "7")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "cost_model: error: --layers / --block-size / --markov-rank shape random drafts; with "
        "--accept-from the draft's own shape is timed: drop them (or drop --accept-from)"
    ]
