"""The reduced-vocabulary sweep's bookkeeping against by-hand figures (dspark/bench/vocab_sweep.py)."""

import json

import pytest
import torch

from dspark.bench import vocab_sweep as vs


def test_run_facts_step_time_and_last_eval_by_hand(tmp_path):
    (tmp_path / "run_config.json").write_text(
        json.dumps({"draft_vocab": {"file": "v.json", "size": 8, "coverage": 0.75}})
    )
    rows = [
        {"time": 100.0, "step": 5, "train/loss": 1.0},
        {"time": 110.0, "step": 10, "train/loss": 0.9},  # 2.0 s a step
        {"time": 125.0, "step": 15, "train/loss": 0.8},  # 3.0
        {"time": 126.0, "step": 15, "eval/tau_greedy": 1.4, "eval/tau_probabilistic": 1.3},
        {"time": 145.0, "step": 20, "train/loss": 0.7},  # (145 - 125) / 5 = 4.0
        {"time": 146.0, "step": 20, "eval/tau_greedy": 1.5, "eval/tau_probabilistic": 1.35},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    f = vs.run_facts(tmp_path)
    assert f["step_s"] == pytest.approx(3.0)
    assert (f["K"], f["train_coverage"], f["steps"]) == (8, 0.75, 20)
    assert (f["eval_tau_greedy"], f["eval_tau_probabilistic"]) == (1.5, 1.35)


def test_coverage_of_greedy_tokens_by_hand():
    assert vs.coverage([1, 2, 3, 3, 9], torch.tensor([2, 3, 4])) == pytest.approx(3 / 5)
    assert vs.coverage([1, 2], None) == 1.0


def test_best_llama_cpp_row_is_the_fastest_draft_mode(tmp_path):
    res = {
        "conditions": {"draft_file_type": "Q8_0"},
        "datasets": {
            "gsm8k": [
                {"name": "plain", "mode": {"spec": "none"}, "tokens_per_s": 90.0},
                {
                    "name": "a",
                    "mode": {"spec": "draft-dspark"},
                    "tokens_per_s": 70.0,
                    "round_ms": 20.0,
                    "tau": 1.2,
                },  # fmt: skip
                {
                    "name": "b",
                    "mode": {"spec": "draft-dspark"},
                    "tokens_per_s": 80.0,
                    "round_ms": 15.0,
                    "tau": 1.1,
                    "break_even_tau": 1.3,
                    "speedup_vs_plain": 0.89,
                },  # fmt: skip
                {"name": "n", "mode": {"spec": "ngram-mod"}, "tokens_per_s": 95.0},
            ]
        },
    }
    p = tmp_path / "r.json"
    p.write_text(json.dumps(res))
    best = vs.best_llama_cpp(str(p))
    assert best["mode"] == "b" and best["round_ms"] == 15.0 and best["draft_file_type"] == "Q8_0"
    assert vs.best_llama_cpp(None) is None
