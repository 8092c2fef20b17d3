"""Lossless verification as pure tensor functions (no host syncs).

Shapes: B requests, L = drafts in the verify pass (the max over requests), V the target's
vocabulary, K a reduced draft's (draft_vocab.py): drafts are target ids either way.
`verify_len [B]` (<= L) lets each request verify a shorter prefix (confidence threshold,
budget): drafts at k >= verify_len[b] count as not proposed. Index j of the target's
`p [B, L+1, V]` is its distribution for the token after verify input j, i.e. for draft
x_{j+1} (j < L) and for the bonus token (j = verify_len).
Both return `(num_accepted [B] long, next_token [B] long)`: accept drafts
x_1..x_{num_accepted}, then commit `next_token` (correction or bonus); `accept` picks the one
the decoder's sampling calls for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dspark.decoding.sampling import sample

if TYPE_CHECKING:
    from dspark.decoding.draft_vocab import DraftVocab
    from dspark.decoding.sampling import Sampling


def _prefix_len(ok: torch.Tensor, verify_len: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of `ok [B, L]` limited to `verify_len`."""
    steps = torch.arange(ok.shape[1], device=ok.device)
    ok = ok & (steps[None, :] < verify_len[:, None])
    return ok.long().cumprod(dim=1).sum(dim=1)


def verify_greedy(
    draft_tokens: torch.Tensor, target_argmax: torch.Tensor, verify_len: torch.Tensor
):
    """T = 0: accept while `draft_tokens [B, L]` equals the target's argmax `[B, L+1]`."""
    n = _prefix_len(draft_tokens == target_argmax[:, : draft_tokens.shape[1]], verify_len)
    return n, target_argmax.gather(1, n[:, None]).squeeze(1)


def verify_sampled(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    verify_len: torch.Tensor,
    generator: torch.Generator | None = None,
    q_vocab: DraftVocab | None = None,
):
    """Speculative sampling: accept x_k w.p. min(1, p_k(x_k) / q_k(x_k)); at the first
    rejection a sample from normalise(max(0, p_a - q_a)); if all verified drafts pass,
    sample the bonus from p at index verify_len. `q [B, L, V]`, `p [B, L+1, V]` (warped).
    `q_vocab`: q is a reduced draft's `[B, L, K]` over `q_vocab.ids` (0 on the other target
    ids); the same rule then runs over V without building q over V."""
    bsz, n_draft = draft_tokens.shape
    px = p[:, :n_draft].gather(2, draft_tokens[..., None]).squeeze(2)
    if q_vocab is None:
        qx = q.gather(2, draft_tokens[..., None]).squeeze(2)
    else:
        qx = q_vocab.gather(q, draft_tokens)
    u = torch.rand(px.shape, device=p.device, generator=generator)
    n = _prefix_len(u * qx < px, verify_len)  # u < p/q without the division
    rows = torch.arange(bsz, device=p.device)
    p_a = p[rows, n]
    rejected = (n < verify_len)[:, None]
    if not n_draft:
        diff = p_a  # nothing proposed: q_a = 0
    elif q_vocab is None:
        diff = p_a - q[rows, n.clamp(max=n_draft - 1)]
    else:  # [B, V] minus [B, K] in the kept columns
        diff = q_vocab.subtract_from(p_a, q[rows, n.clamp(max=n_draft - 1)])
    residual = torch.where(rejected, diff.clamp_min(0.0), p_a)
    mass = residual.sum(-1, keepdim=True)
    # p == q exactly makes a rejection impossible; guard the 0/0 anyway
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_a)
    return n, sample(residual, generator)


def accept(
    drafts: torch.Tensor,
    logits: torch.Tensor,
    verify_len: torch.Tensor,
    sampling: Sampling,
    q: torch.Tensor | None = None,
    q_vocab: DraftVocab | None = None,
    generator: torch.Generator | None = None,
):
    """The target's verdict on `drafts [B, L]` from its verify-pass `logits [B, L+1, V]`:
    `verify_greedy` at T = 0, else `verify_sampled` against the draft's `q [B, L, V or K]`
    (None: nothing was proposed)."""
    if sampling.greedy:
        return verify_greedy(drafts, logits.argmax(-1), verify_len)
    p = sampling.probs(logits)
    q = q[:, : drafts.shape[1]] if q is not None else p[:, :0]
    return verify_sampled(drafts, q, p, verify_len, generator, q_vocab=q_vocab)
