"""The data scripts' answers to a user's mistakes: one `prog: error: ...` line, exit status 2.

Bad bytes in one row reject that row only; an output directory that is a file, unwritable,
another tool's, or an earlier regeneration with other settings is refused before anything
slow runs and before anything is overwritten; a --data that is no tokenized set says which
directory to pass.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest

from dspark import cli
from dspark.data.prompts.sources import load_prompts
from dspark.data.regeneration.run_files import OUTPUT, REJECTED, RUN, SUMMARY

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
REGEN = ["--target", "tiny-llama", "--max-new-tokens", "4", "--no-progress"]
ROWS = [{"turns": ["Say hi."]}, {"turns": ["Count to three."]}, {"turns": ["Name a colour."]}]


@pytest.fixture(scope="module", autouse=True)
def quiet_datasets():
    """`datasets` draws progress bars on stderr; the error line is what is checked there."""
    import datasets

    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()


def cache_features(argv):
    spec = importlib.util.spec_from_file_location(
        "cache_features", ROOT / "data_scripts" / "cache_features.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(argv)


PROGS = {"regenerate": cli.regenerate, "tokenize": cli.tokenize, "cache_features": cache_features}


def error_line(capsys, prog, argv) -> str:
    """Run `prog argv`, which must fail as a user error: status 2, one stderr line."""
    capsys.readouterr()  # what the test's setup printed (building a tiny target) is not ours
    with pytest.raises(SystemExit) as e:
        PROGS[prog](argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines
    return lines[0]


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory, tiny_target_dir):
    """An output dir of one finished `regenerate --tokenize` run (greedy, 4 new tokens)."""
    tiny_target_dir("llama")
    root = tmp_path_factory.mktemp("regen")
    src = jsonl(root / "in.jsonl", ROWS[:1])
    out = root / "out"
    argv = [*REGEN, "--input", str(src), "--output", str(out), "--tokenize"]
    with pytest.raises(SystemExit) as e:
        cli.regenerate(argv)
    assert e.value.code == 0
    return src, out, argv


@pytest.fixture
def tokenized(tmp_path):
    import datasets

    path = tmp_path / "run" / "tokenized"
    rows = {"index": [0], "input_ids": [[1, 2, 3, 4, 5, 6]], "loss_mask": [[0, 0, 1, 1, 1, 0]]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    return path


# -- a byte that is not UTF-8 ------------------------------------------------------------------
def bad_utf8_jsonl(path: Path) -> Path:
    lines = [json.dumps(r).encode() for r in ROWS]
    lines[1] = lines[1].replace(b"Count", b"C\xffount")
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_a_row_that_is_not_utf8_is_rejected_with_its_number(tmp_path):
    ps = load_prompts(str(bad_utf8_jsonl(tmp_path / "p.jsonl")))
    assert [r["index"] for r in ps.rows] == [0, 2]
    assert [(r.index, "not valid UTF-8: byte 0xff" in r.reason) for r in ps.rejected] == [(1, True)]


def test_regenerate_goes_on_past_a_row_that_is_not_utf8(tmp_path, tiny_target_dir, capsys):
    tiny_target_dir("llama")
    src, out = bad_utf8_jsonl(tmp_path / "p.jsonl"), tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        cli.regenerate([*REGEN, "--input", str(src), "--output", str(out)])
    assert e.value.code == 0
    assert [json.loads(x)["index"] for x in (out / OUTPUT).read_text().splitlines()] == [0, 2]
    (rejected,) = [json.loads(x) for x in (out / REJECTED).read_text().splitlines()]
    assert rejected["index"] == 1 and "UTF-8" in rejected["reason"]
    assert "first: row 1: not valid UTF-8" in capsys.readouterr().err


# -- one error line each ------------------------------------------------------------------------
def _file(tmp):
    (tmp / "taken").write_text("a file\n")
    return tmp / "taken"


def _foreign(name, text='{"mine": 1}\n'):
    def make(tmp):
        (tmp / "d").mkdir(exist_ok=True)
        (tmp / "d" / name).write_text(text)
        return tmp / "d"

    return make


def _shard(tmp):
    (tmp / "d").mkdir()
    (tmp / "d" / "shard_00000.safetensors").write_bytes(b"not ours")
    return tmp / "d"


def _empty(tmp):
    (tmp / "e.jsonl").write_text("")
    return tmp / "e.jsonl"


def _all_bad(tmp):
    return jsonl(tmp / "bad.jsonl", [{"nothing": 1}, {"turns": []}])


def _json_not_utf8(tmp):
    (tmp / "p.json").write_bytes(b'[{"turns": ["caf\xe9"]}]')
    return tmp / "p.json"


def _dir(tmp):
    (tmp / "nostate").mkdir()
    return tmp / "nostate"


# (prog, what --output is, what --input / --data is, the phrases the line must have)
CASES = {
    "regen-output-is-a-file": ("regenerate", _file, None, ["--output", "taken is a file"]),
    "regen-foreign-summary": (
        "regenerate",
        _foreign(SUMMARY),
        None,
        ["summary.json was not written by a regeneration", "has no run.json", "new --output"],
    ),
    "regen-foreign-run-json": (
        "regenerate",
        _foreign(RUN, "[1, 2]\n"),
        None,
        ["run.json was not written by a regeneration"],
    ),
    "regen-empty-input": ("regenerate", None, _empty, ["--input", "e.jsonl has no rows"]),
    "regen-every-row-rejected": (
        "regenerate",
        None,
        _all_bad,
        ["all 2 were rejected", "first: row 0: unknown row shape"],
    ),
    "regen-json-not-utf8": ("regenerate", None, _json_not_utf8, ["p.json is not valid UTF-8"]),
    "tok-empty-input": ("tokenize", None, _empty, ["--input", "e.jsonl has no rows"]),
    "tok-foreign-manifest": (
        "tokenize",
        _foreign("manifest.json"),
        None,
        ["manifest.json was not written by tokenize", "new --output"],
    ),
    "tok-into-a-regeneration": (
        "tokenize",
        _foreign(REJECTED, ""),
        None,
        ["rejected.jsonl was not written by tokenize"],
    ),
    "tok-output-is-a-file": ("tokenize", _file, None, ["taken is a file"]),
    "cache-data-missing": ("cache_features", None, lambda t: t / "nope", ["no such directory"]),
    "cache-data-no-state": ("cache_features", None, _dir, ["is not a tokenized set"]),
    "cache-output-is-a-file": ("cache_features", _file, None, ["taken is a file"]),
    "cache-foreign-manifest": (
        "cache_features",
        _foreign("manifest.json"),
        None,
        ["is not a feature cache's", "would be overwritten"],
    ),
    "cache-foreign-shard": ("cache_features", _shard, None, ["shard_00000.safetensors was not"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_is_one_error_line(case, tmp_path, tokenized, tiny_target_dir, capsys):
    tiny_target_dir("llama")
    prog, make_out, make_in, needles = CASES[case]
    out = make_out(tmp_path) if make_out else tmp_path / "new"
    before = {p: p.read_bytes() for p in Path(out).rglob("*") if p.is_file()}
    if prog == "cache_features":
        data = make_in(tmp_path) if make_in else tokenized
        argv = ["--target", "tiny-llama", "--data", str(data), "--output", str(out)]
    else:
        src = make_in(tmp_path) if make_in else jsonl(tmp_path / "in.jsonl", ROWS[:1])
        argv = (REGEN if prog == "regenerate" else ["--target", "tiny-llama"]) + [
            "--input",
            str(src),
            "--output",
            str(out),
        ]
    line = error_line(capsys, prog, argv)
    for needle in needles:
        assert needle in line
    # nothing was overwritten, and a refused new directory was not even made
    assert {p: p.read_bytes() for p in Path(out).rglob("*") if p.is_file()} == before
    assert make_out or not out.exists()


def test_cache_features_data_that_holds_a_tokenized_dir_asks_did_you_mean(
    tmp_path, tokenized, tiny_target_dir, capsys
):
    tiny_target_dir("llama")
    argv = ["--target", "tiny-llama", "--data", str(tokenized.parent), "--output", str(tmp_path)]
    line = error_line(capsys, "cache_features", argv)
    assert f"did you mean --data {tokenized}?" in line


def test_cache_features_reuse_from_a_dir_that_is_no_cache(
    tmp_path, tokenized, tiny_target_dir, capsys
):
    tiny_target_dir("llama")
    argv = ["--target", "tiny-llama", "--data", str(tokenized), "--output", str(tmp_path / "new")]
    line = error_line(capsys, "cache_features", [*argv, "--reuse-from", str(tmp_path)])
    assert f"{tmp_path} is not a feature cache (no manifest.json)" in line
    assert not (tmp_path / "new").exists()


def test_regenerate_with_other_settings_names_the_setting(regenerated, capsys):
    src, out, argv = regenerated
    line = error_line(capsys, "regenerate", [*argv, "--max-new-tokens", "5"])
    assert f"--output {out} holds a regeneration made with other settings" in line
    assert "sampling.max_new_tokens was 4, now 5 (--max-new-tokens)" in line
    assert "same settings to resume" in line and "new --output" in line


def test_a_rerun_with_the_same_settings_still_resumes_and_retokenizes(regenerated, capsys):
    src, out, argv = regenerated
    before = (out / OUTPUT).read_text()
    with pytest.raises(SystemExit) as e:
        cli.regenerate(argv)  # nothing left to do; the tokenized set is rebuilt in place
    assert e.value.code == 0
    assert (out / OUTPUT).read_text() == before
    assert "1 skipped (already done)" in capsys.readouterr().out


def test_a_run_that_kept_reasoning_is_not_resumed_without_it(tmp_path):
    from dspark.data.regeneration.run_files import check_output

    settings = {"source": "s", "sampling": {"temperature": 0.0}, "target": "t"}
    (tmp_path / RUN).write_text(json.dumps({**settings, "keep_reasoning": True}))
    with pytest.raises(
        ValueError, match=r"keep_reasoning was True, now False \(--keep-reasoning\)"
    ):
        check_output(tmp_path, settings)
    check_output(tmp_path, {**settings, "keep_reasoning": True})


# -- an output directory that cannot be written ----------------------------------------------
def _argv(prog, out, tokenized, src):
    if prog == "cache_features":
        return ["--target", "tiny-llama", "--data", str(tokenized), "--output", str(out)]
    head = REGEN if prog == "regenerate" else ["--target", "tiny-llama"]
    return [*head, "--input", str(src), "--output", str(out)]


@pytest.mark.parametrize("prog", sorted(PROGS))
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0555 directory anyway")
def test_an_unwritable_output_is_one_error_line(prog, tmp_path, tokenized, tiny_target_dir, capsys):
    tiny_target_dir("llama")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    src = jsonl(tmp_path / "in.jsonl", ROWS[:1])
    try:
        line = error_line(capsys, prog, _argv(prog, ro / "sub", tokenized, src))
    finally:
        ro.chmod(0o755)
    assert f"its parent {ro} is not writable" in line


@pytest.mark.parametrize("prog", sorted(PROGS))
def test_an_output_the_os_says_is_unwritable_is_one_error_line(
    prog, tmp_path, tokenized, tiny_target_dir, capsys, monkeypatch
):
    """The same refusal as root sees it: `os.access` is what the check asks (root passes it
    for a 0555 directory, so it is told no here)."""
    tiny_target_dir("llama")
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: Path(p) != ro and real(p, m, **kw))
    src = jsonl(tmp_path / "in.jsonl", ROWS[:1])
    line = error_line(capsys, prog, _argv(prog, ro, tokenized, src))
    assert f"--output {ro}: it is not writable" in line


# -- option values argparse cannot check by type alone ----------------------------------------
@pytest.mark.parametrize(
    "prog, extra, needle",
    [
        ("regenerate", ["--max-new-tokens", "0"], "--max-new-tokens 0: must be >= 1"),
        ("regenerate", ["--temperature", "-1"], "--temperature must be >= 0"),
        ("regenerate", ["--device", "gpu"], "--device 'gpu': not a device"),
        ("regenerate", ["--dtype", "fp33"], "argument --dtype: invalid choice: 'fp33'"),
        ("tokenize", ["--max-length", "0"], "--max-length 0: must be >= 1"),
        ("cache_features", ["--device", "gpu"], "--device 'gpu': not a device"),
        ("cache_features", ["--layer-ids", "1,x"], "'1,x': expected comma-separated ints"),
        ("cache_features", ["--layer-ids", "1,99"], "--layer-ids [99] cannot be tapped"),
    ],
)
def test_a_bad_option_value_is_refused_before_the_target_loads(
    prog, extra, needle, tmp_path, tokenized, tiny_target_dir, capsys
):
    tiny_target_dir("llama")
    src = jsonl(tmp_path / "in.jsonl", ROWS[:1])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        PROGS[prog]([*_argv(prog, tmp_path / "new", tokenized, src), *extra])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: " in last and needle in last, last
    assert not (tmp_path / "new").exists()
