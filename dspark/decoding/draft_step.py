"""One draft round: a single block pass, then the cheap serial Markov sampling loop.

Uses only the draft inference API of docs/contracts.md (`block_hidden`, `lm_head`,
`markov_head.step`, `confidence_head`; the `DraftInference` protocol of
`dspark.modeling.protocols`), so any model implementing it can be decoded. A reduced draft
vocabulary (draft_vocab.py) scores K draft ids; each pick is mapped to its target id at once,
so the proposal and the Markov head's previous token are target ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dspark.decoding.cpu_paths import GreedyPruner
from dspark.decoding.draft_vocab import DraftVocab
from dspark.decoding.sampling import sample, warp
from dspark.decoding.target_step import head_logits

if TYPE_CHECKING:  # the protocol module is light, but dspark.modeling's package is not
    from dspark.modeling.protocols import DraftInference


@dataclass
class DraftProposal:
    tokens: torch.Tensor  # [B, n] long, target ids (n = gamma, or the round's `steps`)
    # [B, gamma, V] warped draft probabilities ([B, gamma, K] over `vocab.ids` for a reduced
    # draft vocabulary); None at T = 0
    q: torch.Tensor | None
    confidence: torch.Tensor | None  # [B, gamma] c_k in (0, 1), None without a head
    vocab: DraftVocab | None = None  # the reduced vocabulary q is over (None: all V)

    @classmethod
    def nothing(cls, anchor: torch.Tensor) -> DraftProposal:
        """No drafts for the rows of `anchor [B]` (a round the draft gate skips)."""
        return cls(anchor.new_zeros((anchor.shape[0], 0)), None, None)

    @property
    def drafted(self) -> int:
        """Drafts proposed per row (0 on a round the draft gate skips)."""
        return self.tokens.shape[1]

    def capped(self, caps: Sequence[int]) -> list[int]:
        """Each row's cap, at most the drafts proposed: no row verifies a draft not made."""
        return [min(c, self.drafted) for c in caps]

    def host_confidence(self) -> list[list[float]] | None:
        """The confidences on the host (one sync), as the output records them."""
        return self.confidence.tolist() if self.confidence is not None else None


def propose(
    draft: DraftInference,
    anchor: torch.Tensor,
    anchor_pos: torch.Tensor,
    ctx_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ctx_valid: torch.Tensor,
    *,
    gamma: int,
    mask_token_id: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    confidence_temperatures: torch.Tensor | None = None,
    cpu_fast_paths: bool = True,
    vocab: DraftVocab | None = None,
    steps: int | None = None,
) -> DraftProposal:
    """Draft `gamma` tokens after `anchor [B]` sitting at `anchor_pos [B]`; with `steps`
    (1..gamma), only the first `steps` of them (a round that verifies no more); `steps=0`
    drafts nothing (`DraftProposal.nothing`: a round the verify policy's draft gate skips).

    The block pass always covers all gamma slots, so the first `steps` tokens and their
    confidences are exactly those of the whole block (the Markov loop is causal); only the
    lm_head rows, the serial loop and the confidence head shrink to `steps`.

    `confidence_temperatures [>= gamma]` (STS, method doc section 4): c_k = sigmoid(z_k / T_k).
    `cpu_fast_paths`: the CPU lm_head form and the T = 0 Markov pruning (cpu_paths.py).
    `vocab`: the draft's reduced vocabulary (None: read it from the draft, `DraftVocab.of`).
    """
    if steps == 0:
        return DraftProposal.nothing(anchor)
    if vocab is None:
        vocab = DraftVocab.of(draft, anchor.device)
    # draft ids -> target ids (identity for a full vocabulary)
    to_target = vocab.to_target if vocab is not None else _identity
    bsz = anchor.shape[0]
    n = gamma if steps is None else int(steps)
    if not 1 <= n <= gamma:
        raise ValueError(f"steps={steps} must be in 1..gamma={gamma}")
    slots = torch.arange(gamma, device=anchor.device)
    block = torch.full((bsz, gamma), mask_token_id, dtype=torch.long, device=anchor.device)
    block[:, 0] = anchor
    h = draft.block_hidden(block, anchor_pos[:, None] + slots, ctx_kv, ctx_valid)[:, :n]
    logits = head_logits(draft.lm_head, h, cpu_fast_paths)  # U [B, n, V or K]
    head = getattr(draft, "markov_head", None)
    conf_head = getattr(draft, "confidence_head", None)
    greedy = temperature <= 0
    if head is None:  # pure DFlash: all slots are independent
        q = None if greedy else warp(logits, temperature, top_k, top_p)
        tokens = to_target(logits.argmax(-1) if q is None else sample(q, generator))
        conf = None
        if conf_head is not None:
            conf = conf_head(h.reshape(bsz * n, -1), None)
            conf = _calibrated(conf.float().reshape(bsz, n), confidence_temperatures)
        return DraftProposal(tokens, q, conf, vocab)
    state = head.init_state(bsz)
    prev = anchor  # [B] target ids: the Markov head reads W1 [V, r] at the previous token
    picked: list[torch.Tensor] = []
    qs: list = []  # q_k per slot (None at T = 0)
    feats: list[torch.Tensor] = []
    step = markov_step(head, h.device, temperature, top_k, top_p, generator, cpu_fast_paths)
    for k in range(n):
        pick, feat, state, q_k = step(logits[:, k], h[:, k], prev, state)  # pick: a draft id
        prev = to_target(pick)
        picked.append(prev)
        feats.append(feat)
        qs.append(q_k)
    conf = None
    if conf_head is not None:  # one call for all slots, after the serial loop
        flat_feat = torch.stack(feats, 1).reshape(bsz * n, -1)
        conf = conf_head(h.reshape(bsz * n, -1), flat_feat)
        conf = _calibrated(conf.float().reshape(bsz, n), confidence_temperatures)
    return DraftProposal(
        torch.stack(picked, 1),
        None if greedy else torch.stack(qs, 1),
        conf,
        vocab,
    )


# (u_k [B, K], h_k [B, H], prev [B] target ids, state) -> (pick [B] draft ids, feat, state, q_k)
MarkovStep = Callable[..., tuple[torch.Tensor, torch.Tensor, object, torch.Tensor | None]]


def markov_step(
    head, device, temperature, top_k, top_p, generator, cpu_fast_paths: bool = True
) -> MarkovStep:
    """The serial loop's step for one slot, chosen once per round: at T = 0 on a CPU, the
    pruned step of cpu_paths.py (`GreedyPruner`, same argmax); else the head's own `step`, then
    the argmax, or one sample of the warped draft distribution q_k (also returned)."""
    pruner = GreedyPruner.for_round(head, temperature <= 0, device) if cpu_fast_paths else None
    if pruner is not None:
        return pruner.pick

    def step(u_k, h_k, prev, state):
        bias, feat, state = head.step(h_k, prev, state)  # bias [B, V or K]
        logit_k = u_k + bias.float()
        if temperature <= 0:
            return logit_k.argmax(-1), feat, state, None
        q_k = warp(logit_k, temperature, top_k, top_p)
        return sample(q_k, generator), feat, state, q_k

    return step


def _identity(ids: torch.Tensor) -> torch.Tensor:
    return ids


def _calibrated(logits: torch.Tensor, temperatures: torch.Tensor | None) -> torch.Tensor:
    """sigmoid(z_k / T_k) over `logits [B, gamma]` (plain sigmoid without temperatures)."""
    if temperatures is not None:
        logits = logits / temperatures[: logits.shape[1]].to(logits)
    return torch.sigmoid(logits)
