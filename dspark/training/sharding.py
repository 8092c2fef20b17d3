"""Shard the frozen target across ranks with FSDP2 `fully_shard`; the draft stays under DDP.

Every rank of a plain DDP run holds a full copy of the frozen target, which is the largest
thing in memory (Qwen3-8B: 16 GB in bf16, a 70B-class target: 141 GB, more than one device).
With `target.shard=true` each decoder layer (and the root: embeddings + final norm) becomes an
FSDP2 unit over all ranks: a rank keeps 1/world_size of every weight and all-gathers one layer
at a time during the target's forward (`reshard_after_forward=True` frees it again).

Why FSDP2 and not transformers' tensor-parallel plan: FSDP2 needs nothing from the model
(any HF decoder with `model.layers`, MoE included, no per-architecture plan, no head count
divisible by the world size), runs on CPU with gloo (so it is tested here), and its traffic is
one all-gather of the target per micro-batch, which overlaps with compute. TP would cut the
activation memory of the target too, but that is small next to the weights here (no grad,
one layer at a time).

Kept replicated on purpose: the target's `lm_head`. The objective applies it outside the
decoder forward, at supervised rows only (`capture.target_logits`); a tied head is untied
into its own frozen copy first so that sharding the input embedding does not turn the head
into a sharded tensor.

Loading: each rank loads the target on the CPU first (`build_draft(cfg, cpu)`), then
`fully_shard` moves each rank's shard to its device, one layer at a time, so no device ever
holds the full target (host RAM holds one full copy per process while loading).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dspark.target.capture import base_model


def untie_output_head(target) -> None:
    """Give a tied `lm_head` its own frozen weight (same values), so sharding the input
    embedding leaves the head a plain replicated tensor."""
    head = target.get_output_embeddings()
    emb = target.get_input_embeddings()
    if head is not None and emb is not None and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
        if hasattr(target.config, "tie_word_embeddings"):
            target.config.tie_word_embeddings = False


def shard_target(target, device: torch.device, world_size: int):
    """Shard `target` (frozen, any device) over a 1-D mesh of `world_size` ranks on `device`'s
    type; returns it (modified in place: the objective's references to it stay valid).

    Collective: every rank calls it, in the same order relative to other collectives, and
    afterwards every rank must run the target's forward the same number of times.
    """
    if not dist.is_initialized() or dist.get_world_size() != world_size:
        raise RuntimeError(
            f"target.shard=true needs a process group of {world_size} ranks (got "
            f"{dist.get_world_size() if dist.is_initialized() else 'none'}); launch with "
            "`accelerate launch` and more than one process (see README, 'Scale out')."
        )
    untie_output_head(target)
    base = base_model(target)
    # Buffers (rotary inv_freq) and the replicated head go to the device now; FSDP moves params.
    for module in target.modules():
        for name, buf in list(module._buffers.items()):
            if buf is not None and buf.device != device:
                module._buffers[name] = buf.to(device)
    head = target.get_output_embeddings()
    if head is not None:
        head.to(device)
    mesh = init_device_mesh(device.type, (world_size,))
    for layer in base.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(base, mesh=mesh, reshard_after_forward=True)
    return target


def check_shardable(cfg, world_size: int) -> None:
    """Refuse a sharded-target run that cannot work, naming the fix."""
    if world_size < 2:
        raise ValueError(
            "target.shard=true needs at least 2 processes (one process holds the whole target "
            "anyway); launch with `accelerate launch --num_processes N` (see README, "
            "'Scale out') or drop target.shard"
        )
