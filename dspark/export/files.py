"""The files of a draft on disk, read with one-line errors: a JSON object (config.json, an index)
and a safetensors file. Below both readers of drafts, `dspark/export/load.py` and
`dspark/export/vocab.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dspark.errors import BadInputError

RESAVE = (
    "re-save or re-export the draft (a copy cut off mid-write, or edited by hand, is not readable)"
)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or a `BadInputError` naming the file (cut off, not JSON, not
    an object)."""
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path} is not valid JSON ({e}); {RESAVE}") from None
    if not isinstance(raw, dict):
        raise BadInputError(f"{path} holds a JSON {type(raw).__name__}, not an object; {RESAVE}")
    return raw


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise BadInputError(f"{path} is not a readable safetensors file ({e}); {RESAVE}") from None
