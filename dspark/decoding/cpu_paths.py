"""CPU-only fast paths of the decoder, exact or within fp32 rounding of the plain path.

- `matvec_head_logits`: a large-vocab, bias-free head applied to a few rows as `(W @ h^T)^T`
  (faster than `F.linear` on a CPU; used for the target's and the draft's `lm_head`);
- `GreedyPruner`: the T = 0 Markov step that multiplies only the rows of `markov_w2` whose
  logit can still be the argmax (Cauchy-Schwarz bound).

Both work on whatever rows the draft's heads have: V, or K for a reduced draft vocabulary
(draft_vocab.py), whose logits and argmax are then over draft ids (the caller maps them).

`DecoderOptions(cpu_fast_paths=False)` (passed on to `TargetRunner` and `propose`) turns
both off; on (the default) they apply only where their conditions hold (a CPU tensor;
T = 0 and the reference Markov `step` for the pruner), so other devices run the plain path
either way. tests/test_decoding.py checks that greedy outputs are identical on and off.
"""

from __future__ import annotations

import weakref

import torch

from dspark.modeling.heads import MarkovHead


def matvec_head_logits(head, hidden: torch.Tensor) -> torch.Tensor | None:
    """`head(hidden)` in fp32 as `(W @ h^T)^T`, or None where this path does not apply.

    Applies to a bias-free `nn.Linear` with vocab >= 8 x hidden on CPU rows (2..64 of them),
    where `F.linear` of a few rows against a tall head is the slower call (docs/results.md,
    "Decoder internals"); identical for one row."""
    weight = getattr(head, "weight", None)
    rows = hidden.numel() // hidden.shape[-1]
    if not (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and hidden.device.type == "cpu"
        and 1 < rows <= 64
        and weight.shape[0] >= 8 * weight.shape[1]
    ):
        return None
    flat = hidden.reshape(rows, hidden.shape[-1]).to(weight.dtype)
    return (weight @ flat.T).T.reshape(*hidden.shape[:-1], weight.shape[0]).float()


class GreedyPruner:
    """Exact T = 0 Markov step that skips most of the `markov_w2` GEMV (CPU).

    For DSpark's Markov heads (`bias = W2 @ mixed`, `mixed = mix(h_k, W1[x_{k-1}])`), Cauchy-
    Schwarz bounds every logit: |bias_v| <= ||W2_v|| * ||mixed||. Tokens whose upper bound
    lies below the best lower bound cannot be the argmax, so only the remaining candidate rows
    of W2 are multiplied (the full 49152 x 256 GEMV otherwise dominates the serial loop on a
    CPU). Falls back to the full product when the bound prunes little. Used only for heads that
    keep the reference `step`; any other head goes through its own `step`.
    `step(u_k, h_k, prev, state) -> (token [B], feat [B, r], new_state)`, feat = W1[prev];
    `u_k [B, K]` and the returned token are over the head's K rows (draft ids; K = V for a full
    vocabulary), `prev [B]` is a target id (W1 keeps all V rows).
    """

    _cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, head):
        self.head = head
        self.w2 = head.markov_w2.weight
        self.row_norms = self.w2.float().norm(dim=1)
        self.version = self.w2._version

    @classmethod
    def for_round(cls, head, greedy: bool, device: torch.device):
        """The pruner for this draft round, or None (sampling, not a CPU, another head)."""
        if not greedy or device.type != "cpu":
            return None
        return cls.get(head)

    @classmethod
    def get(cls, head):
        if not isinstance(head, MarkovHead) or type(head).step is not MarkovHead.step:
            return None
        pruner = cls._cache.get(head)
        if pruner is None or pruner.version != pruner.w2._version:  # weights changed: redo norms
            pruner = cls._cache[head] = cls(head)
        return pruner

    def pick(self, u_k, h_k, prev, state):
        """`step`, shaped as the draft loop's Markov step (draft_step.py): no q at T = 0."""
        return (*self.step(u_k, h_k, prev, state), None)

    def step(self, u_k, h_k, prev, state):
        emb = self.head.markov_w1(prev)
        mixed, state = self.head.mix(h_k, emb.to(h_k.dtype), state)
        radius = mixed.float().norm(dim=-1, keepdim=True) * self.row_norms
        lower = (u_k - radius).max(dim=-1, keepdim=True).values
        cand = ((u_k + radius) >= lower).any(dim=0).nonzero().squeeze(1)
        if cand.numel() * 8 > u_k.shape[-1]:
            return (u_k + self.head.markov_w2(mixed).float()).argmax(-1), emb, state
        exact = u_k[:, cand] + (mixed.to(self.w2.dtype) @ self.w2[cand].T).float()
        return cand[exact.argmax(-1)], emb, state
