"""One writer per output (dspark/locking.py): the lock itself, across processes and threads,
and every writer that holds it.

A second writer is refused with one `error:` line naming the holder; a killed holder's lock is
taken over; a record left by a writer on another host is reported, never broken; a cache
entry's second writer waits and reads the first's result; a reader refuses a set being
written.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from dspark.locking import (
    OutputBusyError,
    exclusive_output,
    holder,
    lock_file_for,
    refuse_if_being_written,
)

REPO = Path(__file__).resolve().parents[1]
HOLD = """
import sys, time
from dspark.locking import exclusive_output
with exclusive_output(sys.argv[1], "the test output"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _env(**extra) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


@contextmanager
def held_elsewhere(path: Path, seconds: float = 60.0):
    """A separate process holding `path`'s lock; yields it once the lock is held."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def held_by_thread(path: Path):
    """Another thread of this process holding `path`'s lock (a second writer for this one)."""
    taken, done = threading.Event(), threading.Event()

    def hold():
        with exclusive_output(path, "the test output"):
            taken.set()
            done.wait(60)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert taken.wait(30)
    try:
        yield
    finally:
        done.set()
        t.join(30)


def test_a_second_process_is_refused_with_the_holder_named(tmp_path):
    out = tmp_path / "out"
    with held_elsewhere(out) as proc:
        with pytest.raises(OutputBusyError) as e:
            with exclusive_output(out, "the test output"):
                pass
        msg = str(e.value)
        assert f"pid {proc.pid} on host {socket.gethostname()}" in msg
        assert "-c" in msg and "since 20" in msg  # the command and its start time
        assert "Wait for that job to finish, or choose another output" in msg
        assert holder(out)["pid"] == proc.pid
    assert holder(out) is None  # its end released the lock
    with exclusive_output(out):
        assert holder(out)["pid"] == os.getpid()
    assert holder(out) is None and not lock_file_for(out).exists()  # nothing left beside it


def test_a_killed_holder_is_taken_over(tmp_path):
    out = tmp_path / "out"
    with held_elsewhere(out) as proc:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = json.loads(lock_file_for(out).read_text())
        assert left["pid"] == proc.pid  # it never cleared its record
        with exclusive_output(out):
            assert holder(out)["pid"] == os.getpid()


def test_a_record_from_another_host_is_reported_not_broken(tmp_path):
    out = tmp_path / "out"
    lock = lock_file_for(out)
    other = {"pid": 4242, "host": "node-b", "command": "distill.py", "started": "x"}
    lock.write_text(json.dumps(other))  # storage whose locks this host does not see
    with pytest.raises(OutputBusyError, match=f"pid 4242 on host node-b .*delete {lock}"):
        with exclusive_output(out):
            pass
    assert json.loads(lock.read_text()) == other  # left as it was
    lock.unlink()  # what the message tells a user to do once that job has ended
    with exclusive_output(out):
        pass


def test_another_thread_is_a_second_writer_but_the_same_thread_reenters(tmp_path):
    out = tmp_path / "out"
    with held_by_thread(out):
        with pytest.raises(OutputBusyError):
            with exclusive_output(out):
                pass
    with exclusive_output(out):
        with exclusive_output(tmp_path / "out"):  # a writer calling another writer
            assert holder(out)["pid"] == os.getpid()
        assert holder(out) is not None  # still held by the outer block
    assert holder(out) is None


def test_a_cache_writer_waits_for_the_first(tmp_path):
    out = tmp_path / "entry.json"
    said = []
    with held_elsewhere(out, seconds=1.5) as proc:
        t0 = time.monotonic()
        with exclusive_output(out, "the cache entry", wait=30, log=said.append):
            waited = time.monotonic() - t0
    assert waited > 0.3 and len(said) == 1 and f"pid {proc.pid}" in said[0]
    with held_elsewhere(out):
        with pytest.raises(OutputBusyError):  # a bounded wait ends in the same refusal
            with exclusive_output(out, wait=0.3):
                pass


def test_a_reader_refuses_a_set_being_written(tmp_path):
    data = tmp_path / "tokenized"
    refuse_if_being_written(data, "data dir")  # nobody writes it
    with held_elsewhere(data):
        with pytest.raises(OutputBusyError, match="reading it now would read a set"):
            refuse_if_being_written(data, "data dir")
    with exclusive_output(data):
        refuse_if_being_written(data, "data dir")  # the writer itself may read it


def test_the_lock_sits_beside_the_output_so_a_renamed_directory_keeps_it(tmp_path):
    assert lock_file_for(tmp_path / "a" / "out") == tmp_path / "a" / ".out.lock"
    assert lock_file_for(tmp_path / "a" / ".." / "a" / "out") == tmp_path / "a" / ".out.lock"


def test_many_waiters_never_hold_at_once(tmp_path):
    """Holders remove the lock file on release; a waiter that had opened the removed file must
    not hold it beside one that opened the new one."""
    out = tmp_path / "entry"
    inside, overlaps = [0], []

    def job():
        for _ in range(15):
            with exclusive_output(out, wait=30):
                inside[0] += 1
                overlaps.append(inside[0])
                time.sleep(0.002)
                inside[0] -= 1

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(overlaps) == 60 and max(overlaps) == 1
