"""The reduced draft vocabulary's id maps, as the draft holds them (method doc, section 7).

A reduced draft scores K of the target's V tokens; its draft ids 0..K-1 are the kept target
ids in increasing order. Two tensors say which (the EAGLE-3 / speculators / vLLM convention):
`d2t [K]` int64 offsets, target id = draft id + d2t[draft id], and `t2d [V]` bool, True at the
kept target ids. A d2t that is off by one collapses acceptance without an error, so every
mapping is checked where it is built or read.
"""

from __future__ import annotations

import torch

from dspark.errors import BadInputError


def mapping_from_ids(
    ids, vocab_size: int, *, source: str = "draft vocabulary"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target ids the draft keeps (any order, no repeats) -> `(d2t [K] long, t2d [V] bool)`."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
    if ids.numel() == 0:
        raise BadInputError(f"{source} is empty: keep at least one token")
    uniq = torch.unique(ids)  # sorted
    if uniq.numel() != ids.numel():
        raise BadInputError(f"{source} repeats token ids; list each kept target id once")
    if int(uniq[0]) < 0 or int(uniq[-1]) >= vocab_size:
        raise BadInputError(
            f"{source} holds ids outside the target vocabulary [0, {vocab_size}) "
            f"(min {int(uniq[0])}, max {int(uniq[-1])}): it was built for another tokenizer"
        )
    d2t = uniq - torch.arange(uniq.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[uniq] = True
    return d2t, t2d


def ids_from_d2t(d2t: torch.Tensor, vocab_size: int, *, source: str = "d2t") -> torch.Tensor:
    """Check a `d2t` tensor and return the kept target ids `[K]` (long, strictly increasing)."""
    d2t = torch.as_tensor(d2t).flatten()
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise BadInputError(f"{source} must hold integer offsets (got {d2t.dtype})")
    K = d2t.numel()
    if not 0 < K <= vocab_size:
        raise BadInputError(
            f"{source} has {K} entries, but a draft vocabulary holds 1..{vocab_size} tokens of "
            "this target: it belongs to another target, or is not a d2t (t2d has one entry per "
            "target token)"
        )
    ids = d2t.long() + torch.arange(K, device=d2t.device)
    if K > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise BadInputError(
            f"{source} maps draft ids to target ids that are not strictly increasing"
        )
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise BadInputError(
            f"{source} maps to target ids outside [0, {vocab_size}): built for another target"
        )
    return ids


def check_t2d(t2d: torch.Tensor, ids: torch.Tensor, *, source: str = "t2d") -> None:
    """`t2d [V]` must be True exactly at the kept target ids `ids [K]` (what d2t says)."""
    want = torch.zeros(t2d.numel(), dtype=torch.bool, device=t2d.device)
    want[ids.to(t2d.device)] = True
    if t2d.dtype != torch.bool or not torch.equal(t2d.flatten(), want):
        raise BadInputError(
            f"{source} does not mark the target ids its d2t maps to: the two maps were written "
            "for different vocabularies; re-export the draft"
        )
