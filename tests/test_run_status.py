"""Where a draft's long stages stand, from their files alone: a feature cache's rows and shards
done and its pace per row (`cache_progress`), the target head's pass over it in shards
(`summary_progress`), a training run's last checkpoint of its total and
its pace per step (`run_status`), each against figures worked out by hand; the status command's
draft section. A real run's recorded total and steps: tests/test_training.py (timed chunks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark.data.features.cache_progress import cache_cost, cache_progress
from dspark.data.features.summary_cache import (
    _write,
    shard_summary_key,
    summary_path,
    summary_progress,
)
from dspark.training.run_status import GAP_FACTOR, render_training, run_status, step_pace

REPO = Path(__file__).resolve().parents[1]


def _train_row(step: int, time: float) -> dict:
    return {"time": time, "step": step, "train/loss": 1.0}


def test_the_pace_of_a_step_leaves_out_a_job_start():
    rows = [_train_row(5, 100.0), _train_row(10, 105.0), _train_row(15, 112.0),  # 1 s, 1.4 s
            {"time": 113.0, "step": 15, "eval/loss": 2.0},  # an eval row: not a train row
            _train_row(20, 900.0),  # a kill and a restart: 787.6 s a step, left out
            _train_row(25, 905.0), _train_row(30, 910.0)]  # fmt: skip
    # the usual gap is the median of 1, 1.4, 157.6, 1, 1 s a step = 1 s; kept 5 + 7 + 5 + 5 s
    assert step_pace(rows) == pytest.approx(22.0 / 20)
    assert step_pace(rows[:1]) is None
    # a gap of just under GAP_FACTOR times the usual counts
    near = [
        _train_row(0, 0.0),
        _train_row(1, 1.0),
        _train_row(2, 2.0),
        _train_row(3, 2.0 + 0.99 * GAP_FACTOR),
    ]
    assert step_pace(near) == pytest.approx((2.0 + 0.99 * GAP_FACTOR) / 3)


def _run_dir(root: Path, step: int, total: int | None) -> Path:
    (root / "checkpoints" / f"step_{step:08d}").mkdir(parents=True)
    (root / "checkpoints" / f"step_{step:08d}" / "DONE").touch()
    (root / "checkpoints" / f".tmp-step_{step + 5:08d}").mkdir()  # a save cut by a kill
    schedule = {} if total is None else {"schedule": {"total_steps": total}}
    (root / "run_config.json").write_text(json.dumps({"trainer": {}, **schedule}))
    rows = [_train_row(s, 2.0 * s) for s in range(5, step + 6, 5)]  # 2 s a step
    # held-out evals at steps 10 and 20, logged as rows of their own (the newest is not last)
    rows += [{"time": 41.0, "step": 20, "eval/tau_greedy": 1.75, "eval/loss": 2.0},
             {"time": 21.0, "step": 10, "eval/tau_greedy": 1.5}]  # fmt: skip
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"ti')
    return root


def test_a_run_at_its_last_checkpoint_by_hand(tmp_path):
    status = run_status(_run_dir(tmp_path / "run", 40, 100))
    assert (status["step"], status["total_steps"], status["finished"]) == (40, 100, False)
    assert status["s_per_step"] == pytest.approx(2.0)
    assert status["left_s"] == pytest.approx(60 * 2.0)  # from the checkpoint, not the log
    assert status["held_out_tau_greedy"] == {"step": 20, "value": 1.75}
    text = render_training(None, status)
    assert "Held-out tau_greedy: 1.750 at step 20 (the run's newest held-out evaluation)." in text
    (tmp_path / "run" / "results.json").write_text("{}")
    done = run_status(tmp_path / "run")
    assert (done["step"], done["finished"], done["left_s"]) == (100, True, 0.0)
    assert run_status(tmp_path / "none") == {
        "run": str(tmp_path / "none"), "started": False, "finished": False, "step": 0,
        "total_steps": None, "s_per_step": None, "left_s": None,
        "held_out_tau_greedy": None}  # fmt: skip
    assert "Held-out" not in render_training(None, run_status(tmp_path / "none"))


@pytest.fixture
def cache_copy(tmp_path, tiny_sets):
    """A copy of a small complete feature cache (several shards), free to edit."""
    _, _, _, caches = tiny_sets("qwen3")
    return Path(shutil.copytree(caches["fp32"], tmp_path / "features"))


def test_a_cache_half_written_by_hand(cache_copy):
    manifest = json.loads((cache_copy / "manifest.json").read_text())
    shards, rows = manifest["shards"], manifest["settings"]["data_rows"]
    assert len(shards) >= 5  # four finished shards or more below: three gaps outvote a pause
    whole = cache_progress(cache_copy)
    assert (whole["complete"], whole["rows_done"], whole["left_s"]) == (True, rows, 0.0)
    # the last shard not yet written; each shard finished 2 s a row after the one before it,
    # but shard 1 after a 1,000 s pause (the median leaves it out with 3 or more gaps)
    t = 1_000_000.0
    for k, s in enumerate(shards[:-1]):
        a, b = s["rows"]
        t += (1000.0 if k == 1 else 2.0 * (b - a)) if k else 0.0
        os.utime(cache_copy / s["file"], (t, t))
    (cache_copy / shards[-1]["file"]).unlink()
    manifest.update(shards=shards[:-1], complete=False)
    (cache_copy / "manifest.json").write_text(json.dumps(manifest))
    half = cache_progress(cache_copy)
    last_rows = shards[-1]["rows"][1] - shards[-1]["rows"][0]
    assert (half["rows_done"], half["rows"]) == (rows - last_rows, rows)
    assert (half["shards_done"], half["shards"]) == (len(shards) - 1, len(shards))
    assert half["s_per_row"] == pytest.approx(2.0)
    assert half["left_s"] == pytest.approx(2.0 * last_rows)
    assert cache_progress(cache_copy.parent / "nothing") is None
    text = render_training(half, run_status(cache_copy.parent / "nothing"))
    assert f"| feature cache | {rows - last_rows:,} rows ({len(shards) - 1} shards) |" in text
    assert "| training | not started |" in text


def test_the_status_command_adds_the_draft(tmp_path, cache_copy):
    answers = tmp_path / "answers"
    answers.mkdir()
    mix = tmp_path / "mix.jsonl"
    mix.write_text("")
    mix.with_name("mix.sources.json").write_text(json.dumps({"sources": [
        {"name": "math", "spec": "gsm8k-train", "weight": 1.0, "rows": 10, "growing": False,
         "prompt_set": None}]}))  # fmt: skip
    (answers / "run.json").write_text(json.dumps({"source": str(mix)}))
    run = _run_dir(tmp_path / "run", 40, 100)
    script = [sys.executable, str(REPO / "data_scripts" / "build_status.py"), str(answers),
              "--rows", "10"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([*script, "--features", str(cache_copy), "--run", str(run), "--json",
                          str(tmp_path / "s.json")], capture_output=True, text=True, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "| training | step 40 | 100 steps | 2.000 s / step | 0.03 h |" in res.stdout
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["training"]["step"] == 40 and saved["features"]["complete"] is True
    res = subprocess.run([*script, "--features", str(cache_copy)], capture_output=True,
                         text=True, env=env)  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("error:") == 1 and "--run" in res.stderr


def test_the_head_pass_over_a_cache_by_hand(tmp_path):
    cache = tmp_path / "features"
    cache.mkdir()
    shards = [{"file": f"s{k}", "rows": [10 * k, 10 * k + 10], "sha256": f"{k:064x}"}
              for k in range(6)]  # fmt: skip
    (cache / "manifest.json").write_text(json.dumps({"shards": shards, "complete": True}))
    root = tmp_path / "dspark_cache"
    row = {0: (torch.zeros(3), torch.zeros(3, dtype=torch.long))}
    t = 1_000_000.0
    for k, gap in [(0, 0.0), (1, 30.0), (2, 30.0), (3, 900.0)]:  # shard 3 after a restart
        path = summary_path(shard_summary_key(shards[k], "head"), root)
        _write(path, shard_summary_key(shards[k], "head"), row)
        t += gap
        os.utime(path, (t, t))
    other = {"sha256": "f" * 64}  # another cache's shard: not this pass's
    _write(
        summary_path(shard_summary_key(other, "head"), root), shard_summary_key(other, "head"), row
    )
    (root / "target_summaries" / "torn.pt").write_bytes(b"PK\x03")  # a torn file: not counted
    got = summary_progress(cache, root)
    # 4 of 6 shards; gaps 30, 30, 900 s: the median, 30 s a shard, for the 2 left
    assert got == {"shards": 6, "shards_done": 4, "s_per_shard": 30.0, "left_s": 60.0}
    assert summary_progress(tmp_path / "nothing", root) is None
    text = render_training(None, run_status(tmp_path / "none"), got)
    assert "| target head's pass | 4 shards | 6 shards | 30.0 s / shard | 0.02 h |" in text
    assert "| target head's pass" not in render_training(None, run_status(tmp_path / "none"))


def test_what_a_complete_cache_took_by_hand(tmp_path, cache_copy):
    """`cache_cost`: the cache's usual pace per row times its rows, plus its head's usual pace
    per shard times its shards, each left out where its files give no pace."""
    manifest = json.loads((cache_copy / "manifest.json").read_text())
    shards, rows = manifest["shards"], manifest["settings"]["data_rows"]
    root = tmp_path / "dspark_cache"
    assert cache_cost(cache_copy, root)["head_pass_s"] is None  # no head summarized it
    t = 1_000_000.0
    for k, s in enumerate(shards):  # 3 s a row, shard 1 after a 1,000 s pause
        a, b = s["rows"]
        t += (1000.0 if k == 1 else 3.0 * (b - a)) if k else 0.0
        os.utime(cache_copy / s["file"], (t, t))
    row = {0: (torch.zeros(3), torch.zeros(3, dtype=torch.long))}
    for k, s in enumerate(shards[:3]):  # the head's pass: 3 of the shards, 20 s apart
        path = summary_path(shard_summary_key(s, "head"), root)
        _write(path, shard_summary_key(s, "head"), row)
        os.utime(path, (t + 20.0 * k, t + 20.0 * k))
    got = cache_cost(cache_copy, root)
    assert got == {"rows": rows, "shards": len(shards), "cache_s": pytest.approx(3.0 * rows),
                   "head_pass_s": pytest.approx(20.0 * len(shards))}  # fmt: skip
    assert cache_cost(tmp_path / "nothing", root) is None
