"""The one training loop end to end on a tiny target: learning, checkpoints, exact resume
(multi-process runs: tests/test_distributed.py)."""

from pathlib import Path

import pytest
from helpers import debug_cfg, kill_then_resume, losses

from dspark.training.run_status import run_status


def test_debug_run_learns_and_saves_a_loadable_draft(tmp_path, debug_data):
    from dspark.modeling import DSparkDraftModel
    from dspark.training.loop import run

    cfg = debug_cfg(
        tmp_path,
        debug_data,
        "trainer.max_steps=20",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.save_every=10",
        "data.shuffle=false",
        "trainer.calibrate_prompts=6",
        "trainer.calibrate_max_new_tokens=12",
    )
    res = run(cfg)
    assert res["feature_cache"] is None  # the target ran online: no cache to price
    got = losses(tmp_path)
    first, last = sum(got[s] for s in (1, 2, 3)) / 3, sum(got[s] for s in (18, 19, 20)) / 3
    assert last < first, got
    assert res["steps"] == 20 and "eval/loss" in res["final_eval"]
    draft = DSparkDraftModel.from_pretrained(res["draft"])
    assert draft.config.block_size == cfg.draft.block_size
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step_00000020"]  # keep_last=1 pruned step 10
    for name in ("results.json", "report.md", "metrics.jsonl", "training_curves.png"):
        assert (tmp_path / name).exists(), name
    # end-of-training STS: fitted on held-out prompts, shipped in the draft's config.json
    cal = res["calibration"]
    assert 2 <= cal["conditions"]["requests"] <= 6 and cal["n_test"] > 0, cal
    assert draft.config.confidence_temperatures == cal["temperatures"]
    assert len(cal["temperatures"]) == cfg.draft.block_size
    assert (Path(res["draft"]) / "calibration_reliability.png").exists()
    assert "ECE" in (tmp_path / "report.md").read_text()
    assert "feature cache" not in (tmp_path / "report.md").read_text()  # none: no such line


def test_held_out_prompts_are_the_tokens_before_the_first_supervised_one():
    from dspark.training.calibrate import held_out_prompts

    rows = [
        {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 0]},
        {"input_ids": [1, 2, 3], "loss_mask": [0, 0, 0]},  # nothing supervised: skipped
        {"input_ids": [4, 3, 2], "loss_mask": [1, 1, 1]},  # no prompt: skipped
        {"input_ids": [7, 1, 1, 2], "loss_mask": [0, 0, 0, 1]},
        {"input_ids": [3, 3], "loss_mask": [0, 1]},
    ]
    assert held_out_prompts(rows, 2) == [[5, 6], [7, 1, 1]]
    assert held_out_prompts(rows, 10) == [[5, 6], [7, 1, 1], [3]]


def test_kill_and_resume_reproduces_the_uninterrupted_losses(tmp_path, debug_data, monkeypatch):
    from dspark.training import loop

    common = (
        "trainer.max_steps=8",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.save_every=3",
        "trainer.keep_last=3",
    )
    loop.run(debug_cfg(tmp_path / "whole", debug_data, *common))
    whole = losses(tmp_path / "whole")

    # the 5th objective step raises: mid-way between the checkpoints at steps 3 and 6
    split_cfg = debug_cfg(tmp_path / "split", debug_data, *common)
    res = kill_then_resume(monkeypatch, split_cfg, kill_at=5)
    assert res["resumed_from"].endswith("step_00000003")
    split = losses(tmp_path / "split")
    for s in range(1, 9):
        assert split[s] == pytest.approx(whole[s], rel=1e-5, abs=1e-6), (s, split, whole)


@pytest.mark.parametrize("save_every", [0, 2])  # 2: some stops fall on a periodic checkpoint
def test_a_run_in_timed_chunks_reproduces_the_uninterrupted_losses(
    tmp_path, debug_data, save_every
):
    """trainer.stop_after_min: each job checkpoints and stops at its first step past the budget
    (here every step); rerunning resumes, and the chunks add up to the uninterrupted run."""
    from dspark.errors import StoppedWithWorkLeft
    from dspark.training import loop

    common = ("trainer.max_steps=4", "trainer.log_every=1", "trainer.eval_every=0",
              "trainer.save_every=0", "trainer.keep_last=2")  # fmt: skip
    loop.run(debug_cfg(tmp_path / "whole", debug_data, *common))
    whole = losses(tmp_path / "whole")

    chunked = (*common, "trainer.stop_after_min=1e-9", f"trainer.save_every={save_every}")
    for step in (1, 2, 3):
        with pytest.raises(StoppedWithWorkLeft, match=f"at step {step} of 4"):
            loop.run(debug_cfg(tmp_path / "split", debug_data, *chunked))
        assert (tmp_path / "split" / "checkpoints" / f"step_{step:08d}" / "DONE").exists()
        status = run_status(tmp_path / "split")  # what a reader of the directory sees
        assert (status["step"], status["total_steps"], status["finished"]) == (step, 4, False)
    res = loop.run(debug_cfg(tmp_path / "split", debug_data, *chunked))
    assert run_status(tmp_path / "split")["finished"]
    assert res["steps"] == 4 and res["resumed_from"].endswith("step_00000003")
    assert res["train_seconds_total"] > res["train_seconds"] > 0  # four jobs against the last
    split = losses(tmp_path / "split")
    for s in range(1, 5):
        assert split[s] == pytest.approx(whole[s], rel=1e-5, abs=1e-6), (s, split, whole)


def test_a_chunk_stopped_with_work_left_exits_75(tmp_path, debug_data, monkeypatch, capsys):
    from dspark import cli
    from dspark.errors import EXIT_UNFINISHED, StoppedWithWorkLeft
    from dspark.training import loop

    def stop(cfg):
        raise StoppedWithWorkLeft("stopped after 30 min; rerun the same command to resume")

    monkeypatch.setattr(loop, "run", stop)
    with pytest.raises(SystemExit) as exit_info:
        cli._distill_job(debug_cfg(tmp_path, debug_data))
    assert exit_info.value.code == EXIT_UNFINISHED == 75
    assert "rerun the same command" in capsys.readouterr().err


def test_the_report_gives_the_hours_of_training_and_of_its_feature_cache():
    from dspark.training.report import _time_lines

    cost = {"rows": 23999, "shards": 90, "cache_s": 7025.4, "head_pass_s": None}
    got = _time_lines({"train_seconds": 60.0, "train_seconds_total": 7200.0, "feature_cache": cost})
    assert got == ["", "Time (wall): training steps 2.00 h over every job of the run; the feature "
                   "cache (23,999 rows) written in 1.95 h, the target head's pass over it not on "
                   "record."]  # fmt: skip
    assert _time_lines({"train_seconds": 5400.0, "feature_cache": None}) == [
        "", "Time (wall): training steps 1.50 h over every job of the run."]  # fmt: skip
