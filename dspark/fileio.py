"""File writing shared by every writer: strict JSON, atomic replacement, the user's umask.

Some writers (transformers' `save_pretrained`, `tempfile.mkstemp` / `mkdtemp`) create files
0600 and directories 0700, so a draft or export would be unreadable by the user's group even
where every other file they write is not; `apply_umask` gives such a tree the modes an ordinary
`open()` / `mkdir()` would have given it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dspark.errors import BadInputError


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in 4 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike) -> None:
    """Set `path` (a file, or a directory and everything below it) to the modes a plain
    `open()` (0666) or `mkdir()` (0777) gives under the process umask."""
    mask = current_umask()
    root = Path(path)
    if not root.is_dir():
        root.chmod(0o666 & ~mask)
        return
    root.chmod(0o777 & ~mask)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            (Path(dirpath) / d).chmod(0o777 & ~mask)
        for f in filenames:
            (Path(dirpath) / f).chmod(0o666 & ~mask)


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by None: `json.dumps` would write bare
    `NaN` / `Infinity`, which strict JSON readers (jq, JavaScript, Go) reject."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def dumps_strict(value: Any, **kwargs) -> str:
    """Strict JSON text (`allow_nan=False` after `finite_json`): NaN / inf become null."""
    return json.dumps(finite_json(value), allow_nan=False, **kwargs)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` through a temporary sibling and a rename: a reader (or a run
    killed mid-write) never sees half a file. The file gets the umask's mode."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling directory to write `out` into; when the block ends without an error
    it replaces `out` (a previous one is swapped out and removed), on any failure it is removed
    and nothing is left behind. A reader of `out` sees the old directory or the new one whole."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:  # no permission, a file on the way, a read-only file system
        raise BadInputError(
            f"cannot create the output directory {out} ({e.strerror}: {e.filename}); choose "
            "a directory you can write"
        ) from None
    try:
        yield tmp
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_into_place(tmp: Path, out: Path) -> None:
    apply_umask(tmp)  # mkdtemp makes the directory 0700
    if out.exists():
        old = tmp.with_name(tmp.name + ".old")
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
