"""The tau-versus-data report from point run directories written by hand: the table, the
CPU-hours of the answers and prompts prorated from the build's runs.jsonl files, and the last
doubling's gain."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "data_curve", Path(__file__).resolve().parents[1] / "eval" / "data_curve.py"
)
data_curve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(data_curve)


ZEN4 = "AMD EPYC (family 25 model 17; AVX-512 BF16, no AMX)"


def _point(root: Path, n: int, held: float, taus: dict, train_s: float,
           trained_on: str | None = ZEN4, benchmarked_on: str = "another CPU",
           feature_cache: dict | None = None):  # fmt: skip
    run = root / f"n{n}"
    (run / "benchmark").mkdir(parents=True)
    conditions = {"device_name": trained_on} if trained_on else {}
    (run / "results.json").write_text(json.dumps(
        {"steps": n // 10, "final_eval": {"eval/tau_greedy": held}, "train_seconds": train_s,
         "conditions": conditions, "feature_cache": feature_cache}))  # fmt: skip
    (run / "benchmark" / "results.json").write_text(json.dumps(
        {"datasets": {k: {"acceptance": {"tau": v}} for k, v in taus.items()},
         "conditions": {"device_name": benchmarked_on}}))  # fmt: skip
    # two epochs logged; the last one's train tau is held + 0.2 (weighted by blocks), so the
    # data limits this point; an eval row and the first epoch must not count
    log = [{"step": 1, "epoch": 0, "train/tau_greedy": held + 5.0, "train/blocks": 10},
           {"step": 2, "epoch": 1, "train/tau_greedy": held + 0.1, "train/blocks": 30},
           {"step": 3, "epoch": 1, "train/tau_greedy": held + 0.5, "train/blocks": 10},
           {"step": 3, "eval/tau_greedy": held}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))


def _seen_unseen(run: Path, seen: float, unseen: float | None) -> None:
    for name, tau in (("seen", seen), ("unseen", unseen)):
        if tau is not None:
            (run / "seen_unseen" / name).mkdir(parents=True)
            (run / "seen_unseen" / name / "results.json").write_text(
                json.dumps({"datasets": {name: {"acceptance": {"tau": tau}}}})
            )


def test_the_curve_from_its_points(tmp_path):
    # the features' wall time: the cache's passes plus its head's pass (3,600 + 1,800 s);
    # a cache whose pace is not on record (one shard) has none, whatever its head's pass took
    _point(tmp_path, 1500, 1.80, {"gsm8k": 2.0, "mt-bench": 1.3}, 3600.0,
           feature_cache={"cache_s": None, "head_pass_s": 900.0})  # fmt: skip
    _point(tmp_path, 6000, 2.10, {"gsm8k": 2.5, "mt-bench": 1.5}, 7200.0,
           feature_cache={"rows": 6000, "cache_s": 3600.0, "head_pass_s": 1800.0})  # fmt: skip
    _seen_unseen(tmp_path / "n6000", 3.1, 2.6)
    _seen_unseen(tmp_path / "n1500", 2.4, None)  # the unseen set not measured: no column
    # a run from before training recorded its machine: the benchmark's names it
    _point(tmp_path, 3000, 2.00, {"gsm8k": 2.3, "mt-bench": 1.4}, 5400.0, None, "Xeon (AMX)")
    build = tmp_path / "build"
    build.mkdir()
    steps = [
        {"rows_done": 3000, "elapsed_s": 3600.0, "threads": 2, "cpu_s": 5400.0},  # crowded: 1.5 CPU-h
        # no CPU time recorded: its 2M tokens at the fastest rate (400 tok/s on 2 threads,
        # 200 per core) are 10,000 CPU-s, whatever its wall time (paused half of it)
        {"rows_done": 2000, "elapsed_s": 10000.0, "threads": 2, "generated_tokens": 2_000_000,
         "tokens_per_s": 200.0},
        {"rows_done": 1000, "elapsed_s": 1000.0, "threads": 2, "generated_tokens": 400_000,
         "tokens_per_s": 400.0},  # 2,000 CPU-s
    ]  # fmt: skip
    (build / "runs.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    # 6000 rows in 5400 + 10000 + 2000 = 17,400 CPU-s: 4.833 CPU-h
    # the prompts: every third row of the mix is a target-written chat prompt; the chat set kept
    # 4,000 prompts for 1,800 CPU-s (recorded) + 2,000 rows at the fastest 1 row per thread-s
    mix = tmp_path / "mix.jsonl"
    mix.write_text("".join(json.dumps({"source": "chat" if i % 3 == 0 else "math"}) + "\n"
                           for i in range(6000)))  # fmt: skip
    chat = tmp_path / "magpie_chat"
    chat.mkdir()
    (chat / "summary.json").write_text(json.dumps({"generated": 5000, "kept": 4000}))
    (chat / "runs.jsonl").write_text(
        json.dumps({"generated_this_run": 2000, "elapsed_s": 1000.0, "threads": 2, "cpu_s": 1800.0})
        + "\n"
        + json.dumps({"generated_this_run": 2000, "elapsed_s": 4000.0, "threads": 2})  # paused
        + "\n"
    )  # 3,800 CPU-s for the 4,000 samples on record: 0.95 CPU-s each; 5 samples per 4 kept
    # (1,000 sampled before runs.jsonl), so 1.1875 CPU-s a prompt; 2,000 in the first 6,000 rows
    data_curve.main([str(tmp_path), "--build", str(build), "--mix", str(mix),
                     "--prompt-set", f"chat={chat}"])  # fmt: skip
    curve = json.loads((tmp_path / "report" / "curve.json").read_text())
    assert [p["n"] for p in curve["points"]] == [1500, 3000, 6000]
    assert [p["answers_cpu_h"] for p in curve["points"]] == pytest.approx(
        [4.8333 / 4, 4.8333 / 2, 4.8333], rel=1e-3
    )
    assert [p["prompts_cpu_h"] for p in curve["points"]] == pytest.approx(
        [2375 / 3600 / 4, 2375 / 3600 / 2, 2375 / 3600], rel=1e-3
    )
    # the last doubling (3000 -> 6000): +0.10 held-out, +0.2 gsm8k, +0.1 mt-bench
    assert curve["doubling_gain"] == pytest.approx({"held-out": 0.1, "gsm8k": 0.2, "mt-bench": 0.1})
    md = (tmp_path / "report" / "curve.md").read_text()
    assert [p["train_tau_greedy"] for p in curve["points"]] == pytest.approx([2.0, 2.2, 2.3])
    assert [p["limit"] for p in curve["points"]] == ["data"] * 3
    assert (
        f"| 6000 | 600 | 2.100 | 2.300 | data | 2.50 | 1.50 | 3.10 / 2.60 | 0.66 | 4.83 | 1.50 | 2.00 | "
        f"{ZEN4} |" in md
    )
    assert [p["machine"] for p in curve["points"]] == [ZEN4, "Xeon (AMX)", ZEN4]
    assert [p["seen_unseen_tau"] for p in curve["points"]] == [
        None, None, {"seen": 3.1, "unseen": 2.6}]  # fmt: skip
    assert "| 1500 | 150 | 1.800 | 2.000 | data | 2.00 | 1.30 |  | 0.16 | 1.21 |  | 1.00 | " in md
    assert [p["features_s"] for p in curve["points"]] == [None, None, 5400.0]
    assert (tmp_path / "report" / "curve.png").stat().st_size > 0
    with pytest.raises(SystemExit) as e:  # a prompt set given without its source name
        data_curve.main([str(tmp_path), "--mix", str(mix), "--prompt-set", str(chat)])
    assert e.value.code == 2


def test_a_draft_no_better_on_its_training_rows_is_capacity_limited(tmp_path):
    run = tmp_path / "n1500"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"epoch": 4, "train/tau_greedy": 1.83, "train/blocks": 5}) + "\n"
    )
    train = data_curve.last_epoch_train_tau(data_curve.read_json_rows(run / "metrics.jsonl"))
    assert train == pytest.approx(1.83)
    assert (
        data_curve.limit_of({"train_tau_greedy": train, "held_out_tau_greedy": 1.80}) == "capacity"
    )
    assert data_curve.limit_of({"train_tau_greedy": train, "held_out_tau_greedy": 1.77}) == "data"
    assert data_curve.limit_of({"train_tau_greedy": None, "held_out_tau_greedy": 1.78}) is None


def test_no_point_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        data_curve.main([str(tmp_path)])
    assert e.value.code == 2 and "make smollm2-point" in capsys.readouterr().err


def test_recorded_points_join_the_curve_as_recorded(tmp_path, capsys):
    """An earlier report's curve.json: its points of N not run here join the table, marked and
    with their own figures; a point run here wins over the recorded one of the same N."""
    root = tmp_path / "runs"
    _point(root, 6000, 2.10, {"gsm8k": 2.5}, 7200.0)
    rec = tmp_path / "earlier.json"
    rec.write_text(json.dumps({"points": [
        {"n": 1500, "steps": 150, "held_out_tau_greedy": 1.8, "train_tau_greedy": 2.0,
         "limit": "data", "tau": {"gsm8k": 2.0}, "train_s": 3600.0, "answers_cpu_h": 0.4,
         "prompts_cpu_h": 0.2, "machine": "Xeon (AMX)"},
        {"n": 3000, "steps": 300, "held_out_tau_greedy": 2.0, "tau": {"gsm8k": 2.3},
         "answers_cpu_h": 0.8},
        {"n": 6000, "steps": 1, "held_out_tau_greedy": 9.9, "tau": {"gsm8k": 9.9}},
    ]}))  # fmt: skip
    data_curve.main([str(root), "--recorded", str(rec)])
    curve = json.loads((root / "report" / "curve.json").read_text())
    assert [p["n"] for p in curve["points"]] == [1500, 3000, 6000]
    assert [p.get("recorded") for p in curve["points"]] == [str(rec), str(rec), None]
    assert curve["points"][2]["held_out_tau_greedy"] == 2.10  # the run here, not the record
    assert curve["points"][1]["answers_cpu_h"] == 0.8  # as recorded
    assert curve["points"][2]["answers_cpu_h"] is None  # no build given for the run here
    assert curve["doubling_gain"]["gsm8k"] == pytest.approx(0.2)  # 3000 (recorded) -> 6000
    md = (root / "report" / "curve.md").read_text()
    assert (
        "| 1500* | 150 | 1.800 | 2.000 | data | 2.00 |  | 0.20 | 0.40 |  | 1.00 | Xeon (AMX) |"
        in md
    )
    assert "| 3000* | 300 | 2.000 |  |  | 2.30 |  |  | 0.80 |  |  |  |" in md  # no machine recorded
    assert f"`*`: as recorded in {rec}" in md
    rec.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as e:
        data_curve.main([str(root), "--recorded", str(rec)])
    assert e.value.code == 2 and "--recorded" in capsys.readouterr().err


def test_the_table_has_one_column_a_heading_with_or_without_bench_sets(tmp_path):
    run = tmp_path / "n1500"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"steps": 5, "final_eval": {}}))
    _seen_unseen(run, 1.2, 1.1)
    data_curve.main([str(tmp_path)])
    table = [x for x in (tmp_path / "report" / "curve.md").read_text().splitlines() if x[:1] == "|"]
    assert len(table) == 3 and len({x.count("|") for x in table}) == 1, table
    assert "| 1.20 / 1.10 |" in table[2]
    _point(tmp_path / "two", 3000, 2.0, {"gsm8k": 2.3}, 60.0)
    data_curve.main([str(tmp_path / "two")])
    table = [x for x in (tmp_path / "two" / "report" / "curve.md").read_text().splitlines()
             if x[:1] == "|"]  # fmt: skip
    assert len({x.count("|") for x in table}) == 1, table


def test_train_hours_count_the_steps_alone(tmp_path):
    """A point trained in chunks, paused beside other work: its train hours are its steps at
    their logged pace, not the run's wall time (which the JSON keeps)."""
    _point(tmp_path, 1500, 1.8, {"gsm8k": 2.0}, 9000.0)  # wall: 2.5 h over every job
    # 150 steps logged every 10 at 20 s a step, a 3,000 s pause after step 50; a torn last line
    rows, t = [], 0.0
    for step in range(10, 151, 10):
        t += 200.0 + (3000.0 if step == 60 else 0.0)
        rows.append({"step": step, "time": t, "train/loss": 1.0, "epoch": 1,
                     "train/tau_greedy": 2.0, "train/blocks": 1})  # fmt: skip
    (tmp_path / "n1500" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"st'
    )
    data_curve.main([str(tmp_path)])
    [point] = json.loads((tmp_path / "report" / "curve.json").read_text())["points"]
    assert point["train_s"] == pytest.approx(150 * 20.0) and point["train_wall_s"] == 9000.0
    assert "| 0.83 | " in (tmp_path / "report" / "curve.md").read_text()  # 3,000 s
