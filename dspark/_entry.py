"""The environment of an entry script, set when it is imported: the first `dspark` import of
every script under `eval/` (`import dspark._entry`, before anything loads `transformers`).

- `HF_HUB_OFFLINE=1`: everything these scripts read is local, and a hub look-up without a
  network hangs ~50 s before failing;
- `TOKENIZERS_PARALLELISM=false`: no fork warning from `tokenizers` in data loaders.

Each is a default (`os.environ.setdefault`): a variable the caller set is kept. The library
itself never sets them; the console entry points set theirs in `dspark.cli`.
"""

from __future__ import annotations

import os

DEFAULTS = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def apply(defaults: dict[str, str] = DEFAULTS) -> None:
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


apply()
