"""What stops a training run before it does the wrong thing: a launch that is not what it
looks like (`check_launch`) and a step that must not be applied (`check_divergence`)."""

from __future__ import annotations

import math
import os

from dspark.errors import UserError


def check_launch(num_processes: int, distributed_type: str, environ=os.environ) -> None:
    """Refuse a launch that is not what it looks like: N launched processes that each train
    alone (world size 1), or an FSDP / DeepSpeed config that Accelerate quietly ran as DDP."""
    launched = int(environ.get("WORLD_SIZE", "1"))
    if launched != num_processes:
        raise RuntimeError(
            f"the launcher started WORLD_SIZE={launched} processes but Accelerate joined "
            f"{num_processes} of them: each would train its own copy of the draft. Without "
            "CUDA, Accelerate forms a CPU process group only with ACCELERATE_USE_CPU=true: run "
            "`ACCELERATE_USE_CPU=true accelerate launch --config_file "
            "conf/accelerate/cpu_ddp2.yaml train/distill.py ...`; with GPUs, check that every "
            "process sees a device (CUDA_VISIBLE_DEVICES, --gpu_ids)."
        )
    for flag, kind in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED")):
        asked = environ.get(flag, "false").lower() in ("1", "true", "yes")
        if asked and distributed_type != kind:
            raise RuntimeError(
                f"the launch config asks for {kind} but Accelerate runs {distributed_type} "
                f"(ACCELERATE_USE_CPU=true turns {kind} into plain CPU data parallel, and "
                f"{kind} needs GPUs): use conf/accelerate/cpu_ddp2.yaml on a CPU, or run the "
                f"{kind} config on GPUs (README, 'Scale out')."
            )


class DivergedError(UserError, RuntimeError):
    """The loss or the gradient went non-finite, or the loss blew up: the run stops before the
    update, with the step and the last good checkpoint named."""


def check_divergence(
    loss: float, grad_norm: float | None, first_loss: float | None, factor: float
) -> str | None:
    """Why a step must not be applied (None: it may). `first_loss`: the run's first loss."""
    if not math.isfinite(loss):
        return f"the loss is {loss}"
    if grad_norm is not None and not math.isfinite(grad_norm):
        return f"the gradient norm is {grad_norm} (loss {loss:.4g})"
    if factor > 0 and first_loss is not None and first_loss > 0 and loss > factor * first_loss:
        return (
            f"the loss rose to {loss:.4g}, over trainer.divergence_factor={factor:g} x the "
            f"first step's {first_loss:.4g}"
        )
    return None
