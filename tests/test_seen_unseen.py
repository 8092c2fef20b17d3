"""Seen and unseen bench sets from a build's answers: which rows each takes (by hand), what a
short file or a bad row gives, a second write, the script's error line, the benchmark reading
the sets, and `make smollm2-seen-unseen`'s commands (make -n)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dspark.data.prompts.seen_unseen import seen_unseen_turns, write_sets
from dspark.errors import BadInputError
from dspark.eval.prompts import load_dataset

ROOT = Path(__file__).resolve().parents[1]


def _answers(path: Path, n: int) -> Path:
    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
        if i == 7:  # a two-turn row: both user turns kept, in order
            msgs += [{"role": "user", "content": "q7b"}, {"role": "assistant", "content": "a"}]
        rows.append(json.dumps({"index": 100 + i, "messages": msgs}) + "\n")
    path.write_text("".join(rows))
    return path


def test_seen_is_the_first_rows_and_unseen_the_rows_after_n(tmp_path):
    answers = _answers(tmp_path / "regenerated.jsonl", 10)
    sets = seen_unseen_turns(answers, trained_rows=6, n=3)
    assert sets == {"seen": [["q0"], ["q1"], ["q2"]], "unseen": [["q6"], ["q7", "q7b"], ["q8"]]}
    with pytest.raises(BadInputError, match="holds 4 rows after the first 6, not 5"):
        seen_unseen_turns(answers, trained_rows=6, n=5)
    with pytest.raises(BadInputError, match="--prompts"):
        seen_unseen_turns(answers, trained_rows=2, n=3)
    with open(answers, "a") as f:  # a torn last line, past the rows read: never read
        f.write('{"messages": [')
    assert seen_unseen_turns(answers, trained_rows=6, n=3) == sets
    lines = answers.read_text().splitlines()
    lines[6] = json.dumps({"text": "no conversation"})
    answers.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInputError, match="line 7"):
        seen_unseen_turns(answers, trained_rows=6, n=3)


def test_written_sets_are_read_by_the_benchmark_and_never_rewritten(tmp_path):
    sets = seen_unseen_turns(_answers(tmp_path / "a.jsonl", 10), trained_rows=6, n=3)
    paths = write_sets(sets, tmp_path / "sets")
    assert load_dataset("unseen", tmp_path / "sets", None) == sets["unseen"]
    assert load_dataset("seen", tmp_path / "sets", 2) == sets["seen"][:2]
    os.utime(paths["seen"], (1.0, 1.0))
    assert write_sets(sets, tmp_path / "sets") == paths  # the same prompts: kept as they are
    assert paths["seen"].stat().st_mtime == 1.0
    other = {**sets, "seen": [["q9"]] * 3}
    with pytest.raises(BadInputError, match="exists with other prompts"):
        write_sets(other, tmp_path / "sets")
    assert load_dataset("seen", tmp_path / "sets", None) == sets["seen"]


def test_the_script_prints_the_sets_or_one_error_line(tmp_path):
    build = tmp_path / "answers"
    build.mkdir()
    _answers(build / "regenerated.jsonl", 10)
    script = [sys.executable, str(ROOT / "data_scripts" / "seen_unseen_sets.py"), str(build),
              "--trained-rows", "6", "--output", str(tmp_path / "sets")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run([*script, "--prompts", "4"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["seen", str(tmp_path / "sets" / "seen.jsonl"),
                                 "unseen", str(tmp_path / "sets" / "unseen.jsonl")]  # fmt: skip
    bad = subprocess.run([*script, "--prompts", "5"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1
    assert "answer more rows" in bad.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_writes_both_sets_and_benchmarks_each_once(tmp_path):
    def commands(*args: str) -> str:
        out = subprocess.run(
            ["make", "-n", "--no-print-directory", "smollm2-seen-unseen", "N=24000",
             f"LARGE={tmp_path}/large", f"CURVE={tmp_path}/curve", "QS_BENCH_DTYPE=bfloat16",
             *args],
            cwd=ROOT, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.replace("\\\n", " ")

    text = commands()
    sets = f"{tmp_path}/curve/n24000/seen_unseen/sets"
    assert f"seen_unseen_sets.py {tmp_path}/large/answers --trained-rows 24000" in text
    assert f"--prompts 40 --output {sets}" in text
    for name in ("seen", "unseen"):
        bench = next(x for x in text.splitlines() if f"datasets=[{name}]" in x)
        assert f"draft={tmp_path}/curve/n24000/draft" in bench and f"bench_dir={sets}" in bench
        assert "num_prompts=40" in bench and "max_new_tokens=256" in bench
        assert "verify_length=full" in bench and "dtype=bfloat16" in bench
    done = tmp_path / "curve" / "n24000" / "seen_unseen" / "seen"
    done.mkdir(parents=True)
    (done / "results.json").write_text("{}")
    again = commands()
    assert "datasets=[seen]" not in again and "datasets=[unseen]" in again
