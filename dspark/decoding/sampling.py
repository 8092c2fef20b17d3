"""Turning logits into the (warped) distributions both target and draft are sampled from.

Parallels `dspark/data/regeneration/sampling.py`, the sampling settings and reply contract
of data regeneration's backends.

The same `warp` is applied to the target's p and the draft's q, so speculative sampling is
lossless with respect to the warped target distribution (temperature / top-k / top-p);
`Sampling` holds those three settings for a decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def warp(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """Probabilities `[..., V]` (fp32) of `softmax(logits / T)` restricted by top-k / top-p."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        logits = _nucleus(logits, top_p)
    return logits.softmax(-1)


NUCLEUS_FIRST_K = 256  # tokens searched first for the top-p cut; widened x8 where it does not hold


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logits [..., V]` with every token outside the top-p nucleus at -inf.

    A token is dropped when the mass strictly before it (tokens in descending order) already
    reaches `top_p`, so at least one is kept. The nucleus is searched in the top k tokens of
    each row (`topk`, not a sort of all V: at V = 49k a full sort cost more than the model's
    step); rows whose k-th token is still kept search again with 8k, until it is dropped (no
    later one can then be kept) or k = V. Tokens tied at the cut's edge are kept in `topk`'s
    order, as a sort keeps them in its own: the nucleus has the same size either way.
    """
    shape, vocab = logits.shape, logits.shape[-1]
    rows = logits.reshape(-1, vocab)  # [N, V]
    log_total = rows.logsumexp(-1, keepdim=True)  # [N, 1]: each full row's normaliser
    out = torch.full_like(rows, float("-inf"))
    todo = torch.arange(rows.shape[0], device=rows.device)  # rows whose cut is not yet found
    k = min(NUCLEUS_FIRST_K, vocab)
    while todo.numel():
        top, order = torch.topk(rows[todo], k, dim=-1)  # [n, k], descending
        probs = (top - log_total[todo]).exp()
        keep = (probs.cumsum(-1) - probs) < top_p  # [n, k]
        done = ~keep[:, -1] if k < vocab else torch.ones_like(keep[:, -1])
        # out[row, order[row, j]] = top[row, j] where kept, for the rows done
        out[todo[done, None], order[done]] = top[done].masked_fill(~keep[done], float("-inf"))
        todo, k = todo[~done], min(8 * k, vocab)
    return out.reshape(shape)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One exact sample per row of `probs [..., V]` without a host sync (exponential race)."""
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / race, dim=-1)


def sample_per_row(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Like `sample` for `probs [B, V]`, but row b draws its race from `generators[b]` alone,
    so a row's sample depends on its own stream, never on its batch neighbours."""
    race = torch.empty_like(probs)
    for row, g in zip(race, generators):
        row.exponential_(1.0, generator=g)
    return torch.argmax(probs / race, dim=-1)


@dataclass(frozen=True)
class Sampling:
    """How tokens are picked: greedy at `temperature` 0, else one sample of the warped
    distribution (`top_k` > 0, `top_p` < 1 restrict it). Draft and target use the same one."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The warped distribution `[..., V]` of `logits`."""
        return warp(logits, self.temperature, self.top_k, self.top_p)

    def pick(self, logits: torch.Tensor, generator=None) -> torch.Tensor:
        """Greedy, or one warped sample per row; `generator` may be one generator for the
        batch or a list with one per row (`sample_per_row`)."""
        if self.greedy:
            return logits.argmax(-1)
        if isinstance(generator, list):
            return sample_per_row(self.probs(logits), generator)
        return sample(self.probs(logits), generator)
