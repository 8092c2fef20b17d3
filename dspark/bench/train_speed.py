"""How expensive is a training step relative to the frozen target's forward on the same batch?

Its command line is `eval/train_speed.py`, a thin entry script of the same name.

Online capture runs the target inside every step, so the target's forward is the floor; the
draft's forward + backward, its lm_head over every block slot and the optimizer step come on top.
"""

from __future__ import annotations

import time

import torch

from dspark.objectives import LocalReducer
from dspark.timing import sync
from dspark.training.build import build_draft, build_objective_for, load_datasets, make_loader
from dspark.training.loop import peak_memory_mb
from dspark.training.optim import build_optimizer
from dspark.training.precision import resolve_mixed_precision


def measure_step_cost(cfg, steps: int = 6, warmup: int = 2, device: str | None = None) -> dict:
    """Median seconds of (a) the target's forward alone (tapped layers + final norm, as the
    objective captures it) and (b) a whole training step, over the same `steps` batches;
    also the step's CPU time and every step's loss (for precision agreement checks)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.trainer.seed)  # same draft init, anchors and batches in every run
    target, tokenizer, draft = build_draft(cfg, dev)
    objective = build_objective_for(cfg, target, draft.config)
    train_ds, _ = load_datasets(cfg, tokenizer, target, draft.config)
    loader = make_loader(train_ds, tokenizer, cfg, shuffle=False)
    optimizer = build_optimizer(draft, cfg.optim)
    mixed_precision = resolve_mixed_precision(cfg.trainer.mixed_precision, dev)
    autocast = torch.autocast(
        dev.type,
        dtype=torch.float16 if mixed_precision == "fp16" else torch.bfloat16,
        enabled=mixed_precision != "no",
    )
    batches = []
    for b in loader:
        batches.append({k: v.to(dev) for k, v in b.items()})
        if len(batches) == warmup + steps:
            break
    fwd, step, step_cpu, tokens, padded, losses = [], [], [], [], [], []
    for i, batch in enumerate(batches):
        sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            objective.features(batch)
        sync(dev)
        t1, c1 = time.perf_counter(), time.process_time()
        with autocast:
            loss, _ = objective.step(draft, batch, LocalReducer())
        loss.backward()
        losses.append(float(loss.detach()))
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(dev)
        t2, c2 = time.perf_counter(), time.process_time()
        if i >= warmup:
            fwd.append(t1 - t0)
            step.append(t2 - t1)
            step_cpu.append(c2 - c1)
            tokens.append(int(batch["attention_mask"].sum()))
            padded.append(batch["attention_mask"].numel())
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {
        "target_forward_s": med(fwd),
        "train_step_s": med(step),
        "step_over_target_forward": med(step) / med(fwd),
        "train_tokens_per_s": sum(tokens) / sum(step),
        # CPU seconds of this process (all its threads): on a shared machine the wall clock
        # also counts the waits for other jobs, the CPU time much less so.
        "train_step_cpu_s": med(step_cpu),
        "train_tokens_per_cpu_s": sum(tokens) / sum(step_cpu),
        "peak_memory_mb": peak_memory_mb(dev),
        "losses": losses,  # every step, warm-up included (same batches and anchors per run)
        "pad_share": 1 - sum(tokens) / sum(padded),
        "conditions": {
            "target": cfg.target.name,
            "target_dtype": cfg.target.dtype,
            "mixed_precision": mixed_precision,
            "packing": bool(cfg.data.packing),
            "max_length": cfg.data.max_length,
            "device": str(dev),
            "threads": torch.get_num_threads(),
            "batch": cfg.data.batch_size,
            "mean_tokens_per_batch": sum(tokens) / len(tokens),
            "block_size": cfg.draft.block_size,
            "num_anchors": cfg.draft.num_anchors,
            "draft_layers": cfg.draft.num_hidden_layers,
            "markov_rank": cfg.draft.markov_rank,
            "steps_timed": len(step),
            "torch": torch.__version__,
        },
    }
