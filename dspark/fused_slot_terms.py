"""CE and L1 of a chunk of draft slots in one autograd node, with its backward written out.

`losses.slot_cross_entropy` + `losses.slot_l1` composed from torch ops cost about twenty
passes over the `[M, K]` logits in a training step (two casts to fp32, a log-softmax and a
softmax with their backwards, abs and its sign, the zero fills and the casts of two gradients
back to bf16). On a CPU those passes, not the matmuls, were most of the vocabulary-sized work.
This node shares one softmax between both terms and writes the gradient in one buffer:

    p = softmax(z)                  z: the draft's logits [M, K]
    q                               the target's probabilities at the same K ids (constants)
    ce = -log p[y]                  (0 where the label y is outside the K ids)
    l1 = sum_k |p - q| + (1 - sum_k q)      (the target's mass outside the K ids; ~0 for K = V)

    d ce / d z  = p - onehot(y)
    d l1 / d z  = p * (s - <s, p>),  s = sign(p - q)   (sign(0) = 0, as torch's abs)

p is torch's softmax and q is what the caller passes, so s has the composed functions' signs
even where p and q nearly tie. tests/test_fused_slot_terms.py checks the values and gradients
against the composed functions and against finite differences.
"""

from __future__ import annotations

import torch

# p[y] below this (ce above ~69) is recomputed as logsumexp(z) - z[y]: log(p[y]) loses
# precision as p[y] nears fp32's smallest normal (1.2e-38), and is inf once it underflows
_TINY = 1e-30


class _SlotCeL1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target_probs, draft_ids, inside):
        work = torch.promote_types(logits.dtype, torch.float32)  # fp32, or fp64 for gradcheck
        z = logits.to(work)  # [M, K]
        top = z.max(dim=-1).indices  # the draft's argmax (max: faster than argmax on a CPU)
        p = torch.softmax(z, dim=-1)
        p_y = p.gather(1, draft_ids[:, None]).squeeze(1)
        ce = -torch.log(p_y)
        tiny = p_y < _TINY  # log of an underflowing p[y]: recompute those rows exactly
        if tiny.any():
            rows = tiny.nonzero().squeeze(1)
            z_rows = z.index_select(0, rows)
            exact = torch.logsumexp(z_rows, -1) - z_rows.gather(1, draft_ids[rows, None])[:, 0]
            ce = ce.index_put((rows,), exact)
        ce = torch.where(inside, ce, 0.0)
        q = target_probs.to(work)
        outside = (1.0 - q.sum(-1)).clamp_(min=0.0)
        d = torch.sub(p, q)  # [M, K]
        l1 = torch.linalg.vector_norm(d, ord=1, dim=-1) + outside
        ctx.save_for_backward(p, d.sign_(), draft_ids, inside)
        ctx.mark_non_differentiable(top)
        ctx.logits_dtype = logits.dtype
        return ce, l1, top

    @staticmethod
    def backward(ctx, grad_ce, grad_l1, _grad_top):
        p, s, draft_ids, inside = ctx.saved_tensors
        a = torch.where(inside, grad_ce.to(p.dtype), 0.0)  # [M]
        b = grad_l1.to(p.dtype)
        sp = torch.linalg.vecdot(s, p)  # <s, p> per slot
        grad = (s - sp[:, None]).mul_(b[:, None]).add_(a[:, None]).mul_(p)
        grad.scatter_add_(1, draft_ids[:, None], -a[:, None])
        return grad.to(ctx.logits_dtype), None, None, None


def slot_ce_l1(
    logits: torch.Tensor,
    target_probs: torch.Tensor,
    draft_ids: torch.Tensor,
    inside: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-slot `(ce [M], l1 [M], argmax [M])`, fp32 (fp64 for fp64 logits), of the draft's `logits
    [M, K]` (any float dtype; the gradient comes back in it). `target_probs [M, K]`: the
    target's probabilities over all V, at the draft's K ids (no gradient). `draft_ids [M]`,
    `inside [M]`: the labels as draft ids and whether the draft vocabulary holds them
    (`losses.in_vocab_labels`). `argmax`: the draft's top id per slot (a draft id; no
    gradient), for the greedy match."""
    if target_probs.requires_grad:
        raise ValueError("slot_ce_l1 takes the target's probabilities as constants: detach them")
    return _SlotCeL1.apply(logits, target_probs, draft_ids, inside)
