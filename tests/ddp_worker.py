"""One DSpark objective step on a rank's share of a fixed global batch.

Called in-process for world size 1, or launched on 2 gloo ranks by tests/test_distributed.py:
  ACCELERATE_USE_CPU=true accelerate launch --config_file conf/accelerate/cpu_ddp2.yaml \
      tests/ddp_worker.py TINY_DIR DATA_DIR OUT.pt EXPECTED_WORLD_SIZE
The launched run does three steps from the same fresh draft and saves all of them:
- `ddp`: replicated target, `AccelerateReducer` (the training loop's);
- `per_rank`: a deliberately wrong reducer (normalises by the rank's own tokens only), which
  must NOT reproduce the one-process gradients: it shows the comparison can fail;
- `sharded`: the target sharded with FSDP2 (`dspark.training.sharding.shard_target`).
"""

import os
import sys

import torch


class PerRankReducer:
    """The classic bug: per-rank token means averaged by DDP (wrong with uneven token counts)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().clone() * self.world_size  # pretends every rank has this rank's tokens


def load_parts(tiny_dir: str, data_dir: str, world_size: int, rank: int):
    """The target, this rank's share of 4 fixed rows, and the draft config."""
    from datasets import load_from_disk

    from dspark.config import DSparkConfig, choose_mask_token_id
    from dspark.data.collate import PadCollator
    from dspark.target import load_target

    target, tok = load_target(tiny_dir)
    rows = load_from_disk(data_dir).select(range(4))
    collate = PadCollator(tok.pad_token_id)
    # Rank r takes rows [2r, 2r+1]: uneven supervised token counts across ranks on purpose.
    share = [rows[i] for i in range(4)] if world_size == 1 else [rows[2 * rank], rows[2 * rank + 1]]
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=1,
        block_size=4,
        markov_rank=8,
        num_anchors=512,  # more than any row's positions: every anchor, no sampling noise
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
    )
    return target, collate(share), cfg


def fresh_draft(target, cfg):
    """A seed-0 draft; built from the UNSHARDED target (it copies embed_tokens and lm_head)."""
    from dspark.modeling import DSparkDraftModel

    torch.manual_seed(0)
    return DSparkDraftModel.from_target(target, cfg)


def one_step(draft, target, batch, cfg, accelerator=None, reducer=None) -> dict:
    """Loss and draft gradients of one objective step."""
    from dspark.objectives import LocalReducer, build_objective

    objective = build_objective("dspark", target, cfg)
    if accelerator is None:
        model, reducer = draft, reducer or LocalReducer()
    else:
        from dspark.training.loop import AccelerateReducer

        model, reducer = accelerator.prepare(draft), reducer or AccelerateReducer(accelerator)
    loss, metrics = objective.step(model, batch, reducer)
    if accelerator is None:
        loss.backward()
    else:
        accelerator.backward(loss)
    grads = {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}
    return {"loss": metrics["loss"], "grads": grads}


def grads_on_rank_share(tiny_dir: str, data_dir: str, world_size: int, rank: int) -> dict:
    """The one-process reference (world size 1: all 4 rows on one rank)."""
    target, batch, cfg = load_parts(tiny_dir, data_dir, world_size, rank)
    return one_step(fresh_draft(target, cfg), target, batch, cfg)


if __name__ == "__main__":
    from accelerate import Accelerator

    from dspark.training.sharding import shard_target

    tiny_dir, data_dir, out_path, expected = sys.argv[1:5]
    acc = Accelerator()
    ws = acc.num_processes
    # The launched run must really be the multi-process run the test believes it is.
    assert ws == int(expected) == int(os.environ.get("WORLD_SIZE", "1")), (
        f"Accelerate sees {ws} process(es), WORLD_SIZE={os.environ.get('WORLD_SIZE')}, "
        f"the test expects {expected}"
    )
    target, batch, cfg = load_parts(tiny_dir, data_dir, ws, acc.process_index)
    out = {"world_size": ws, "distributed_type": acc.distributed_type.value}
    out["ddp"] = one_step(fresh_draft(target, cfg), target, batch, cfg, acc)
    per_rank = PerRankReducer(ws)
    out["per_rank"] = one_step(fresh_draft(target, cfg), target, batch, cfg, acc, per_rank)
    draft = fresh_draft(target, cfg)
    shard_target(target, acc.device, ws)
    local = sum(p.to_local().numel() for p in target.model.parameters())
    full = sum(p.numel() for p in target.model.parameters())
    out["sharded"] = one_step(draft, target, batch, cfg, acc)
    out["sharded"]["local_fraction"] = local / full
    gathered = [None] * ws
    torch.distributed.all_gather_object(gathered, out)
    if acc.is_main_process:
        torch.save(gathered, out_path)
    # Leave the gloo group on purpose: a rank whose interpreter exits with the group's threads
    # still joinable can die in std::terminate (SIGABRT) after its work is done.
    acc.wait_for_everyone()
    acc.end_training()
