"""The README's commands run as written, so the README cannot drift from the code.

Every command line of the README's ```bash blocks is parsed. Cheap checks (default suite): each
script exists and its `--help` runs; each `--flag` is one the script's parser knows; each
Hydra override list composes onto the schema and passes `check` (sweeps expanded point by
point); each debug-recipe point builds its draft and objective on the tiny target; each
`--config_file` exists. `-m slow` runs the debug recipe and the sweep themselves, in a
scratch directory, exactly as written.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HYDRA_SCRIPTS = {"train/distill.py": "conf", "eval/benchmark.py": "conf/benchmark"}


def readme_commands() -> list[list[str]]:
    """argv of every `python ...` / `accelerate launch ...` line in the README's bash blocks."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # trailing comments
            if line.startswith(("python ", "accelerate launch ")):
                commands.append(shlex.split(line))
    return commands


def script_of(argv: list[str]) -> tuple[str, list[str]]:
    """(script path, its own arguments) of a README command."""
    i = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    return argv[i], argv[i + 1 :]


COMMANDS = readme_commands()
SCRIPTS = sorted({script_of(c)[0] for c in COMMANDS})


def test_readme_has_the_commands_this_test_checks():
    assert len(COMMANDS) >= 8, COMMANDS
    assert {"train/distill.py", "eval/benchmark.py", "data_scripts/regenerate.py"} <= set(SCRIPTS)
    assert any("-m" in c for c in COMMANDS), "the README's sweep example"


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """`--help` output of every README script, from ONE Python process (a start each costs
    seconds of CPU: torch and transformers imports)."""
    driver = (
        "import json, runpy, sys, io, contextlib\n"
        "out = {}\n"
        "for script in sys.argv[1:]:\n"
        "    sys.argv = [script, '--help']\n"
        "    buf = io.StringIO()\n"
        "    code = None\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        try:\n"
        "            runpy.run_path(script, run_name='__main__')\n"
        "        except SystemExit as e:\n"
        "            code = e.code\n"
        "    from hydra.core.global_hydra import GlobalHydra\n"
        "    GlobalHydra.instance().clear()\n"
        "    out[script] = [code, buf.getvalue()]\n"
        "print('@@' + json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", driver, *SCRIPTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("@@", 1)[1])
    for script, (code, _) in result.items():
        assert code in (0, None), (script, code, proc.stderr[-2000:])
    return {script: text for script, (_, text) in result.items()}


def test_every_readme_script_exists_and_its_help_runs(helps):
    for script in SCRIPTS:
        assert (REPO / script).is_file(), script
        assert len(helps[script]) > 100, (script, helps[script])


def test_every_readme_flag_is_known_to_its_script(helps):
    for argv in COMMANDS:
        script, args = script_of(argv)
        if script in HYDRA_SCRIPTS:
            continue
        for flag in (a.split("=", 1)[0] for a in args if a.startswith("--")):
            assert flag in helps[script], f"README: {script} has no {flag} ({' '.join(argv)})"


def test_accelerate_config_files_exist():
    for argv in COMMANDS:
        if "--config_file" in argv:
            assert (REPO / argv[argv.index("--config_file") + 1]).is_file(), argv


def _sweep_points(args: list[str]) -> list[list[str]]:
    """Overrides of each job: `-m a=x,y b=z` -> [[a=x, b=z], [a=y, b=z]] (`...` -> a path)."""
    multirun = "-m" in args or "--multirun" in args
    overrides = [a.replace("...", "/tmp/readme-placeholder") for a in args if not a.startswith("-")]
    if not multirun:
        return [overrides]
    choices = []
    for o in overrides:
        key, value = o.split("=", 1)
        values = value.split(",") if "," in value and not value.startswith("[") else [value]
        choices.append([f"{key}={v}" for v in values])
    return [list(p) for p in itertools.product(*choices)]


def _distill_points() -> list[list[str]]:
    points = []
    for argv in COMMANDS:
        script, args = script_of(argv)
        if script == "train/distill.py":
            points += _sweep_points(args)
    return points


@pytest.mark.parametrize("overrides", _distill_points(), ids=" ".join)
def test_readme_distill_overrides_compose_and_build(overrides, tiny_target_dir):
    """Each README training job composes and validates; the tiny-target ones also build the
    draft and the objective (where `draft.markov_rank=0` used to fail)."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dspark.training.build import build_draft, build_objective_for
    from dspark.training.schema import check, register_configs

    GlobalHydra.instance().clear()
    register_configs(REPO / "recipes")
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[*overrides, "trainer.output_dir=unused"])
    check(cfg)
    if cfg.target.name.startswith("tiny-"):
        target, _, draft = build_draft(cfg, torch.device("cpu"))
        build_objective_for(cfg, target, draft.config)
        assert draft.config.markov_rank == cfg.draft.markov_rank


def test_readme_benchmark_overrides_compose():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dspark.eval.benchmark_config import check_overrides, register

    register()
    for argv in COMMANDS:
        script, args = script_of(argv)
        if script != "eval/benchmark.py":
            continue
        check_overrides(args)
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(REPO / "conf" / "benchmark"), version_base="1.3"):
            cfg = compose("benchmark", overrides=args)
        assert cfg.draft


def _run_as_written(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The README command with the checkout's scripts at their absolute paths, in `cwd`."""
    argv = [str(REPO / a) if a.endswith((".py", ".yaml")) else a for a in argv]
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[:2] == ["accelerate", "launch"]:
        argv = [sys.executable, "-m", "accelerate.commands.launch", *argv[2:]]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_readme_debug_recipe_and_sweep_run_as_written(tmp_path, dspark_cache):
    """`accelerate launch train/distill.py recipe=debug` and the sweep, in a scratch dir."""
    debug = next(c for c in COMMANDS if c[-1] == "recipe=debug" and "--config_file" not in c)
    sweep = next(c for c in COMMANDS if "-m" in c)
    proc = _run_as_written(debug, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "runs" / "debug" / "draft" / "config.json").exists()
    proc = _run_as_written(sweep, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted((tmp_path / "runs" / "sweeps").glob("*/*/draft/config.json"))
    ranks = sorted(json.loads(p.read_text())["markov_rank"] for p in jobs)
    values = [a.split("=", 1)[1] for a in sweep if a.startswith("draft.markov_rank=")][0]
    assert ranks == sorted(int(v) for v in values.split(","))
