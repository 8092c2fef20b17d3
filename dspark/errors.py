"""User errors: expected mistakes that end with one line naming the problem and the fix.

A missing path, a directory that is not what a key asks for (a draft, a tokenized set), a
value outside its choices or a key left unset are the user's to fix, so a traceback into
transformers or datasets only hides the fix. The library raises a `UserError` subclass at the
point it detects such a mistake (the message says what is wrong and what to do); the entry
scripts' one boundary, `user_errors()`, prints it as `error: <message>` on stderr and exits
with status 2 (argparse's status for a bad command line). Anything else is a bug and keeps
its traceback.

The subclasses also derive from the built-in type a caller would catch for the same
mistake (`FileNotFoundError`, `ValueError`), so library callers keep working unchanged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

EXIT_USER_ERROR = 2
# The exit status of a job that stopped unfinished on purpose (a time budget per run): rerun
# the same command to continue. EX_TEMPFAIL (sysexits.h), so a script or make step tells it
# from success (0) and from errors.
EXIT_UNFINISHED = 75


class UserError(Exception):
    """A mistake in the user's input; `str(error)` names the problem and the fix."""


class StoppedWithWorkLeft(Exception):
    """A long job reached its time budget at a safe point (its state saved); rerunning the same
    command continues it. The entry scripts turn it into exit status `EXIT_UNFINISHED`."""


class MissingPathError(UserError, FileNotFoundError):
    """A path the user passed does not exist."""


class BadInputError(UserError, ValueError):
    """A path or value the user passed exists but is not what the key asks for."""


class MissingPackageError(UserError, ImportError):
    """An optional package the chosen option needs is not installed (the message says which)."""


@contextmanager
def user_errors(
    prog: str | None = None, also: tuple[type[BaseException], ...] = ()
) -> Iterator[None]:
    """Entry-script boundary: a `UserError` (or one of `also`, e.g. a library's own config
    error whose message already names the fix) becomes `error: ...` on stderr, exit status 2."""
    caught: tuple[type[BaseException], ...] = (UserError, *also)
    try:
        yield
    except caught as e:
        prefix = f"{prog}: " if prog else ""
        print(f"{prefix}error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None


def require_dir(path: str | Path, key: str, fix: str) -> Path:
    """`path` as an existing directory, else a `MissingPathError` naming `key` and `fix`."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingPathError(f"{key}={path}: no such directory. {fix}")
    if not p.is_dir():
        raise BadInputError(f"{key}={path} is a file, not a directory. {fix}")
    return p


DRAFT_FIX = (
    "Pass the `draft/` folder a training run writes (runs/<recipe>/draft), or any directory "
    "saved by DSparkDraftModel.save_pretrained."
)


def require_draft_dir(path: str | Path, key: str = "draft") -> Path:
    """`path` as a DSpark draft directory (a config.json with the DSpark keys), else a
    `UserError` that says what the directory is instead and which folder to pass."""
    p = require_dir(path, key, DRAFT_FIX)
    config = p / "config.json"
    if not config.exists():
        hint = ""
        if (p / "draft" / "config.json").exists():
            hint = f" (did you mean {key}={p / 'draft'}?)"
        elif (p / "model.safetensors").exists():
            hint = " (it looks like a training checkpoint: Accelerate state, not a draft)"
        raise BadInputError(f"{key}={path} holds no config.json{hint}. {DRAFT_FIX}")
    try:
        keys = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise BadInputError(f"{config} is not valid JSON ({e}). {DRAFT_FIX}") from None
    if not {"block_size", "target_layer_ids"} <= set(keys):
        kind = keys.get("model_type", "unknown")
        raise BadInputError(
            f"{key}={path} is not a DSpark draft: its config.json (model_type {kind!r}) has no "
            f"block_size / target_layer_ids. {DRAFT_FIX}"
        )
    return p
