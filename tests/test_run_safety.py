"""Nothing lost, nothing silently wrong in a training run directory: a second run over a first,
a resume with other settings, damaged checkpoints, divergence, strict metrics, mismatched data,
and the run config's mistakes as one error each."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch
from helpers import debug_cfg

from dspark.errors import BadInputError, UserError

REPO = Path(__file__).resolve().parents[1]
SHORT = ("trainer.log_every=1", "trainer.eval_every=0", "data.shuffle=false")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, debug_data):
    """A finished 8-step debug run with checkpoints at steps 4 and 8."""
    from dspark.training.loop import run

    out = tmp_path_factory.mktemp("finished")
    args = (*SHORT, "trainer.max_steps=8", "trainer.save_every=4", "trainer.keep_last=2")
    run(debug_cfg(out, debug_data, *args))
    return out, args


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_fresh_run_over_a_finished_one_is_refused_and_nothing_changes(
    finished_run,
    debug_data,
):
    from dspark.training.loop import run

    out, args = finished_run
    before = {p: _sha(p) for p in out.rglob("*") if p.is_file()}
    cfg = debug_cfg(out, debug_data, *args, "trainer.resume=false", "trainer.max_steps=2")
    with pytest.raises(BadInputError, match="already holds a training run .*trainer.resume=true"):
        run(cfg)
    assert {p: _sha(p) for p in out.rglob("*") if p.is_file()} == before


def test_resume_with_another_draft_shape_is_refused(finished_run, debug_data):
    from dspark.training.loop import run

    out, args = finished_run
    cfg = debug_cfg(out, debug_data, *args, "draft.num_hidden_layers=2")
    with pytest.raises(BadInputError, match=r"draft.num_hidden_layers: 1 -> 2"):
        run(cfg)


def _truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _nan_weights(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    save_file({k: torch.full_like(v, math.nan) for k, v in state.items()}, str(path))


@pytest.mark.parametrize("damage", [_truncate, _nan_weights], ids=["truncated", "nan"])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_resumes(
    finished_run,
    debug_data,
    tmp_path,
    damage,
):
    from dspark.training.checkpoint import nonfinite_parameters
    from dspark.training.loop import run

    src, args = finished_run
    out = _copy_run(src, tmp_path / "run")
    damage(out / "checkpoints" / "step_00000008" / "model.safetensors")
    res = run(debug_cfg(out, debug_data, *args, "trainer.max_steps=10"))
    assert res["resumed_from"].endswith("step_00000004")
    assert (out / "checkpoints" / "corrupt-step_00000008").is_dir()  # kept, not deleted
    # one row per step in metrics.jsonl; the killed-over steps 5..8 of the first run kept aside
    train_steps = [r["step"] for r in _rows(out / "metrics.jsonl") if "train/loss" in r]
    assert train_steps == list(range(1, 11))
    moved = [r["step"] for r in _rows(out / "metrics.superseded.jsonl") if "train/loss" in r]
    assert moved == [5, 6, 7, 8]
    from dspark.modeling import DSparkDraftModel

    assert not nonfinite_parameters(DSparkDraftModel.from_pretrained(res["draft"]))


class _Accel:
    """The part of an Accelerator `resume_latest` uses; `load_state` records or raises."""

    is_main_process = True

    def __init__(self, error: Exception | None = None):
        self.error, self.loaded = error, []

    def load_state(self, path):
        if self.error:
            raise self.error
        self.loaded.append(path)

    def wait_for_everyone(self):
        pass


def _checkpoint(root: Path, step: int, value: float) -> Path:
    from safetensors.torch import save_file

    ckpt = root / "checkpoints" / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    save_file({"w": torch.full((2, 2), value)}, str(ckpt / "model.safetensors"))
    (ckpt / "DONE").write_text("{}")
    return ckpt


def test_a_shape_error_in_a_checkpoint_is_not_mistaken_for_damage(tmp_path):
    from dspark.training.checkpoint import resume_latest

    ckpt = _checkpoint(tmp_path, 2, 1.0)
    accel = _Accel(RuntimeError("Error(s) in loading state_dict: size mismatch for fc.weight"))
    with pytest.raises(BadInputError, match="does not fit this run .*size mismatch"):
        resume_latest(accel, torch.nn.Linear(1, 1), tmp_path)
    assert ckpt.is_dir()  # a whole checkpoint of another shape is never renamed away


def test_a_damaged_checkpoint_is_never_loaded_into_the_live_model(tmp_path):
    """Checked from its files first: a damaged checkpoint is never loaded (the live model
    would keep its NaN weights if nothing else loaded after it)."""
    from dspark.training.checkpoint import resume_latest

    good = _checkpoint(tmp_path, 2, 1.0)
    _checkpoint(tmp_path, 4, math.nan)
    accel = _Accel()
    assert resume_latest(accel, torch.nn.Linear(1, 1), tmp_path, log=lambda m: None) == good
    assert accel.loaded == [str(good)]  # step 4 was never loaded
    assert (tmp_path / "checkpoints" / "corrupt-step_00000004").is_dir()


def test_a_run_whose_every_checkpoint_is_damaged_is_not_started_over(tmp_path):
    from dspark.training.checkpoint import resume_latest

    _checkpoint(tmp_path, 4, math.inf)
    accel = _Accel()
    with pytest.raises(BadInputError, match="every checkpoint .* is damaged .*corrupt-step_0+4"):
        resume_latest(accel, torch.nn.Linear(1, 1), tmp_path, log=lambda m: None)
    assert accel.loaded == []
    assert resume_latest(accel, torch.nn.Linear(1, 1), tmp_path / "empty") is None  # no run yet


def test_check_divergence_by_hand():
    from dspark.training.loop import check_divergence

    assert check_divergence(2.0, 1.0, 2.1, 100.0) is None
    assert "loss is nan" in check_divergence(math.nan, None, 2.0, 100.0)
    assert "gradient norm is inf" in check_divergence(2.0, math.inf, 2.0, 100.0)
    assert "rose to 300" in check_divergence(300.0, 1.0, 2.0, 100.0)
    assert check_divergence(300.0, 1.0, 2.0, 0.0) is None  # factor 0: blow-up check off
    assert check_divergence(199.0, 1.0, 2.0, 100.0) is None


def test_a_diverging_run_stops_before_the_update_naming_the_last_good_checkpoint(
    tmp_path,
    debug_data,
    monkeypatch,
):
    from dspark.training import loop
    from dspark.training.checkpoint import nonfinite_parameters

    real_build = loop.build_objective_for

    def nan_at_step_6(*a, **k):
        obj, calls = real_build(*a, **k), [0]
        step = obj.step

        def poisoned(*sa, **sk):
            calls[0] += 1
            loss, metrics = step(*sa, **sk)
            if calls[0] == 6:
                loss = loss * math.nan
                metrics = {**metrics, "loss": loss.detach()}
            return loss, metrics

        obj.step = poisoned
        return obj

    monkeypatch.setattr(loop, "build_objective_for", nan_at_step_6)
    cfg = debug_cfg(tmp_path, debug_data, *SHORT, "trainer.max_steps=12", "trainer.save_every=4")
    with pytest.raises(loop.DivergedError, match=r"step 6: the loss is nan.*step_00000004"):
        loop.run(cfg)
    assert not (tmp_path / "draft").exists()  # nothing non-finite is published
    from dspark.modeling import DSparkDraftModel

    saved = DSparkDraftModel.from_pretrained(tmp_path / "checkpoints" / "step_00000004" / "draft")
    assert not nonfinite_parameters(saved)
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))


def test_an_exploding_loss_stops_the_run(tmp_path, debug_data):
    from dspark.training import loop

    cfg = debug_cfg(tmp_path, debug_data, *SHORT, "trainer.max_steps=30", "optim.lr=1e6")
    with pytest.raises(loop.DivergedError, match="trainer.divergence_factor=100"):
        loop.run(cfg)


def test_metrics_log_is_strict_json(tmp_path):
    from dspark.training.tracking import JsonlTracker

    t = JsonlTracker(tmp_path / "m.jsonl")
    t.start()
    t.log({"a": math.nan, "b": [1.0, math.inf], "c": 2.5}, step=3)
    row = json.loads((tmp_path / "m.jsonl").read_text(), parse_constant=pytest.fail)
    assert row["a"] is None and row["b"] == [1.0, None] and row["c"] == 2.5 and row["step"] == 3


def test_the_published_draft_follows_the_umask(finished_run):
    out, _ = finished_run
    # the suite runs under the default umask 022: files 0644, directories 0755
    mask = os.umask(0)
    os.umask(mask)
    for p in (out / "draft").rglob("*"):
        assert p.stat().st_mode & 0o777 == 0o666 & ~mask, p


def test_a_set_tokenized_for_another_target_is_refused(debug_data, tiny_target):
    from dspark.training.build import load_datasets

    _, llama_tok = tiny_target("llama")
    cfg = debug_cfg(Path("/unused"), debug_data, "target.name=tiny-llama")
    with pytest.raises(BadInputError, match="was tokenized for target 'tiny-qwen3'"):
        load_datasets(cfg, llama_tok)


def test_a_one_row_set_names_eval_fraction():
    from dspark.training.build import check_split

    with pytest.raises(BadInputError, match="1 row.*data.eval_fraction=0.05.*data.eval=DIR"):
        check_split(1, 0.05, "x")
    with pytest.raises(BadInputError, match="data.eval_fraction=0.0"):
        check_split(50, 0.0, "x")
    check_split(2, 0.05, "x")  # one row each side


def test_training_never_makes_its_data(tmp_path):
    """A missing data.train is refused before anything is built, naming the command that makes
    it; the run neither regenerates into it nor creates it."""
    from dspark.errors import MissingPathError
    from dspark.training.loop import run

    data = tmp_path / "data" / "tokenized"
    with pytest.raises(MissingPathError, match="data.train=.* does not exist.*make debug-data"):
        run(debug_cfg(tmp_path / "o", data, "trainer.max_steps=1"))
    assert not data.parent.exists()


# -- the run config's mistakes: one error each, before anything is built ----------------------
@pytest.mark.parametrize(
    "override, needle",
    [
        ("+trainer.max_stpes=3", "unknown config key 'trainer.max_stpes'.*'trainer.max_steps'"),
        ("trainer.max_stpes=3", "Did you mean 'trainer.max_steps'"),
        ("optim.lr=abc", "optim.lr='abc'.*could not be converted to Float"),
        ("optim.lr=abc,1e-3", "optim.lr='abc'"),  # each value of a sweep
        ("recipe=debgu", "recipe=debgu names no recipe config. Did you mean 'debug'"),
        ("optim=sgd", "optim=sgd names no optim config"),
        ("data.batch_size=[1", "cannot parse the override"),
    ],
)
def test_bad_overrides_are_one_user_error(override, needle):
    from dspark.cli import check_distill_overrides

    with pytest.raises(UserError, match=needle):
        check_distill_overrides([override], REPO / "conf", REPO / "recipes")


def test_good_overrides_pass():
    from dspark.cli import check_distill_overrides

    check_distill_overrides(
        [
            "recipe=debug",
            "optim.lr=1e-3,3e-4",
            "trainer.max_steps=null",
            'data.train="a,b"',
            "draft.init_layers=[1,2]",
            "optim.lr=range(1,3)",
            "hydra.run.dir=x",
            "-m",
        ],  # fmt: skip
        REPO / "conf",
        REPO / "recipes",
    )


@pytest.mark.parametrize(
    "override, needle",
    [
        ("trainer.epochs=-1", "trainer.epochs=-1.0 is out of range"),
        ("draft.num_hidden_layers=0", "draft.num_hidden_layers=0 is out of range"),
        ("optim.lr=-1", "optim.lr=-1.0 is out of range"),
        ("optim.lr=0", "optim.lr=0.0 is out of range"),
        ("trainer.max_steps=0", "trainer.max_steps=0 is out of range"),
        ("data.batch_size=0", "data.batch_size=0 is out of range"),
        ("trainer.keep_last=0", "trainer.keep_last=0 is out of range"),
        ("optim.warmup_ratio=1.5", "optim.warmup_ratio=1.5"),
        ("draft.init_layers=[0,1]", "names 2 target layers for draft.num_hidden_layers=1"),
    ],
)
def test_out_of_range_values_are_one_user_error(override, needle, tmp_path):
    with pytest.raises(BadInputError, match=needle):
        debug_cfg(tmp_path, tmp_path / "data", override)


def test_warm_start_layers_beyond_the_target_are_a_user_error(tiny_target):
    from dspark.config import DSparkConfig
    from dspark.modeling import DSparkDraftModel
    from dspark.modeling.warm_start import warm_start_from_target

    target, _ = tiny_target("qwen3")
    draft = DSparkDraftModel.from_target(
        target,
        DSparkConfig.from_target_config(target.config, num_hidden_layers=1, mask_token_id=1),
    )
    with pytest.raises(BadInputError, match=r"\[99\] are not layers of a 4-layer target"):
        warm_start_from_target(draft, target, [99])


def test_the_distill_script_prints_one_line_for_a_misspelt_key():
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "train/distill.py", "recipe=debug", "+trainer.max_stpes=3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("distill: error: unknown config key"), lines
