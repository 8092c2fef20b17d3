"""A run's reduced draft vocabulary (`draft.vocab_size=K`): which K target ids, from which file.

The ids are the K most frequent supervised tokens of the training set (`data.train`), counted
by `dspark.data.draft_vocab` into `draft_vocab_<K>.json`. One tokenized set: the file lies
beside it (where `data_scripts` put it too, so other runs and the exports reuse it). Several
sets (`data.train=a,b`) are counted together into the run directory, never into one of the
sources. A file is reused only while it was counted on the same data (`data_hashes`, the sets'
`dataset_hash`); otherwise it is counted again, so the same data always gives the same ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dspark.data.draft_vocab import write_draft_vocab
from dspark.data.features.feature_cache import dataset_hash
from dspark.errors import BadInputError
from dspark.modeling.vocab_map import mapping_from_ids

FILE = "draft_vocab_{k}.json"


@dataclass(frozen=True)
class DraftVocabChoice:
    """The kept target ids `ids [K]` (sorted) and where they come from."""

    path: Path
    ids: torch.Tensor
    coverage: float  # share of the supervised tokens the K ids cover

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    def record(self) -> dict[str, Any]:
        """What the run records about it (run_config.json's `draft_vocab`, results.json)."""
        return {"file": str(self.path), "size": self.size, "coverage": self.coverage}


def requested_size(cfg, vocab_size: int) -> int | None:
    """`draft.vocab_size` checked against the target (None: the full vocabulary)."""
    k = getattr(cfg.draft, "vocab_size", None)
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab_size:
        raise BadInputError(
            f"draft.vocab_size={k} is out of range: the draft's vocabulary holds 1..{vocab_size} "
            f"of the target's {vocab_size} tokens; pass draft.vocab_size=K with 1 <= K <= "
            f"{vocab_size}, or null for the full vocabulary"
        )
    return None if k == vocab_size else int(k)


def train_dirs(cfg) -> list[Path]:
    return [Path(p.strip()).expanduser() for p in str(cfg.data.train).split(",") if p.strip()]


def vocab_path(cfg, k: int) -> Path:
    """Where the run's `draft_vocab_<k>.json` lies: beside one training set, or in the run
    directory for several."""
    dirs = train_dirs(cfg)
    name = FILE.format(k=k)
    return dirs[0] / name if len(dirs) == 1 else Path(cfg.trainer.output_dir) / name


def _reusable(path: Path, k: int, vocab_size: int, hashes: list[str]) -> dict | None:
    """The file's contents when it holds `k` ids of this vocabulary counted on this data."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # a damaged file: counted again and replaced
    ok = (
        isinstance(doc, dict)
        and doc.get("size") == k
        and doc.get("vocab_size") == vocab_size
        and doc.get("data_hashes") == hashes
        and isinstance(doc.get("ids"), list)
        and len(doc["ids"]) == k
    )
    return doc if ok else None


def choose_draft_vocab(cfg, vocab_size: int) -> DraftVocabChoice | None:
    """The run's kept target ids (None for the full vocabulary), reading or writing the file."""
    k = requested_size(cfg, vocab_size)
    if k is None:
        return None

    dirs = train_dirs(cfg)
    missing = [str(d) for d in dirs if not (d / "state.json").is_file()]
    if missing:
        raise BadInputError(
            f"draft.vocab_size={k} counts the draft vocabulary over data.train, but "
            f"{', '.join(missing)} is not a tokenized set (yet): point data.train at tokenized "
            "sets (data_scripts/regenerate.py ... --tokenize), or drop draft.vocab_size"
        )
    path = vocab_path(cfg, k)
    hashes = [dataset_hash(d) for d in dirs]
    doc = _reusable(path, k, vocab_size, hashes)
    if doc is None:
        write_draft_vocab(dirs if len(dirs) > 1 else dirs[0], k, vocab_size, out_path=path)
        doc = json.loads(path.read_text())
    ids = torch.tensor(doc["ids"], dtype=torch.long)
    mapping_from_ids(ids, vocab_size, source=str(path))  # in range, no repeats
    return DraftVocabChoice(path=path, ids=torch.unique(ids), coverage=float(doc["coverage"]))
