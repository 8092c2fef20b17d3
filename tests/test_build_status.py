"""A data build's status from files written by hand: the mix's first N rows per source, the
samples a growing prompt set still needs at its keep rate, each step's pace from its runs.jsonl
and the time left, against figures worked out by hand (mix_prompts.py's list of its sources:
tests/test_prompt_mix.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dspark.data.build_status import build_status, mix_shares, mix_sources_path, render
from dspark.errors import BadInputError
from dspark.locking import lock_file_for

REPO = Path(__file__).resolve().parents[1]


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_growing_source_takes_what_a_finished_one_leaves():
    sources = [
        {"name": "chat", "weight": 3.0, "rows": 5, "growing": True},
        {"name": "math", "weight": 1.0, "rows": 10, "growing": False},
    ]
    # 3 : 1 while math lasts (40 rows: 30 chat, 10 math), then chat alone
    assert mix_shares(sources, 40) == {"chat": 30, "math": 10}
    assert mix_shares(sources, 120) == {"chat": 110, "math": 10}
    assert mix_shares(sources, 7) == {"chat": 5, "math": 2}  # 3:1 within one row
    finished = [{**sources[0], "growing": False}, sources[1]]
    assert mix_shares(finished, 120) == {"chat": 5, "math": 10}  # the mix ends at 15


def _build(tmp_path: Path) -> Path:
    chat = tmp_path / "magpie_chat"
    chat.mkdir(parents=True)
    (chat / "prompts.jsonl").write_text("")
    (chat / "summary.json").write_text(json.dumps({"generated": 100, "kept": 80, "num": 400}))
    # 100 samples for 60 CPU-s on 2 threads: 0.3 s a sample alone
    _jsonl(chat / "runs.jsonl", [{"generated_this_run": 100, "cpu_s": 60.0, "threads": 2,
                                  "elapsed_s": 90.0}])  # fmt: skip
    mix = tmp_path / "mix.jsonl"
    mix.write_text("")
    mix_sources_path(mix).write_text(json.dumps({"sources": [
        {"name": "chat", "spec": str(chat / "prompts.jsonl"), "weight": 3.0, "rows": 80,
         "growing": True, "prompt_set": str(chat)},
        {"name": "math", "spec": "gsm8k-train", "weight": 1.0, "rows": 10, "growing": False,
         "prompt_set": None}]}))  # fmt: skip
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "run.json").write_text(json.dumps({"source": str(mix)}))
    # 30 rows answered (a torn last line is no row); 40 rows for 80 CPU-s on 2 threads: 1 s a row
    (answers / "regenerated.jsonl").write_text(
        "".join(json.dumps({"index": i}) + "\n" for i in range(30)) + '{"index": 3'
    )
    _jsonl(answers / "runs.jsonl", [
        {"rows_done": 10, "generated_tokens": 1000, "cpu_s": 30.0, "threads": 2, "elapsed_s": 99.0},
        {"rows_done": 30, "generated_tokens": 3000, "cpu_s": 50.0, "threads": 2, "elapsed_s": 25.0},
    ])  # fmt: skip
    return answers


def test_the_time_left_to_n_rows_by_hand(tmp_path):
    status = build_status(_build(tmp_path), 120)
    chat, answers = status["steps"]
    assert status["mix_shares"] == {"chat": 110, "math": 10}
    # 110 chat prompts kept at 80 of 100 need 138 samples: 38 more at 0.3 s
    assert (chat["needed"], chat["done"], chat["wall_s_per_unit"]) == (138, 100, pytest.approx(0.3))
    assert chat["left_s"] == pytest.approx(38 * 0.3)
    assert chat["target_left_s"] == pytest.approx(300 * 0.3)  # its own 400
    assert (answers["done"], answers["needed"]) == (30, 120)
    assert answers["wall_s_per_unit"] == pytest.approx(1.0)
    assert answers["left_s"] == pytest.approx(90.0)
    assert answers["tokens_per_row"] == pytest.approx(100.0)
    assert status["left_s"] == pytest.approx(90.0 + 11.4)
    text = render(status)
    assert "| answers | 30 | 120 |" in text and "chat 110, math 10" in text
    # enough kept prompts already: nothing left for chat, the answers only
    small = build_status(_build(tmp_path / "again"), 60)
    assert small["steps"][0]["left_s"] == 0 and small["left_s"] == pytest.approx(30.0)


def test_the_step_running_now_from_its_lock_record(tmp_path):
    answers = _build(tmp_path)
    assert build_status(answers, 120)["steps"][-1]["running"] is None
    record = {"host": socket.gethostname(), "command": "regenerate.py", "started": "T"}
    lock_file_for(answers).write_text(json.dumps({**record, "pid": os.getpid()}))
    running = build_status(answers, 120)["steps"][-1]["running"]
    assert f"pid {os.getpid()}" in running and "regenerate.py" in running
    assert "Running now: answers" in render(build_status(answers, 120))
    # a killed writer's record (its process gone) is no writer; nor is a record without a pid
    gone = 2**22 + 7  # above Linux's largest pid_max: no such process
    lock_file_for(answers).write_text(json.dumps({**record, "pid": gone}))
    assert build_status(answers, 120)["steps"][-1]["running"] is None
    lock_file_for(answers).write_text(json.dumps(record))
    assert build_status(answers, 120)["steps"][-1]["running"] is None


def test_a_mix_without_its_sources_list_names_the_fix(tmp_path):
    answers = _build(tmp_path)
    mix_sources_path(tmp_path / "mix.jsonl").unlink()
    with pytest.raises(BadInputError, match="mix_prompts.py"):
        build_status(answers, 100)
    res = subprocess.run(
        [sys.executable, str(REPO / "data_scripts" / "build_status.py"), str(answers), "--rows",
         "100"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("error:") == 1
    with pytest.raises(BadInputError, match="start the build first"):
        build_status(tmp_path / "nothing", 100)
