"""What every objective shares with the one training loop: the reducer seam, the protocol (all
the loop reads of an objective), its defaults (`ObjectiveBase`) and what an objective is built
from (`ObjectiveContext`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
import torch.distributed as dist


@runtime_checkable
class Reducer(Protocol):
    """Sums tensors over ranks. `world_size` is the number of ranks."""

    @property
    def world_size(self) -> int: ...

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
    """A training method: everything the one training loop reads of it.

    - `step(draft, batch, reducer) -> (loss, metrics)` with grad; `evaluate` the same metrics
      without (held-out batches). `metrics["loss"]`, when present, is the global loss the loop
      checks for divergence.
    - `count_metrics`: metrics summed over held-out batches instead of averaged; the first one
      weighs each batch's averages (none: every batch weighs 1).
    - `progress_metrics`: the metrics the progress bar shows.
    - `curve_metrics`: the held-out metrics the run report plots (results.json names them).
    - `state_dict` / `load_state_dict`: what a checkpoint keeps of it (an RNG, say), so a
      resumed run continues exactly.
    `ObjectiveBase` gives the defaults: no counts, the bar shows `loss`, no curve, no state.
    """

    name: str
    count_metrics: tuple[str, ...]
    progress_metrics: tuple[str, ...]
    curve_metrics: tuple[str, ...]

    def step(
        self, draft, batch: Mapping[str, torch.Tensor], reducer: Reducer | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]: ...

    def evaluate(
        self, draft, batch: Mapping[str, torch.Tensor], reducer: Reducer | None = None
    ) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class ObjectiveContext:
    """What a run gives an objective besides its own settings: the frozen target (None with
    offline features and a `feature_source`), the draft's config, the run's seed, and where
    the target's features come from (None: the objective runs the target itself)."""

    target: Any
    draft_config: Any
    seed: int = 0
    feature_source: Any = None


class ObjectiveBase:
    """The protocol's defaults; an objective subclasses it and overrides what it needs.

    `from_settings` builds the objective from its settings (the dataclass it is registered
    with, `register_objective`) and the run's context: by default
    `cls(target, draft_config, **settings)`."""

    name: ClassVar[str] = "objective"
    count_metrics: ClassVar[tuple[str, ...]] = ()
    progress_metrics: ClassVar[tuple[str, ...]] = ("loss",)
    curve_metrics: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_settings(cls, settings: Any, context: ObjectiveContext):
        values = asdict(settings) if settings is not None else {}
        return cls(context.target, context.draft_config, **values)  # type: ignore[call-arg]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


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
