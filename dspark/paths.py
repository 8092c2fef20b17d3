"""Where the run-config files live: `conf/` (Hydra groups) and `recipes/` (experiments).

They belong to the checkout, not to the installed package, and every README command runs
from the checkout root (run directories and recipe data paths are relative to it), so the
library never derives them from its own install location. Search order, first hit wins:

1. `$DSPARK_CONF` / `$DSPARK_RECIPES`: an explicit directory;
2. `conf/` / `recipes/` under the current directory (the checkout root);
3. the source tree of an editable install (`pip install -e .`, as `make setup` does), read
   from the installed distribution's PEP 610 `direct_url.json`.

The scripts under `train/` and `eval/` pass their own checkout's directories instead.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

from dspark.errors import MissingPathError

ENV = {"conf": "DSPARK_CONF", "recipes": "DSPARK_RECIPES"}


def cache_root() -> Path:
    """dspark's cache (`$DSPARK_CACHE`, default `~/.cache/dspark`)."""
    return Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark")).expanduser()


def editable_checkout() -> Path | None:
    """The source directory of an editable `dspark` install, or None (wheel or not installed)."""
    try:
        text = metadata.distribution("dspark").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    info = json.loads(text)
    url = info.get("url", "")
    if not info.get("dir_info", {}).get("editable") or not url.startswith("file://"):
        return None
    return Path(url[len("file://") :])


def find_dir(name: str) -> Path:
    """The `conf` or `recipes` directory by the search order above, or a `MissingPathError`."""
    env = ENV[name]
    if os.environ.get(env):
        path = Path(os.environ[env]).expanduser()
        if not path.is_dir():
            raise MissingPathError(f"${env}={path} is not a directory; unset it or fix the path")
        return path
    candidates = [Path.cwd() / name]
    checkout = editable_checkout()
    if checkout is not None:
        candidates.append(checkout / name)
    for path in candidates:
        if path.is_dir():
            return path
    raise MissingPathError(
        f"no {name}/ directory found (looked in {', '.join(str(c) for c in candidates)}); run "
        f"from the dspark checkout or set {env}=/path/to/dspark/{name}"
    )


# The folder of the benchmark prompt sets (gsm8k.jsonl, mt-bench.jsonl, ...): read by the
# benchmark (dspark/eval/prompts.py) and by the prompt sources that must never copy them
# (dspark/data/prompt_filter.py), so it lives here, below both. Only an explicit folder or the
# variable names it: the library assumes no data folder beside its checkout.
BENCH_ENV = "DSPARK_BENCH_DIR"


def data_dir_or_none(
    given: str | os.PathLike | None,
    label: str,
    env: str,
    holds: str,
) -> Path | None:
    """`given` (named `label` in the error), else `$env` (each must exist: a `MissingPathError`
    naming `holds`, what the folder is for, otherwise), else None."""
    for value, key in ((given, label), (os.environ.get(env), env)):
        if value:
            path = Path(value).expanduser()
            if not path.is_dir():
                raise MissingPathError(
                    f"{key}={value}: no such directory; point it at the folder of {holds}"
                )
            return path
    return None


def bench_dir_or_none(given: str | os.PathLike | None, label: str = "bench_dir") -> Path | None:
    """The bench-set folder by `data_dir_or_none`'s order, `$DSPARK_BENCH_DIR` its variable."""
    return data_dir_or_none(
        given,
        label,
        BENCH_ENV,
        "the bench sets (gsm8k.jsonl, mt-bench.jsonl, ...)",
    )
