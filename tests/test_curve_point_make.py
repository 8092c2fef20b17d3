"""`make smollm2-point`'s cache step: a kept cache of another point is offered for linking and
then deleted, unless KEEP_POINT_FEATURES=1 (make -n: the commands, nothing run)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def point_commands(large: Path, n: int, *args: str) -> str:
    out = subprocess.run(
        [
            "make",
            "-n",
            "--no-print-directory",
            f"{large}/curve/n{n}/results.json",
            f"LARGE={large}",
            f"CURVE={large}/curve",  # not the checkout's runs/, where the point may exist
            *args,
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def test_a_point_links_and_then_deletes_the_cache_another_point_kept(tmp_path):
    kept = tmp_path / "points" / "n6000" / "features"
    kept.mkdir(parents=True)
    (kept / "manifest.json").write_text("{}")
    (tmp_path / "points" / "n3000" / "features").mkdir(parents=True)  # no manifest: no cache
    own = tmp_path / "points" / "n12000" / "features"
    own.mkdir(parents=True)
    (own / "manifest.json").write_text("{}")  # its own, resumed: neither offered nor deleted

    lines = point_commands(tmp_path, 12000).replace("\\\n", " ").splitlines()
    cache = next(x for x in lines if "cache_features.py" in x)
    assert f"--output {own}" in cache and cache.count("--reuse-from") == 1
    assert f"--reuse-from {kept}" in cache
    removals = [x.strip() for x in lines if x.strip().startswith("rm -rf")]
    assert removals[0] == f"rm -rf {kept}"  # after the cache step, before training
    assert lines.index(cache) < lines.index(next(x for x in lines if "rm -rf" in x))
    assert removals[1] == f"rm -rf {own}"  # its own, once trained

    kept_lines = point_commands(tmp_path, 12000, "KEEP_POINT_FEATURES=1")
    assert f"--reuse-from {kept}" in kept_lines and "rm -rf" not in kept_lines

    (kept / "manifest.json").unlink()
    alone = point_commands(tmp_path, 12000)
    assert "--reuse-from" not in alone and alone.count("rm -rf") == 1


def test_a_benchmarked_point_is_not_benchmarked_again(tmp_path):
    """The point's benchmark runs while its benchmark/results.json is missing (written last,
    whole: dspark/eval/runner.py), and not once it is there (make -s with PY=echo: the
    commands it runs are printed, not run)."""
    curve = tmp_path / "curve"
    (curve / "n100" / "benchmark").mkdir(parents=True)
    (curve / "n100" / "results.json").write_text("{}")  # trained: the training is not rerun
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()  # newer than pyproject.toml: `setup` has nothing to do

    def run() -> str:
        return subprocess.run(
            ["make", "-s", "--no-print-directory", "smollm2-point", "N=100", "PY=echo",
             f"LARGE={tmp_path}/large", f"CURVE={curve}", f"VENV={venv}"],  # fmt: skip
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    first = run()
    assert "eval/benchmark.py" in first and f"output_dir={curve}/n100/benchmark" in first
    assert "distill.py" not in first and "eval/data_curve.py" in first
    (curve / "n100" / "benchmark" / "results.json").write_text("{}")
    again = run()
    assert "eval/benchmark.py" not in again and "eval/data_curve.py" in again


def test_a_q8_0_point_caches_trains_and_links_only_q8_0_caches(tmp_path):
    kept_bf16 = tmp_path / "points" / "n6000" / "features"
    kept_q8 = tmp_path / "points" / "n3000" / "features_q8_0"
    for kept in (kept_bf16, kept_q8):
        kept.mkdir(parents=True)
        (kept / "manifest.json").write_text("{}")
    lines = point_commands(tmp_path, 12000, "FEATURES_DTYPE=q8_0").replace("\\\n", " ")
    lines = lines.splitlines()
    cache = next(x for x in lines if "cache_features.py" in x)
    own = tmp_path / "points" / "n12000" / "features_q8_0"
    assert f"--output {own} " in cache and "--dtype q8_0" in cache
    assert f"--reuse-from {kept_q8}" in cache and str(kept_bf16) not in cache
    (train,) = [x for x in lines if "distill.py" in x]
    assert f"data.features={own} " in train
    plain = point_commands(tmp_path, 12000).replace("\\\n", " ")
    assert "--dtype bf16" in plain and "features_q8_0" not in plain
