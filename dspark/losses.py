"""Pure functions of the DSpark objective (method doc, section 2): anchors, supervision masks,
decay weights, per-slot loss terms and acceptance statistics. No modules, no state.

Conventions: a block anchored at position p has slots k = 0..gamma-1; slot k predicts token
x_{p+k+1}, its target distribution comes from the target's post-norm hidden state at p+k.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def valid_anchor_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """`[B, S]` -> bool `[B, S]`: p is a valid anchor when the loss mask holds at p and p+1."""
    lm = loss_mask.bool()
    valid = torch.zeros_like(lm)
    valid[:, :-1] = lm[:, :-1] & lm[:, 1:]
    return valid


def sample_anchors(
    loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `num_anchors` valid anchors per sequence, drawn without replacement, sorted.

    Returns `(anchor_positions [B, N] long, anchor_valid [B, N] bool)` with
    N = min(num_anchors, max valid count in the batch) (at least 1). A sequence with at most
    `num_anchors` valid positions gets all of them, in order (no randomness involved); missing
    ones are dummy blocks (position 0, `anchor_valid` False). Random draws use `generator`
    (on its own device; CPU by default) so runs are reproducible.
    """
    valid = valid_anchor_mask(loss_mask)
    B, S = valid.shape
    counts = valid.sum(1)
    N = max(1, min(int(num_anchors), int(counts.max().item()) if B else 0))
    gen_device = generator.device if generator is not None else torch.device("cpu")
    keys = torch.rand(B, S, generator=generator, device=gen_device).to(valid.device)
    keys = torch.where(valid, keys, torch.full_like(keys, 2.0))  # invalid positions sort last
    chosen = keys.argsort(dim=1)[:, :N]
    chosen_valid = valid.gather(1, chosen)
    # Sort the chosen positions; invalid picks go last and become dummies at position 0.
    order_key = torch.where(chosen_valid, chosen, chosen + S)
    order = order_key.argsort(dim=1)
    positions = chosen.gather(1, order)
    anchor_valid = chosen_valid.gather(1, order)
    positions = torch.where(anchor_valid, positions, torch.zeros_like(positions))
    return positions, anchor_valid


def slot_supervision_mask(
    loss_mask: torch.Tensor,
    anchor_positions: torch.Tensor,
    anchor_valid: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """bool `[B, N, gamma]`: slot k of a valid block at p is supervised while p+k+1 < S and the
    loss mask holds at p+1..p+k+1; the first gap truncates the rest of the block."""
    B, S = loss_mask.shape
    offs = torch.arange(1, block_size + 1, device=anchor_positions.device)
    pos = anchor_positions[..., None] + offs  # [B, N, gamma]: predicted positions
    inside = pos < S
    lm = loss_mask.bool().gather(1, pos.clamp(max=S - 1).view(B, -1)).view(pos.shape)
    ok = inside & lm & anchor_valid[..., None]
    return ok.to(torch.int32).cumprod(dim=-1).bool()


def decay_weights(block_size: int, loss_decay_gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-k / gamma_decay), k = 0..block_size-1 (fp32)."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    return torch.exp(-k / float(loss_decay_gamma))


def in_vocab_labels(
    labels: torch.Tensor, kept_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-id labels `[M]` -> `(draft ids [M] long, in_vocab [M] bool)`.

    `kept_ids [K]` (sorted target ids of a reduced draft vocabulary; None = the full one): a
    label's draft id is its index in `kept_ids`; a label outside them gets draft id 0 and
    `in_vocab` False (the draft can never propose it).
    """
    if kept_ids is None:
        return labels, torch.ones_like(labels, dtype=torch.bool)
    idx = torch.searchsorted(kept_ids, labels).clamp(max=kept_ids.numel() - 1)
    inside = kept_ids[idx] == labels
    return torch.where(inside, idx, torch.zeros_like(idx)), inside


def slot_cross_entropy(
    draft_logits: torch.Tensor, labels: torch.Tensor, kept_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-slot CE (fp32) of the draft logits `[M, K]` against the data tokens `[M]` (target
    ids). With a reduced vocabulary (`kept_ids [K]`), a slot whose label is outside it cannot
    be predicted: its CE is 0 (no gradient); the objective leaves it out of CE's mean
    (`in_vocab_labels`)."""
    draft_ids, inside = in_vocab_labels(labels, kept_ids)
    ce = F.cross_entropy(draft_logits.float(), draft_ids, reduction="none")
    return torch.where(inside, ce, torch.zeros_like(ce))


def target_probs(target_logits: torch.Tensor, kept_ids: torch.Tensor | None = None):
    """The target's fp32 distribution over all V (`target_logits [M, V]`), at `kept_ids [K]`
    when the draft vocabulary is reduced: `[M, K]`, summing to 1 less the mass outside."""
    p_t = torch.softmax(target_logits.float(), dim=-1)
    return p_t if kept_ids is None else p_t.index_select(-1, kept_ids)


def target_probs_at_kept(target_kept_logits: torch.Tensor, target_logsumexp: torch.Tensor):
    """`target_probs` at the kept ids from the target's logits there, `[M, K]`, and the
    logsumexp of its logits over all V, `[M]`, without the `[M, V]` logits (equal up to
    rounding)."""
    return (target_kept_logits.float() - target_logsumexp.float()[:, None]).exp_()


def slot_l1_of_probs(draft_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-slot L1 = sum over all V target ids of |p_d - p_t|, in [0, 2] (no 1/2 factor), p_d
    softmaxed at T=1 in fp32. `draft_logits [M, K]`; `target_probs [M, K]`: p_t at the draft's
    K ids (`target_probs`, `target_probs_at_kept`).

    With a reduced vocabulary p_d is 0 outside the kept ids (the draft never proposes those
    tokens) and p_t keeps its mass there (never renormalised away), so
    L1 = sum_kept |p_d - p_t[kept]| + (1 - sum_kept p_t) and 1 - L1/2 = sum_v min(p_d, p_t),
    the acceptance probability of lossless verification.
    """
    p_d = torch.softmax(draft_logits.float(), dim=-1)
    outside = (1.0 - target_probs.sum(-1)).clamp(min=0.0)
    return (p_d - target_probs).abs().sum(-1) + outside


def slot_l1(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    kept_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """`slot_l1_of_probs` from the target's logits over all V, `[M, V]`."""
    return slot_l1_of_probs(draft_logits, target_probs(target_logits, kept_ids))


def slot_l1_normalised(
    draft_logits: torch.Tensor, target_kept_logits: torch.Tensor, target_logsumexp: torch.Tensor
) -> torch.Tensor:
    """`slot_l1` of a reduced vocabulary from the target's logits at the kept ids alone
    (`target_probs_at_kept`)."""
    return slot_l1_of_probs(
        draft_logits, target_probs_at_kept(target_kept_logits, target_logsumexp)
    )


@torch.no_grad()
def greedy_match(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    kept_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 `[M]`: 1 where the draft's argmax (mapped to a target id through `kept_ids [K]`
    when reduced) is the target's argmax over all V, else 0: T=0 acceptance, teacher-forced."""
    return greedy_match_argmax(draft_logits, target_logits.argmax(-1), kept_ids)


@torch.no_grad()
def greedy_match_argmax(
    draft_logits: torch.Tensor,
    target_argmax: torch.Tensor,
    kept_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """`greedy_match` from the target's argmax over all V, `[M]` (target ids)."""
    return greedy_match_ids(draft_logits.argmax(-1), target_argmax, kept_ids)


@torch.no_grad()
def greedy_match_ids(
    draft_argmax: torch.Tensor, target_argmax: torch.Tensor, kept_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """`greedy_match` from both argmaxes, `[M]`: the draft's as draft ids, the target's as
    target ids."""
    draft_top = draft_argmax if kept_ids is None else kept_ids[draft_argmax]
    return (draft_top == target_argmax).float()


def confidence_target(l1: torch.Tensor) -> torch.Tensor:
    """c* = clamp(1 - L1/2, 0, 1), detached: the probability that the draft token is accepted
    (1 - total variation distance) under lossless speculative sampling."""
    return (1.0 - l1.detach() / 2.0).clamp(0.0, 1.0)


def slot_confidence_bce(confidence_logits: torch.Tensor, c_star: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(
        confidence_logits.float(), c_star.float(), reduction="none"
    )


def tau_per_block(c_star: torch.Tensor, slot_mask: torch.Tensor) -> torch.Tensor:
    """Probabilistic acceptance length of each block: 1 + sum_k prod_{i<=k} c*_i.

    `c_star [B, N, gamma]` (any value where unsupervised), `slot_mask [B, N, gamma]`. Only the
    supervised prefix of a block counts (unsupervised slots contribute 0): a block truncated by
    the end of the data or a loss-mask gap can commit at most the tokens that exist there,
    as at the end of a real generation.
    """
    c = torch.where(slot_mask, c_star.float(), torch.zeros_like(c_star, dtype=torch.float32))
    return 1.0 + c.cumprod(dim=-1).sum(-1)


def scatter_slots(values: torch.Tensor, slot_mask: torch.Tensor) -> torch.Tensor:
    """Put per-slot values `[M]` back into a zero `[B, N, gamma]` grid (row-major order)."""
    grid = torch.zeros(slot_mask.shape, dtype=values.dtype, device=values.device)
    grid[slot_mask] = values
    return grid


def safe_div(num: float, den: float) -> float:
    return num / den if den > 0 else (0.0 if num == 0 else math.nan)
