"""One DSpark objective step on a rank's share of a fixed global batch (run under
`accelerate launch --multi_gpu --num_processes 2`, or called in-process for world size 1)."""

import sys

import torch


def grads_on_rank_share(tiny_dir: str, data_dir: str, world_size: int, rank: int, accelerator=None):
    from datasets import load_from_disk

    from dspark.config import DSparkConfig, choose_mask_token_id
    from dspark.data.collate import PadCollator
    from dspark.modeling import DSparkDraftModel
    from dspark.objectives import LocalReducer, build_objective
    from dspark.target import load_target

    target, tok = load_target(tiny_dir)
    rows = load_from_disk(data_dir).select(range(4))
    collate = PadCollator(tok.pad_token_id)
    # Rank r takes rows [2r, 2r+1]: uneven supervised token counts across ranks on purpose.
    share = [rows[i] for i in range(4)] if world_size == 1 else [rows[2 * rank], rows[2 * rank + 1]]
    batch = collate(share)
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=1,
        block_size=4,
        markov_rank=8,
        num_anchors=512,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
    )
    torch.manual_seed(0)
    draft = DSparkDraftModel.from_target(target, cfg)
    objective = build_objective("dspark", target, cfg)
    if accelerator is None:
        model, reducer = draft, LocalReducer()
    else:
        from dspark.training.loop import AccelerateReducer

        model, reducer = accelerator.prepare(draft), AccelerateReducer(accelerator)
    loss, metrics = objective.step(model, batch, reducer)
    if accelerator is None:
        loss.backward()
    else:
        accelerator.backward(loss)
    grads = {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}
    return {"loss": metrics["loss"], "grads": grads}


if __name__ == "__main__":
    from accelerate import Accelerator

    acc = Accelerator()
    out = grads_on_rank_share(sys.argv[1], sys.argv[2], acc.num_processes, acc.process_index, acc)
    if acc.is_main_process:
        torch.save(out, sys.argv[3])
