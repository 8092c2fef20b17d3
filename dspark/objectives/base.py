"""What every objective shares with the one training loop: the reducer seam and the protocol."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist


@runtime_checkable
class Reducer(Protocol):
    """Sums tensors over ranks. `world_size` is the number of ranks."""

    world_size: int

    def sum(self, t: torch.Tensor) -> torch.Tensor: ...


class LocalReducer:
    """Single process: sum is the identity, world_size 1."""

    world_size = 1

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t


class TorchDistributedReducer:
    """`torch.distributed` all-reduce (SUM) on a copy; no autograd through the reduction."""

    def __init__(self, group=None) -> None:
        self._dist = dist
        self.group = group
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        out = t.detach().clone()
        if self.world_size > 1:
            self._dist.all_reduce(out, op=self._dist.ReduceOp.SUM, group=self.group)
        return out


@runtime_checkable
class Objective(Protocol):
    """A training method: `step` (with grad) and `evaluate` (no grad, same metrics)."""

    name: str

    def step(
        self, draft, batch: Mapping[str, torch.Tensor], reducer: Reducer | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]: ...

    def evaluate(
        self, draft, batch: Mapping[str, torch.Tensor], reducer: Reducer | None = None
    ) -> dict[str, float]: ...


def reduce_named(reducer: Reducer, sums: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sum a named mapping of statistics (scalars or vectors) over ranks in ONE collective.

    Each value is flattened into one fp32 buffer, summed by `reducer`, and split back under its
    name with its own shape, so callers never unpack statistics by position.
    """
    names = list(sums)
    flat = [sums[n].detach().float().reshape(-1) for n in names]
    glob = reducer.sum(torch.cat(flat))
    out, i = {}, 0
    for n, f in zip(names, flat, strict=True):
        out[n] = glob[i : i + f.numel()].reshape(sums[n].shape)
        i += f.numel()
    return out
