"""A long data build in bounded, resumable steps: a regeneration killed with `kill -9` mid-chunk
or stopped by `--stop-after` resumes to the rows of an uninterrupted run, `--grow N` adds N
rows, and an unfinished regeneration is never tokenized as if it were whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_locking import REPO, _env

from dspark.data.cli import regenerate_main
from dspark.data.tokenize_cli import tokenize_main
from dspark.errors import EXIT_UNFINISHED

ARGS = ["--target", "tiny-qwen3", "--input", "embedded", "--split", "train",
        "--max-new-tokens", "24", "--batch-size", "4", "--chunk-rows", "4",
        "--no-progress"]  # fmt: skip


def _rows(out: Path) -> list[dict]:
    path = out / "regenerated.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def lone(tmp_path_factory, tiny_target_dir):
    """The uninterrupted run's 24 rows, the reference every interrupted build must equal."""
    tiny_target_dir("qwen3")
    out = tmp_path_factory.mktemp("lone") / "out"
    assert regenerate_main([*ARGS, "--limit", "24", "--output", str(out)]) == 0
    assert _summary(out)["complete"] is True
    return _rows(out)


def test_killed_mid_chunk_resumes_to_the_same_rows(tmp_path, lone, dspark_cache):
    out = tmp_path / "out"
    cmd = [sys.executable, "data_scripts/regenerate.py", *ARGS, "--limit", "24",
           "--output", str(out)]  # fmt: skip
    env = _env(DSPARK_CACHE=str(dspark_cache))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "regenerated.jsonl").is_file() and len(_rows(out)) >= 4:
            break  # one chunk written, the next under way
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    cut = len(_rows(out))
    assert 4 <= cut < 24, "the kill should land mid-build"
    assert _summary(out)["complete"] is False  # a killed run says it is unfinished
    # a half-written last line, as a kill mid-write leaves one
    with open(out / "regenerated.jsonl", "a") as f:
        f.write('{"index": 99, "messa')
    res = subprocess.run([*cmd, "--tokenize"], cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert _rows(out) == lone  # no row lost, none twice, the same answers
    assert _summary(out)["rows_skipped"] == cut


def test_stop_after_is_a_bounded_step_and_grow_adds_rows(tmp_path, lone):
    out = tmp_path / "out"
    step = [*ARGS, "--limit", "16", "--output", str(out), "--stop-after", "1e-6", "--tokenize"]
    assert regenerate_main(step) == EXIT_UNFINISHED  # one chunk, then it stops
    assert len(_rows(out)) == 4 and not (out / "tokenized").exists()
    assert _summary(out)["complete"] is False
    with pytest.raises(ValueError, match="unfinished regeneration.*--partial"):
        tokenize_main(["--target", "tiny-qwen3", "--input", str(out / "regenerated.jsonl"),
                       "--output", str(tmp_path / "tok")])  # fmt: skip
    assert tokenize_main(["--target", "tiny-qwen3", "--input", str(out / "regenerated.jsonl"),
                          "--output", str(tmp_path / "tok"), "--partial"]) == 0  # fmt: skip
    while (rc := regenerate_main(step)) == EXIT_UNFINISHED:
        pass
    assert rc == 0 and _rows(out) == lone[:16] and (out / "tokenized").is_dir()
    grow = [*ARGS, "--grow", "8", "--output", str(out)]
    assert regenerate_main(grow) == 0
    assert _rows(out) == lone and _summary(out)["rows_total"] == 24
    # a smaller point cut from the build: its first rows
    import datasets

    cut = tmp_path / "first5"
    assert tokenize_main(["--target", "tiny-qwen3", "--input", str(out / "regenerated.jsonl"),
                          "--output", str(cut), "--limit", "5"]) == 0  # fmt: skip
    assert datasets.load_from_disk(str(cut))["index"] == [r["index"] for r in lone[:5]]
