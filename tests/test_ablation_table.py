"""The ablation table's held-out columns come from each run's results.json, as written."""

import json

from dspark.bench.ablation import render_table, training_summary


def test_table_reads_each_runs_held_out_metrics_and_steps(tmp_path):
    final = {
        "eval/tau_probabilistic": 1.78291,
        "eval/tau_greedy": 1.94681,
        "eval/greedy_accept@1": 0.49061,
        "eval/accept_rate@1": 0.45842,
        "eval/ce": 3.4,  # neither tau, a loss nor an acceptance: left out
        "eval/loss": 2.0975,
    }
    (tmp_path / "results.json").write_text(json.dumps({"steps": 700, "final_eval": final}))
    train = training_summary(tmp_path)
    assert train == {k: v for k, v in final.items() if k != "eval/ce"} | {"steps": 700}
    rows = [
        {"label": "a", "train": train, "decoder": {"embedded@0": {"tau": 1.894}}},
        {"label": "b", "train": {"steps": 5}, "decoder": {"embedded@0": {"tau": 1.0}}},
    ]
    lines = render_table(rows, ["embedded"], [0.0]).splitlines()
    assert lines[0].split(" | ")[1:5] == [
        "steps",
        "held-out tau_prob",
        "held-out tau_greedy",
        "held-out greedy accept@1",
    ]
    assert lines[2] == "| a | 700 | 1.783 | 1.947 | 0.491 | 1.89 |"
    assert lines[3] == "| b | 5 | n/a | n/a | n/a | 1.00 |"  # a run without them says so
