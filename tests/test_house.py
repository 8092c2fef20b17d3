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
# History in a results document: a commit id (after "at" / "commit", or backticked: hex with a
# letter and a digit), a date, or a day's host. Figures there are current; git keeps history.
_SHA = r"(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}"
HISTORY_WORDS = re.compile(
    rf"\b(?:at|commit) {_SHA}\b|`{_SHA}`|\b20\d\d-[01]\d\b"
    r"|(?i:\b(?:today|yesterday|that day|the day before)\b|\b\w+ host day\b)"
)
# Documents that hold current figures only.
CURRENT_DOCS = ["README.md", "docs/results.md"]
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


@pytest.mark.parametrize("doc", CURRENT_DOCS)
def test_current_docs_hold_no_history(doc):
    hits = [
        f"{doc}:{n}: {m.group(0)!r}: {line.strip()[:100]}"
        for n, line in enumerate((REPO / doc).read_text().splitlines(), 1)
        if (m := HISTORY_WORDS.search(line))
    ]
    assert not hits, "state the current figure and its conditions instead:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "bad",
    [
        "the quickstart at 6daef21 took 20 min",
        "from a fresh clone at commit 9f8a7d2e",
        "built from `d114da3` with the native server",
        "measured on 2026-11-04 on machine D",
        "this host ran faster today",
        "it took 86.5 ms yesterday",
        "a slow host day",
        "the host ran slow that day",
    ],
)
def test_the_history_check_catches(bad):
    assert HISTORY_WORDS.search(bad), bad


@pytest.mark.parametrize(
    "fine",
    [
        "the flags word 0x1f is kept",
        "a mask of 0xdeadbeef",
        "xllamacpp 2026.10.11549",
        "at 1448 s in all",
        "at 1234567 tokens",
        "the `draft_vocab_4096.json` file",
        "`dspark.timing` medians",
        "seeds at deadbeef-free offsets",
    ],
)
def test_the_history_check_allows(fine):
    assert not HISTORY_WORDS.search(fine), fine


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
