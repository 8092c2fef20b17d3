"""The one table of a draft benchmarked a set a run, from results.json files written by hand in
the benchmark's layout: each set's figures, the fastest plain decoding as the reference, and
one error line for a folder that is not a set's run."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sets_summary", ROOT / "eval" / "sets_summary.py")
sets_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sets_summary)


def _run(root: Path, name: str, tau: float, spec_tps: float, plain: dict, match: float | None,
         verify_length: int | str = 2) -> None:  # fmt: skip
    fastest = max(plain, key=plain.get)
    (root / name).mkdir(parents=True)
    (root / name / "results.json").write_text(json.dumps({
        "conditions": {"num_prompts": 40, "max_new_tokens": 256, "dtype": "bfloat16",
                       "verify_length": verify_length, "device_name": "Zen 4", "cpu_threads": 2},
        "datasets": {name: {
            "requests": 40,
            "acceptance": {"tau": tau},
            "speed": {"speculative": {"tokens_per_s": spec_tps},
                      "autoregressive": {"tokens_per_s": plain["bfloat16"]},
                      "speedup": spec_tps / plain["bfloat16"], "greedy_match": match,
                      "fastest_plain": {"plain_by_dtype": plain, "fastest_plain_dtype": fastest,
                                        "speedup_vs_fastest_plain": spec_tps / plain[fastest]}}}},
    }))  # fmt: skip


def test_one_row_a_set_against_the_fastest_plain(tmp_path, capsys):
    _run(tmp_path, "gsm8k", 3.1, 30.0, {"bfloat16": 20.0, "float32": 15.0}, 1.0)
    # fp32 plain was the faster here: the speedup is against it, not the bf16 run's own plain
    _run(tmp_path, "mt-bench", 2.05, 24.0, {"bfloat16": 16.0, "float32": 20.0}, 0.975, "full")
    sets_summary.main([str(tmp_path)])
    rows = json.loads((tmp_path / "summary.json").read_text())["sets"]
    assert [r["set"] for r in rows] == ["gsm8k", "mt-bench"]
    assert [r["speedup"] for r in rows] == pytest.approx([1.5, 1.2])
    assert [r["equal"] for r in rows] == [40, 39]
    md = (tmp_path / "summary.md").read_text()
    assert ("| gsm8k | 40 x 256 | 3.10 | 1.50x | 20.0 (bfloat16) | 30.0 | bfloat16, 2 | 40 of 40 "
            "| Zen 4, 2 |") in md  # fmt: skip
    assert "| mt-bench | 40 x 256 | 2.05 | 1.20x | 20.0 (float32) | 24.0 | bfloat16, full |" in md
    assert md in capsys.readouterr().out


def test_a_folder_that_is_not_a_sets_run_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sets_summary.main([str(tmp_path)])
    assert e.value.code == 2 and "make smollm2-large" in capsys.readouterr().err
    _run(tmp_path, "gsm8k", 3.1, 30.0, {"bfloat16": 20.0}, None)
    (tmp_path / "gsm8k").rename(tmp_path / "humaneval")  # its folder names another set
    with pytest.raises(SystemExit) as e:
        sets_summary.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("error:") == 1 and "'humaneval'" in err


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_smollm2_large_tables_its_sets_after_benchmarking_them(tmp_path):
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "smollm2-large", "LARGE_ROWS=24000",
         f"CURVE={tmp_path}/curve", f"LARGE={tmp_path}/large"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    [table] = [
        i for i, x in enumerate(out) if x.endswith("eval/sets_summary.py runs/smollm2-large/n24000")
    ]
    benches = [i for i, x in enumerate(out) if "output_dir=runs/smollm2-large/n24000/" in x]
    assert len(benches) == 5 and max(benches) < table
