"""The hardware-aware prefix scheduler (paper Algorithm 1; method doc section 5), pure tensors.

Inputs per round: survivals `a [R, gamma]`, a_{r,j} = prod_{i<=j} c_{r,i} (calibrated when the
draft ships STS temperatures), and `sps [Bmax + 1]`, verify steps per second at token batch B
(index B). Verify length l_r per request, token batch B = sum_r (1 + l_r), expected committed
tokens tau = sum_r (1 + sum_{j<=l_r} a_{r,j}), objective Theta = tau * SPS(B).

`schedule_ragged` is Algorithm 1 as published: sort every (r, j) slot by a descending (rows
stay prefixes because a falls with j; ties keep j order), start from B = R (each request
verifies its bonus position only), admit slots one by one while Theta strictly improves and
STOP at the first non-improvement. Requests may verify zero drafts.

Why the break matters (paper Appendix A; tests/test_decoding_scheduler.py): c_{r,j+1} depends
on the drafted x_{r,j}, so a_{r,j+1} carries information about x_{r,j}. With the break,
"slot (r, j) is verified" is decided only by slots ranked ahead of it, and row r's own later
slots never rank ahead, so the decision to verify x_{r,j} is a stopping time of the draft
(it never looks at x_{r,j} itself) and speculative sampling stays exact. Choosing instead the
best prefix of the whole sorted list (`stop_at_first=False`: the global argmax of Theta) looks
past the first non-improvement at later slots, i.e. at x_{r,j} through a_{r,j+1}, and shifts
the committed-token distribution.

`schedule_padded` is the same greedy-with-break for a decoder whose verify pass is one padded
`[R, 1 + L]` tensor (this repository's): the unit of admission is one more draft depth for every
request (B = R (1 + L)), since a padded pass prices a depth, not a slot. Depth L is admitted
from a_{., <= L} alone, so it is a stopping time too.

Everything here is device-side tensor math without host syncs; the caller reads the lengths.
"""

from __future__ import annotations

import torch


def _check(survival: torch.Tensor, sps: torch.Tensor, widest: int) -> None:
    if survival.dim() != 2:
        raise ValueError(f"survival must be [R, gamma], got shape {tuple(survival.shape)}")
    if sps.dim() != 1 or sps.shape[0] <= widest:
        raise ValueError(
            f"the SPS table covers token batches 0..{sps.shape[0] - 1} but this round may need "
            f"B = {widest}; build it with SPSProfile.table(rows, gamma)"
        )


def _caps(cap: torch.Tensor | None, rows: int, gamma: int, device) -> torch.Tensor:
    if cap is None:
        return torch.full((rows,), gamma, dtype=torch.long, device=device)
    return cap.to(device=device, dtype=torch.long).clamp(0, gamma)


def schedule_ragged(
    survival: torch.Tensor,
    sps: torch.Tensor,
    cap: torch.Tensor | None = None,
    *,
    stop_at_first: bool = True,
) -> torch.Tensor:
    """Paper Algorithm 1: verify lengths `l [R]` (long, 0..gamma) with B = sum(1 + l_r).

    `cap [R]` bounds each request (remaining token budget); slots past it are not offered.
    `stop_at_first=False` is the anticipating variant (best prefix of the whole sorted list)
    kept only to show that it is NOT lossless.
    """
    rows, gamma = survival.shape
    _check(survival, sps, rows * (1 + gamma))
    dev = survival.device
    if rows == 0 or gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=dev)
    a = survival.float()
    depth = torch.arange(1, gamma + 1, device=dev)
    offered = depth[None, :] <= _caps(cap, rows, gamma, dev)[:, None]
    # -inf sorts last; the secondary key (stable sort over j-major order) keeps prefixes on ties
    key = torch.where(offered, a, torch.full_like(a, float("-inf")))
    flat_key = key.T.reshape(-1)  # j-major: equal survivals rank the shallower slot first
    order = torch.sort(flat_key, descending=True, stable=True).indices
    vals = flat_key[order]
    valid = torch.isfinite(vals)
    k = torch.arange(1, vals.numel() + 1, device=dev)
    tau = rows + torch.cumsum(torch.where(valid, vals, torch.zeros_like(vals)), 0)
    theta = torch.cat([(rows * sps[rows].float())[None], tau * sps[rows + k].float()])
    theta = torch.where(torch.cat([valid.new_ones(1), valid]), theta, torch.full_like(theta, -1.0))
    if stop_at_first:
        improves = theta[1:] > theta[:-1]
        n_admit = torch.cumprod(improves.long(), 0).sum()
    else:
        n_admit = torch.argmax(theta)  # first index of the global maximum
    admitted = torch.zeros_like(flat_key, dtype=torch.bool)
    admitted[order] = k <= n_admit
    return admitted.reshape(gamma, rows).T.long().sum(1)


def schedule_padded(
    survival: torch.Tensor,
    sps: torch.Tensor,
    cap: torch.Tensor | None = None,
    *,
    stop_at_first: bool = True,
) -> torch.Tensor:
    """Algorithm 1 priced for a padded `[R, 1 + L]` verify pass: lengths `min(L, cap_r) [R]`.

    Depth L is admitted while Theta(L) = (R + sum_r sum_{j<=min(L, cap_r)} a_{r,j}) *
    SPS(R (1 + L)) strictly improves; stop at the first non-improvement.
    """
    rows, gamma = survival.shape
    _check(survival, sps, rows * (1 + gamma))
    dev = survival.device
    if rows == 0 or gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=dev)
    caps = _caps(cap, rows, gamma, dev)
    depth = torch.arange(1, gamma + 1, device=dev)
    a = torch.where(depth[None, :] <= caps[:, None], survival.float(), 0.0)
    tau = rows + torch.cat([a.new_zeros(1), torch.cumsum(a.sum(0), 0)])  # [gamma + 1]
    widths = rows * torch.arange(1, gamma + 2, device=dev)
    theta = tau * sps[widths].float()
    if stop_at_first:
        depth_l = torch.cumprod((theta[1:] > theta[:-1]).long(), 0).sum()
    else:
        depth_l = torch.argmax(theta)
    return torch.minimum(caps, depth_l.expand(rows))


def expected_tokens(survival: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """tau = sum_r (1 + sum_{j <= l_r} a_{r,j}) for given lengths (a scalar tensor)."""
    depth = torch.arange(1, survival.shape[1] + 1, device=survival.device)
    used = depth[None, :] <= lengths[:, None]
    return survival.shape[0] + torch.where(used, survival.float(), 0.0).sum()


SCHEDULERS = {"ragged": schedule_ragged, "padded": schedule_padded}
