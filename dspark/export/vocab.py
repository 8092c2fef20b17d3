"""Reduced draft vocabularies: `d2t` / `t2d` as EAGLE-3, speculators and vLLM read them.

A reduced draft predicts over K of the target's V tokens (draft ids 0..K-1, in increasing
target-id order). `d2t [K]` (int64) holds offsets: target id = draft id + d2t[draft id];
`t2d [V]` (bool) marks the target ids the draft can propose. The draft's `lm_head` and Markov
`markov_w2` keep only those K rows; `embed_tokens` and `markov_w1` stay over the full target
vocabulary (they read target tokens). A d2t that is regenerated or off by one collapses
acceptance silently, so every mapping is checked here before it is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dspark.errors import BadInputError, MissingPathError
from dspark.export.files import read_safetensors
from dspark.modeling.vocab_map import ids_from_d2t, mapping_from_ids

__all__ = ["export_kept_ids", "ids_from_d2t", "kept_ids", "mapping_from_ids", "read_vocab_file"]


def read_vocab_file(path: str | os.PathLike, vocab_size: int) -> torch.Tensor:
    """Kept target ids from a file: `.json` (a list of ids, or {"d2t": [...]}), `.safetensors`
    or `.pt` holding `d2t` (offsets) or `ids` (target ids)."""
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"draft vocabulary file {p} does not exist")
    if p.suffix == ".json":
        try:
            raw = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadInputError(f"{p} is not valid JSON ({e}); rewrite the file") from None
        if isinstance(raw, dict):
            if "d2t" in raw:
                return ids_from_d2t(torch.tensor(raw["d2t"]), vocab_size, source=f"{p}: d2t")
            raw = raw.get("ids")
        if not isinstance(raw, list):
            raise BadInputError(f"{p}: expected a JSON list of target ids, or {{'d2t': [...]}}")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
            raise BadInputError(f"{p}: expected a JSON list of integer target ids")
        ids = torch.tensor(raw, dtype=torch.long)
        mapping_from_ids(ids, vocab_size, source=str(p))
        return torch.unique(ids)
    if p.suffix == ".safetensors":
        tensors = read_safetensors(p)
    elif p.suffix in (".pt", ".pth"):
        try:
            tensors = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle's and torch's errors for a damaged / foreign file
            raise BadInputError(f"{p} is not a readable torch file ({e})") from None
        if isinstance(tensors, torch.Tensor):
            tensors = {"d2t": tensors}
        if not isinstance(tensors, dict):
            raise BadInputError(f"{p} holds a {type(tensors).__name__}, not d2t / ids tensors")
    else:
        raise BadInputError(
            f"{p}: unknown draft vocabulary file type; use .json, .safetensors or .pt"
        )
    if "d2t" in tensors:
        return ids_from_d2t(tensors["d2t"], vocab_size, source=f"{p}: d2t")
    if "ids" in tensors:
        ids = tensors["ids"].long()
        mapping_from_ids(ids, vocab_size, source=f"{p}: ids")
        return torch.unique(ids)
    raise BadInputError(f"{p} holds neither `d2t` nor `ids` (found {sorted(tensors)})")


def kept_ids(draft_vocab, vocab_size: int) -> torch.Tensor | None:
    """The sorted target ids a reduced draft vocabulary keeps, from `draft_vocab` (None: the
    full vocabulary; ids as a tensor / list, or a .json / .safetensors / .pt file of ids or
    d2t), checked against `vocab_size`."""
    if draft_vocab is None:
        return None
    if isinstance(draft_vocab, (str, os.PathLike)):
        return read_vocab_file(draft_vocab, vocab_size)
    mapping_from_ids(draft_vocab, vocab_size)  # validates: in range, no duplicates
    return torch.unique(torch.as_tensor(draft_vocab, dtype=torch.long))


def export_kept_ids(draft, draft_vocab) -> torch.Tensor | None:
    """The sorted target ids an export of `draft` keeps (None: the full vocabulary).

    A draft that is already reduced (`config.draft_vocab_size`) exports its own ids; a
    `draft_vocab` given with it must name exactly those ids (an export cannot restore rows
    the draft no longer has, and a different map would score the wrong tokens)."""
    V = int(draft.config.vocab_size)
    asked = kept_ids(draft_vocab, V)
    own = getattr(draft, "kept_target_ids", None)
    if own is None:
        return asked
    own = own.detach().cpu()
    if asked is not None and not torch.equal(asked, own):
        raise BadInputError(
            f"the draft already has a reduced vocabulary of {own.numel()} tokens, and "
            f"draft_vocab names other ids ({asked.numel()} tokens): drop --draft-vocab to export "
            "the draft's own, or export the full-vocabulary draft it was trained from"
        )
    return own
