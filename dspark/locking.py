"""One writer per output: a lock that a second writer meets as one error line naming the first.

Every command that writes a directory or a cache entry (regeneration, tokenization, feature
caches, Magpie prompts, a training run directory, an export, a benchmark's output, the probe
caches, the target and llama.cpp builds) holds `exclusive_output(path)` while it writes.

The lock is `fcntl.flock` on a sibling file, `.<name>.lock` beside `path` (beside, not inside:
an export or a tokenized set is replaced by renaming a finished directory into place, which
must not move its own lock away). The kernel drops a flock when its holder's process ends, a
`kill -9` included, so an ended writer never blocks the next one. While it holds the lock a
writer keeps its record in that file (pid, host, command, start time); a second writer reads it
and gets `OutputBusyError`, whose message names the holder and the two fixes: wait for it, or
choose another output. A writer that ends well removes the file (while still holding it; a job
that opened it meanwhile sees it unlinked once it gets the lock, and opens the path anew), so
only a killed writer leaves one, which the next writer takes over. Entries of a shared cache are instead waited for (`wait=` seconds): the
second job then reads what the first computed.

Where storage is shared between machines (NFS, Lustre), flock reaches across hosts on file
systems that support it, and the record says on which host the holder runs. A record left
behind by a writer on another host, on storage whose locks this host does not see, is reported
and never broken: only its owner can know that job has ended. A record left on this host by a
process that ended is taken over.

A lock is re-entrant within one thread (a command that calls another writer for the same
output); another thread of the same process is a second writer, as another process is.
"""

from __future__ import annotations

import fcntl
import functools
import inspect
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dspark.errors import BadInputError
from dspark.fileio import current_umask

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# How long a refused writer waits for the holder's record to appear: a holder writes it right
# after taking the lock, so a writer that lost the race by microseconds may find it empty.
RECORD_WAIT_S = 1.0
POLL_S = 0.2
# How long a job waits for another that is computing the cache entry it needs (a probe, a
# profile, the target's summaries, the embedded target): long enough for the slowest of them.
CACHE_WAIT_S = 3600.0


class OutputBusyError(BadInputError):
    """Another job is writing the output (the message names it and the fixes)."""


@dataclass
class _Hold:
    fd: int
    count: int


_held: dict[tuple[str, int], _Hold] = {}  # (lock file, thread id) -> this thread's hold
_held_guard = threading.Lock()


def lock_file_for(path: str | os.PathLike) -> Path:
    """The lock file of `path` (a directory or a file): `.<name>.lock` beside it."""
    p = Path(path).expanduser().resolve()  # one lock for every spelling of the path
    return p.parent / f".{p.name}.lock"


def _record() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv else "",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _read_record(fd: int) -> dict | None:
    try:
        text = os.pread(fd, 65536, 0).decode("utf-8", "replace").strip()
        return json.loads(text) if text else None
    except (OSError, json.JSONDecodeError):
        return None


def _write_record(fd: int, record: dict) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fsync(fd)


def describe(record: dict | None) -> str:
    """`pid 123 on host h (regenerate.py --output d), since 2026-...Z`."""
    if not record:
        return "another process (it has not written its record yet)"
    return (f"pid {record.get('pid')} on host {record.get('host')} "
            f"({record.get('command') or 'unknown command'}), since {record.get('started')}")  # fmt: skip


def _busy(path: Path, what: str, record: dict | None, extra: str = "") -> OutputBusyError:
    return OutputBusyError(
        f"{what} {path} is being written by {describe(record)}{extra}. Wait for that job to "
        "finish, or choose another output"
    )


def _open(lock: Path) -> int:
    lock.parent.mkdir(parents=True, exist_ok=True)
    return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 & ~current_umask())


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holder(path: str | os.PathLike) -> dict | None:
    """The record of the job writing `path` now, or None when no job holds its lock."""
    lock = lock_file_for(path)
    if not lock.exists():
        return None
    fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _try_lock(fd, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return _read_record(fd) or {}
    finally:
        os.close(fd)


def refuse_if_being_written(path: str | os.PathLike, what: str) -> None:
    """A reader's check: `OutputBusyError` when another job holds `path`'s writer lock, so a
    set is never read while it is (re)written."""
    key = (str(lock_file_for(path)), threading.get_ident())
    if key in _held:  # this thread writes it itself
        return
    found = holder(path)
    if found is not None:
        raise OutputBusyError(
            f"{what} {Path(path)} is being written by {describe(found)}: reading it now would "
            "read a set that is not finished. Wait for that job to finish, then run again"
        )


@contextmanager
def exclusive_output(
    path: str | os.PathLike, what: str = "output", *, wait: float = 0.0, log=None
) -> Iterator[Path]:
    """Hold `path`'s writer lock for the block (see the module docstring); yields `path`.

    A second writer gets `OutputBusyError` at once, or with `wait > 0` waits up to that many
    seconds for the holder to finish first (saying once whom it waits for, through `log`,
    default stderr)."""
    target = Path(path).expanduser()
    lock = lock_file_for(target)
    key = (str(lock), threading.get_ident())
    with _held_guard:
        hold = _held.get(key)
        if hold is not None:
            hold.count += 1
    if hold is not None:
        try:
            yield target
        finally:
            hold.count -= 1
        return
    fd = _acquire(lock, target, what, wait, log)
    with _held_guard:
        _held[key] = _Hold(fd, 1)
    try:
        yield target
    finally:
        with _held_guard:
            del _held[key]
        try:
            # removed while still held, so no lock file is left beside the output; a job that
            # opened it meanwhile finds it unlinked once it gets the lock, and opens anew
            lock.unlink(missing_ok=True)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def read_or_compute(path: str | os.PathLike, what: str, read: Callable[[], T | None],
                    compute: Callable[[], T]) -> T:  # fmt: skip
    """A cache entry: `read()` when it finds it, with no lock taken; else, under the entry's
    lock (waiting up to `CACHE_WAIT_S` for a job computing it now), `read()` once more and
    only then `compute()` (which writes the entry)."""
    found = read()
    if found is not None:
        return found
    with exclusive_output(path, what, wait=CACHE_WAIT_S):
        found = read()
        return found if found is not None else compute()


def writes_output(param: str, what: str) -> Callable[[F], F]:
    """Decorate a writer: each call holds `exclusive_output` on its argument `param` (a path)."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def held(*args, **kwargs):
            with exclusive_output(sig.bind(*args, **kwargs).arguments[param], what):
                return fn(*args, **kwargs)

        return held  # type: ignore[return-value]

    return decorate


def _is_current(fd: int, lock: Path) -> bool:
    """Whether `fd` is still the file at `lock` (a released holder unlinks it)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(lock))
    except FileNotFoundError:
        return False


def _acquire(lock: Path, target: Path, what: str, wait: float, log) -> int:
    """The descriptor of `lock`, flocked and holding this process's record."""
    deadline = time.monotonic() + wait
    said = False
    while True:
        fd = _open(lock)
        try:
            if _wait_for(fd, target, what, deadline, said, log):
                said = True
            if _is_current(fd, lock):
                _claim(fd, lock, target, what)
                return fd
            fcntl.flock(fd, fcntl.LOCK_UN)  # the file a released holder unlinked: anew
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _wait_for(fd: int, target: Path, what: str, deadline: float, said: bool, log) -> bool:
    """Flock `fd`, waiting until `deadline` (saying once whom for); whether it said so."""
    while not _try_lock(fd, fcntl.LOCK_EX):
        record = _read_record(fd)
        if record is None:  # the holder is between taking the lock and writing its record
            end = time.monotonic() + RECORD_WAIT_S
            while record is None and time.monotonic() < end:
                time.sleep(0.05)
                record = _read_record(fd)
        if time.monotonic() >= deadline:
            raise _busy(target, what, record)
        if not said:
            say = log or (lambda m: print(m, file=sys.stderr, flush=True))
            say(f"waiting for {describe(record)}, which is writing {what} {target}")
            said = True
        time.sleep(POLL_S)
    return said


def _claim(fd: int, lock: Path, target: Path, what: str) -> None:
    left = _read_record(fd)  # a record its writer never removed: that writer did not end well
    if left and left.get("host") != socket.gethostname():
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise _busy(
            target,
            what,
            left,
            extra=(
                "; its lock is not visible from this host on this storage, so it is not broken "
                f"here. If that job has ended, delete {lock}"
            ),
        )
    _write_record(fd, _record())
