"""The draft's vocabulary as the decoder sees it: the target's V tokens, or K of them.

Parallels `dspark/data/draft_vocab.py` (which K ids, counted over a set) and
`dspark/training/draft_vocab.py` (a run's choice of them).

A reduced draft (`config.draft_vocab_size` K < V, dspark/export/vocab.py for the mapping)
scores K draft ids, 0..K-1 in increasing target-id order: its `lm_head` and the Markov
`markov_w2` have K rows, so U_k and the Markov bias are `[B, K]`, while `embed_tokens` and
`markov_w1` keep V rows and read target ids. The decoder therefore works in target ids
everywhere except between a slot's logits and its pick: an argmax or a sample over K is mapped
to its target id at once (`to_target`), so the proposal, the Markov head's next previous token
and the verify pass all see target ids.

For speculative sampling the draft's distribution over the target vocabulary is q(v) =
q_K(draft id of v) for a kept v and 0 elsewhere. It is never materialised as `[B, gamma, V]`:
verification reads q at the drafted tokens (`gather`) and subtracts q from p only in the
kept columns of the one row it resamples (`subtract_from`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def kept_target_ids(draft) -> torch.Tensor | None:
    """The sorted target ids `[K]` (long) a reduced draft scores, or None for a full one.

    Reads the draft's `kept_target_ids` (None: full) when it has that member, else its
    `d2t [K]` buffer (target id = draft id + d2t[draft id]), else the vocabulary is full."""
    if hasattr(draft, "kept_target_ids"):
        ids = draft.kept_target_ids
    else:
        d2t = getattr(draft, "d2t", None)
        ids = None if d2t is None else d2t.long() + torch.arange(d2t.numel(), device=d2t.device)
    return None if ids is None else torch.as_tensor(ids).long()


@dataclass(frozen=True)
class DraftVocab:
    """K kept target ids `ids [K]` (long, strictly increasing, on the decoding device)."""

    ids: torch.Tensor

    @classmethod
    def of(cls, draft, device: torch.device | None = None) -> DraftVocab | None:
        """The reduced vocabulary of `draft`, or None when it scores all V target tokens.

        Checks what can go wrong silently: ids not increasing (a d2t read off by its
        offsets), and an `lm_head` whose rows are not the K kept ids."""
        ids = kept_target_ids(draft)
        if ids is None:
            return None
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError(f"a reduced draft vocabulary needs [K >= 1] ids, got {ids.shape}")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("the draft's kept target ids are not strictly increasing")
        weight = getattr(getattr(draft, "lm_head", None), "weight", None)
        if weight is not None and weight.shape[0] != ids.numel():
            raise ValueError(
                f"the draft's lm_head has {weight.shape[0]} rows for {ids.numel()} kept "
                "target ids: a reduced draft scores exactly its kept ids"
            )
        if device is None and weight is not None:
            device = weight.device
        return cls(ids.to(device) if device is not None else ids)

    @property
    def size(self) -> int:
        """K, the number of draft ids."""
        return int(self.ids.numel())

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of `draft_ids [...]` (long, values in 0..K-1), same shape."""
        return self.ids[draft_ids]

    def gather(self, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """q over the target vocabulary at `tokens [B, L]` (target ids): `q [B, L, K]`
        (draft ids) read at each token's draft id, 0 where the token is not kept."""
        idx = torch.searchsorted(self.ids, tokens.contiguous()).clamp_max(self.size - 1)  # [B, L]
        hit = self.ids[idx] == tokens
        qx = q.gather(-1, idx[..., None]).squeeze(-1)
        return torch.where(hit, qx, torch.zeros_like(qx))

    def subtract_from(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """`p - q` over the target vocabulary: `p [B, V]` minus `q [B, K]` in the kept columns
        (q is 0 elsewhere); a new `[B, V]` tensor, p untouched."""
        return p.index_add(-1, self.ids, q.to(p.dtype), alpha=-1)

    def expand(self, q: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """q over the target vocabulary, materialised: `[..., K] -> [..., V]` (zeros outside
        the kept ids). For checks and callers that need it; decoding never builds it."""
        out = q.new_zeros(*q.shape[:-1], vocab_size)
        return out.index_copy(-1, self.ids, q)
