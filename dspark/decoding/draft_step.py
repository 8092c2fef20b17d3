"""One draft round: a single block pass, then the cheap serial Markov sampling loop.

Uses only the draft inference API of docs/contracts.md (`block_hidden`, `lm_head`,
`markov_head.step`, `confidence_head`; the `DraftInference` protocol of
`dspark.modeling.protocols`), so any model implementing it can be decoded. A reduced draft
vocabulary (draft_vocab.py) scores K draft ids; each pick is mapped to its target id at once,
so the proposal and the Markov head's previous token are target ids.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    (1..gamma), only the first `steps` of them (a round that verifies no more).

    The block pass always covers all gamma slots, so the first `steps` tokens and their
    confidences are exactly those of the whole block (the Markov loop is causal); only the
    lm_head rows, the serial loop and the confidence head shrink to `steps`.

    `confidence_temperatures [>= gamma]` (STS, method doc section 4): c_k = sigmoid(z_k / T_k).
    `cpu_fast_paths`: the CPU lm_head form and the T = 0 Markov pruning (cpu_paths.py).
    `vocab`: the draft's reduced vocabulary (None: read it from the draft, `DraftVocab.of`).
    """
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
    qs: list[torch.Tensor] = []
    feats: list[torch.Tensor] = []
    pruner = GreedyPruner.for_round(head, greedy, h.device) if cpu_fast_paths else None
    for k in range(n):
        if pruner is not None:  # its argmax is a draft id
            pick, feat, state = pruner.step(logits[:, k], h[:, k], prev, state)
            prev = to_target(pick)
            picked.append(prev)
            feats.append(feat)
            continue
        bias, feat, state = head.step(h[:, k], prev, state)  # bias [B, V or K]
        logit_k = logits[:, k] + bias.float()
        if greedy:
            prev = to_target(logit_k.argmax(-1))
        else:
            q_k = warp(logit_k, temperature, top_k, top_p)
            prev = to_target(sample(q_k, generator))
            qs.append(q_k)
        picked.append(prev)
        feats.append(feat)
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


def _identity(ids: torch.Tensor) -> torch.Tensor:
    return ids


def _calibrated(logits: torch.Tensor, temperatures: torch.Tensor | None) -> torch.Tensor:
    """sigmoid(z_k / T_k) over `logits [B, gamma]` (plain sigmoid without temperatures)."""
    if temperatures is not None:
        logits = logits / temperatures[: logits.shape[1]].to(logits)
    return torch.sigmoid(logits)
