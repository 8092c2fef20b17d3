"""Wall-clock timing on a device: wait for queued device work, and the median of repeated calls.

CUDA runs kernels asynchronously, so a host clock read around a call measures only the
launch unless the device is synchronised first and after; on a CPU `sync` does nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device | str | None) -> None:
    """Block until `device` (a CUDA device) has finished its queued work; a no-op elsewhere."""
    if device is None:
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device | str | None = None) -> float:
    """Seconds one call of `fn` takes, `device` synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def median_time(
    fn: Callable[[], object],
    repeats: int,
    device: torch.device | str | None = None,
    warmup: int = 1,
) -> float:
    """The median seconds of `max(1, repeats)` calls of `fn` after `warmup` untimed ones (first
    calls pay allocations and kernel selection), `device` synchronised around each call."""
    for _ in range(warmup):
        fn()
    return statistics.median([timed(fn, device) for _ in range(max(1, repeats))])
