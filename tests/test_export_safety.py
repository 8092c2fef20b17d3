"""Export never loses what was written before: --overwrite replaces only a previous export
(its export.json), never the source draft, a directory around or inside it, or a training run
directory; refusals and unreadable drafts are one `export: error:` line with exit status 2;
exports get the user's umask modes. In-process through `dspark.cli.export` (no subprocess)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from helpers import make_draft

import dspark.cli
from dspark.errors import EXIT_USER_ERROR, BadInputError, UserError
from dspark.export import NotServableError, export_draft, load_draft


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` with a hash of its bytes: what must survive a refusal."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def run_dir(tiny_target, tmp_path):
    """A training run directory as train/distill.py leaves it: draft/, checkpoints/, metrics."""
    target, tok = tiny_target("qwen3")
    run = tmp_path / "runs" / "x"
    make_draft(target, tok, target_name_or_path="tiny-qwen3").save_pretrained(run / "draft")
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    (run / "checkpoints" / "step_1" / "model.safetensors").write_bytes(b"state")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "run_config.json").write_text("{}\n")
    return run


def _export_fails(capsys, *argv: str) -> str:
    """Run the export entry point; assert exit 2, no traceback, and return its error line."""
    with pytest.raises(SystemExit) as e:
        dspark.cli.export([str(a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == EXIT_USER_ERROR, err
    assert "Traceback" not in err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("export: error: "), last
    return last


def _export_ok(capsys, *argv: str) -> None:
    with pytest.raises(SystemExit) as e:
        dspark.cli.export([str(a) for a in argv])
    assert e.value.code == 0, capsys.readouterr().err


def test_overwrite_never_replaces_the_source_or_a_run(run_dir, tmp_path, capsys):
    src = run_dir / "draft"
    before = _tree(run_dir)
    line = _export_fails(capsys, src, src, "--overwrite")  # would swap fp32 for bf16
    assert "is the source draft itself" in line and str(src) in line
    line = _export_fails(capsys, src, run_dir, "--overwrite")  # would delete the whole run
    assert "holds the source draft" in line
    line = _export_fails(capsys, src, run_dir.parent, "--overwrite")
    assert "holds the source draft" in line
    line = _export_fails(capsys, src, src / "exports", "--overwrite")
    assert "lies inside the source draft" in line
    other = tmp_path / "elsewhere" / "other"  # another run, the source elsewhere
    (other / "checkpoints").mkdir(parents=True)
    (other / "metrics.jsonl").write_text("{}\n")
    line = _export_fails(capsys, src, other, "--overwrite")
    assert "is a training run directory" in line and str(other / "exports") in line
    line = _export_fails(capsys, src, other.parent, "--overwrite")
    assert f"holds the training run {other}" in line
    line = _export_fails(capsys, src, tmp_path / "runs", "--overwrite")
    assert "holds the source draft" in line
    assert _tree(run_dir) == before and (other / "metrics.jsonl").exists()
    # a new export inside a run directory is fine, and --overwrite replaces that export
    out = run_dir / "exports" / "foo"
    _export_ok(capsys, src, out)
    info = json.loads((out / "export.json").read_text())
    assert info["format"] == "deepspec" and info["dtype"] == "bfloat16"
    assert info["source"] == str(src.resolve()) and info["dspark_version"]
    line = _export_fails(capsys, src, out)  # exists, no --overwrite
    assert "previous export" in line and "--overwrite" in line
    _export_ok(capsys, src, out, "--format", "speculators", "--overwrite")
    assert json.loads((out / "export.json").read_text())["format"] == "speculators"
    assert _tree(run_dir / "draft") == {k[6:]: v for k, v in before.items() if k[:6] == "draft/"}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_overwrite_replaces_only_an_export(run_dir, tmp_path, capsys):
    src = run_dir / "draft"
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me\n")
    line = _export_fails(capsys, src, notes, "--overwrite")
    assert "is not an export" in line and "todo.txt" in line and "export.json" in line
    assert (notes / "todo.txt").read_text() == "keep me\n"
    out = tmp_path / "exp"
    _export_ok(capsys, src, out)
    (out / "mine.txt").write_text("added by hand\n")  # an export the user added to
    line = _export_fails(capsys, src, out, "--overwrite")
    assert "mine.txt" in line and (out / "mine.txt").exists()
    (out / "mine.txt").unlink()
    (out / "export.json").unlink()  # a draft dir of the same files is not an export either
    (out / "README.md").write_text("my notes\n")
    line = _export_fails(capsys, src, out, "--overwrite")
    assert "holds no export.json" in line
    with pytest.raises(UserError, match="is a file"):
        export_draft(src, run_dir / "metrics.jsonl", overwrite=True)
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_refusals_exit_2_with_one_error_line(tiny_target, run_dir, tmp_path, capsys):
    assert issubclass(NotServableError, BadInputError) and issubclass(NotServableError, ValueError)
    target, tok = tiny_target("qwen3")
    rnn = tmp_path / "rnn"
    make_draft(
        target, tok, markov_head_type="rnn", target_name_or_path="tiny-qwen3"
    ).save_pretrained(rnn)
    line = _export_fails(capsys, rnn, tmp_path / "x")
    assert "markov_head_type='rnn'" in line and "--engine any" in line
    assert not (tmp_path / "x").exists()
    line = _export_fails(capsys, tmp_path / "nowhere", tmp_path / "y")
    assert "nowhere/config.json not found" in line
    line = _export_fails(capsys, run_dir, tmp_path / "y")  # the run, not its draft/
    assert "config.json not found" in line


def test_unreadable_draft_names_the_file(run_dir, tmp_path, capsys):
    cut = tmp_path / "cut"
    cut.mkdir()
    full = (run_dir / "draft" / "config.json").read_text()
    (cut / "config.json").write_text(full[: len(full) // 2])  # cut off mid-write
    (cut / "model.safetensors").write_bytes((run_dir / "draft" / "model.safetensors").read_bytes())
    line = _export_fails(capsys, cut, tmp_path / "o")
    assert f"{cut / 'config.json'} is not valid JSON" in line
    with pytest.raises(BadInputError, match=r"cut/config\.json is not valid JSON"):
        load_draft(cut)
    # the other layouts read config.json the same way
    spec = export_draft(run_dir / "draft", tmp_path / "spec", "speculators")
    text = (spec / "config.json").read_text()
    (spec / "config.json").write_text(text[:100])
    with pytest.raises(BadInputError, match=r"spec/config\.json is not valid JSON"):
        load_draft(spec)
    (cut / "config.json").write_text(full)
    (cut / "model.safetensors").write_bytes(b"\x00" * 100)  # damaged weights
    line = _export_fails(capsys, cut, tmp_path / "o")
    assert str(cut) in line and "cannot be loaded as a draft" in line
    (cut / "model.safetensors").unlink()
    line = _export_fails(capsys, cut, tmp_path / "o")
    assert "no file named model.safetensors" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_export_modes_follow_the_umask(run_dir, tmp_path, mask):
    old = os.umask(mask)
    try:
        out = export_draft(run_dir / "draft", tmp_path / "exp" / "d")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    files = sorted(out.iterdir())
    for p in files:  # safetensors' writer and mkdtemp would leave 0600 / 0700
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask, p.name
    assert {p.name for p in files} == {
        "config.json",
        "model.safetensors",
        "README.md",
        "export.json",
    }
