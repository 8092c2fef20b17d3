"""House rules for the checkout itself: tracked text speaks of the project, and the source
directories named `target/` stay tracked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Words of a work log, not of the project: numbered work stages, a tracker's "issue", and
# "staged" (word) for results of earlier training stages. Identifiers such as `_staged` or
# `staged_write` do not match (`\b` sees no boundary after `_`).
WORK_LOG_WORDS = re.compile(r"\bstop \d+|\bthe issue\b|\bstaged\b", re.IGNORECASE)
# Paths new contributors will create: they must not be swallowed by a `target/` ignore rule.
TARGET_DIR_PATHS = ["dspark/target/new_module.py", "conf/target/new.yaml"]


def git(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, **kw)


def tracked_text_files() -> list[Path]:
    proc = git("ls-files", "-z")
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    files = []
    for name in proc.stdout.split("\0"):
        path = REPO / name
        if not name or not path.is_file() or path == Path(__file__).resolve():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        files.append(path)
    return files


def test_tracked_files_hold_no_work_log_words():
    hits = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            m = WORK_LOG_WORDS.search(line)
            if m:
                hits.append(f"{path.relative_to(REPO)}:{n}: {m.group(0)!r}: {line.strip()[:100]}")
    assert not hits, "say it as the project's reason instead:\n" + "\n".join(hits)


def test_the_word_check_catches_what_it_should():
    for bad in ("figures of stop 12", "at the issue's conditions", "the staged v4 draft"):
        assert WORK_LOG_WORDS.search(bad), bad
    for fine in ("stop drafting below p_min", "with _staged(out) as tmp", "staged_write()"):
        assert not WORK_LOG_WORDS.search(fine), fine


def _ignored(path: str, *config: str) -> bool:
    proc = git(*config, "check-ignore", "-q", path)
    assert proc.returncode in (0, 1), proc.stderr  # 0: ignored, 1: not ignored
    return proc.returncode == 0


@pytest.mark.parametrize("path", TARGET_DIR_PATHS)
def test_new_files_in_target_dirs_are_not_ignored(path):
    assert not _ignored(path), f"{path} would be silently untracked: see .gitignore"


@pytest.mark.parametrize("path", TARGET_DIR_PATHS)
def test_target_dirs_survive_a_global_target_rule(path, tmp_path):
    """The common Python .gitignore template's `target/`, in a user's global excludes file."""
    excludes = tmp_path / "global_gitignore"
    excludes.write_text("target/\n")
    assert _ignored("some/other/target/x.py", "-c", f"core.excludesFile={excludes}")
    assert not _ignored(path, "-c", f"core.excludesFile={excludes}")
