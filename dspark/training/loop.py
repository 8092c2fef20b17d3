"""The one training loop (Accelerate): every method plugs in as an objective.

build parts from the run config -> one `prepare` -> accumulate / backward / clip / step,
periodic held-out eval, atomic checkpoints with full resume, metrics to JSONL (+ W&B).
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DataLoaderConfiguration, set_seed
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from dspark.errors import UserError
from dspark.locking import exclusive_output
from dspark.training.build import (
    build_draft,
    build_objective_for,
    draft_vocab_record,
    load_datasets,
    make_loader,
    regenerate_if_missing,
)
from dspark.training.calibrate import calibrate_published, held_out_prompts
from dspark.training.checkpoint import (
    Progress,
    latest_checkpoint,
    publish_draft,
    resume_latest,
    save_checkpoint,
)
from dspark.training.muon import check_distribution
from dspark.training.optim import build_optimizer, warmup_cosine
from dspark.training.precision import resolve_mixed_precision
from dspark.training.report import write_report
from dspark.training.run_dir import check_resume_config, refuse_restart, supersede_metrics
from dspark.training.sharding import check_shardable, shard_target
from dspark.training.tracking import init_tracking, trackers


@dataclass
class AccelerateReducer:
    """Sums over ranks (token-pooled normalisation needs global denominators)."""

    accelerator: Accelerator

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return (
            self.accelerator.reduce(t.detach().clone(), reduction="sum")
            if self.world_size > 1
            else t
        )


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


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _calibrate(cfg, accelerator, target, tokenizer, draft, eval_ds) -> dict:
    """STS on the held-out split, written beside the published draft (main process only)."""
    if cfg.target.shard:
        return {"skipped": "the target is sharded; run eval/calibrate.py on the saved draft"}
    prompts = held_out_prompts(eval_ds, cfg.trainer.calibrate_prompts)
    return calibrate_published(
        target,
        tokenizer,
        accelerator.unwrap_model(draft),
        Path(cfg.trainer.output_dir) / "draft",
        prompts,
        max_new_tokens=cfg.trainer.calibrate_max_new_tokens,
        seed=cfg.trainer.seed,
    )


def run(cfg) -> dict:
    """Train a draft as `cfg` (a validated `DistillConfig`) says; returns the final results.

    One job per run directory: the main process holds its writer lock (dspark/locking.py)
    for the whole run, so a second job started on it is refused; the other ranks of a
    distributed run write nothing there but through the main process."""
    out = Path(cfg.trainer.output_dir)
    main = PartialState().is_main_process
    with exclusive_output(out, "the training run directory") if main else nullcontext():
        return _run(cfg)


def _run(cfg) -> dict:
    t_cfg = cfg.trainer
    out = Path(t_cfg.output_dir)
    run_config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(run_config, dict)  # cfg is a DictConfig
    if t_cfg.resume:
        check_resume_config(out, run_config)
    else:
        refuse_restart(out)
    if t_cfg.threads:
        torch.set_num_threads(t_cfg.threads)
    mixed_precision = resolve_mixed_precision(t_cfg.mixed_precision)  # auto -> bf16 | no
    accelerator = Accelerator(
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=t_cfg.gradient_accumulation_steps,
        log_with=trackers(cfg.tracking, out),  # metrics.jsonl + the conf/tracking/ choice
        project_dir=str(out),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    check_launch(accelerator.num_processes, accelerator.distributed_type.value)
    if cfg.optim.name == "muon":  # Newton-Schulz needs whole matrices: DDP yes, FSDP / ZeRO no
        check_distribution(accelerator.distributed_type.value)
    set_seed(t_cfg.seed)
    main = accelerator.is_main_process
    if cfg.target.shard:  # load on the host; fully_shard moves each rank's shard to its device
        check_shardable(cfg, accelerator.num_processes)
    load_on = torch.device("cpu") if cfg.target.shard else accelerator.device
    target, tokenizer, draft = build_draft(
        cfg, load_on, main_first=accelerator.main_process_first, is_main=main
    )
    draft.to(accelerator.device)
    vocab = draft_vocab_record(cfg, draft)  # None: the full vocabulary
    if vocab is not None:  # recorded, not compared on resume (draft.vocab_size is)
        run_config["draft_vocab"] = vocab
    objective = build_objective_for(cfg, target, draft.config)
    with accelerator.main_process_first():
        if main:
            regenerate_if_missing(cfg, target, tokenizer)
        train_ds, eval_ds = load_datasets(cfg, tokenizer, target, draft.config)
    if cfg.target.shard:  # after regeneration (one rank); the draft copied embed / head already
        shard_target(target, accelerator.device, accelerator.num_processes)
    train_dl = make_loader(train_ds, tokenizer, cfg, shuffle=cfg.data.shuffle)
    eval_dl = make_loader(eval_ds, tokenizer, cfg, shuffle=False)

    optimizer = build_optimizer(draft, cfg.optim)
    draft, optimizer, train_dl, eval_dl = accelerator.prepare(draft, optimizer, train_dl, eval_dl)
    steps_per_epoch = max(1, len(train_dl) // t_cfg.gradient_accumulation_steps)
    total = t_cfg.max_steps or max(1, math.ceil(t_cfg.epochs * steps_per_epoch))
    # Not prepared: Accelerate would step it once per process; it steps once per optimizer step.
    scheduler = warmup_cosine(optimizer, total, cfg.optim.warmup_ratio, cfg.optim.min_lr_ratio)
    progress = Progress()
    accelerator.register_for_checkpointing(scheduler, progress, objective)  # + anchor RNG

    resumed_from = resume_latest(accelerator, draft, out) if t_cfg.resume else None
    if resumed_from:
        accelerator.print(f"resumed from {resumed_from} at step {progress.step}")
    if main:
        out.mkdir(parents=True, exist_ok=True)
        moved = supersede_metrics(out, progress.step)
        if moved:
            accelerator.print(f"{moved} metrics rows past step {progress.step} moved to "
                              "metrics.superseded.jsonl")  # fmt: skip
        (out / "run_config.json").write_text(json.dumps(run_config, indent=2))
    init_tracking(accelerator, cfg.tracking, out, run_config)
    reducer = AccelerateReducer(accelerator)

    # The objective names its metrics: counts (the first is the batch weight) and bar fields.
    count_metrics = tuple(getattr(objective, "count_metrics", ()))
    progress_metrics = tuple(getattr(objective, "progress_metrics", ("loss",)))

    def evaluate() -> dict:
        """Held-out metrics, each batch weighted by the objective's first count; counts summed."""
        draft.eval()
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        weight = 0.0
        with torch.no_grad():
            for batch in eval_dl:
                m = {k: float(v) for k, v in objective.evaluate(draft, batch, reducer).items()}
                w = m.get(count_metrics[0], 1.0) if count_metrics else 1.0
                weight += w
                for k, v in m.items():
                    if k in count_metrics:
                        counts[k] = counts.get(k, 0.0) + v
                    else:
                        sums[k] = sums.get(k, 0.0) + w * v
        draft.train()
        return {
            **{f"eval/{k}": v / max(weight, 1e-9) for k, v in sums.items()},
            **{f"eval/{k}": v for k, v in counts.items()},
        }

    bar = tqdm(
        total=total, initial=progress.step, desc="distill", disable=not main, dynamic_ncols=True
    )
    draft.train()
    tokens, t_window = 0, time.perf_counter()
    history: list[dict] = []
    first_loss: float | None = None

    def stop_if_diverged(loss_value: float, grad_value: float | None) -> None:
        """Collective: every rank raises together (the verdict is summed over ranks)."""
        why = check_divergence(loss_value, grad_value, first_loss, t_cfg.divergence_factor)
        flag = torch.tensor(float(why is not None), device=accelerator.device)
        if float(reducer.sum(flag)) == 0:
            return
        good = latest_checkpoint(out)
        bar.close()  # the error line is the last thing printed, not a redrawn bar
        raise DivergedError(
            f"training diverged at step {progress.step + 1}: {why or 'on another rank'}. The "
            "step was not applied; "
            + (f"the last good checkpoint is {good}" if good else "no checkpoint was saved yet")
            + ". Lower optim.lr (or raise optim.warmup_ratio) and resume, or check the data"
        )

    while progress.step < total:
        train_dl.set_epoch(progress.epoch)
        batches = (
            accelerator.skip_first_batches(train_dl, progress.batches_in_epoch)
            if progress.batches_in_epoch
            else train_dl
        )
        for batch in batches:
            with accelerator.accumulate(draft):
                loss, metrics = objective.step(draft, batch, reducer)
                loss_value = float(metrics.get("loss", loss))  # global where the objective has it
                stop_if_diverged(loss_value, None)
                first_loss = loss_value if first_loss is None else first_loss
                accelerator.backward(loss)
                grad_norm = None
                if accelerator.sync_gradients:
                    # max_norm inf measures without clipping (grad_clip=0: clipping off)
                    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
                    grad_norm = accelerator.clip_grad_norm_(draft.parameters(), clip)
                    stop_if_diverged(loss_value, None if grad_norm is None else float(grad_norm))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            progress.batches_in_epoch += 1
            tokens += int(reducer.sum(batch["attention_mask"].sum()))
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            progress.step += 1
            bar.update(1)
            if progress.step % t_cfg.log_every == 0 or progress.step == total:
                dt = time.perf_counter() - t_window
                record = {
                    "step": progress.step,
                    "epoch": progress.epoch,
                    "lr": scheduler.get_last_lr()[0],
                    "tokens_per_s": tokens / dt,
                    "peak_memory_mb": peak_memory_mb(accelerator.device),
                    **{f"train/{k}": float(v) for k, v in metrics.items()},
                }
                if grad_norm is not None:
                    record["grad_norm"] = float(grad_norm)
                history.append(record)
                accelerator.log(record, step=progress.step)
                bar.set_postfix(
                    {k: f"{float(metrics[k]):.3f}" for k in progress_metrics if k in metrics}
                )
                tokens, t_window = 0, time.perf_counter()
            if t_cfg.eval_every and progress.step % t_cfg.eval_every == 0 and progress.step < total:
                record = {"step": progress.step, **evaluate()}
                accelerator.log(record, step=progress.step)
            if t_cfg.save_every and progress.step % t_cfg.save_every == 0 and progress.step < total:
                save_checkpoint(accelerator, draft, progress, out, t_cfg.keep_last)
            if progress.step >= total:
                break
        else:
            progress.epoch += 1
            progress.batches_in_epoch = 0
    bar.close()

    final_eval = {"step": progress.step, **evaluate()}
    accelerator.log(final_eval, step=progress.step)
    save_checkpoint(accelerator, draft, progress, out, t_cfg.keep_last)
    draft_dir = publish_draft(accelerator, draft, out)
    results = {
        "draft": str(draft_dir),
        "steps": progress.step,
        "resumed_from": str(resumed_from or ""),
        "final_eval": final_eval,
        "last_train": history[-1] if history else {},
        "curve_metrics": list(getattr(objective, "curve_metrics", ())),
        "conditions": {
            "target": cfg.target.name,
            "target_dtype": cfg.target.dtype,
            "features": cfg.data.features or "online",
            "target_sharded": bool(cfg.target.shard),
            "device": str(accelerator.device),
            "processes": accelerator.num_processes,
            "mixed_precision": mixed_precision,
            "packing": bool(cfg.data.packing),
            "block_size": cfg.draft.block_size,
            "draft_vocab": vocab,
            "batch_per_device": cfg.data.batch_size,
            "grad_accum": t_cfg.gradient_accumulation_steps,
            "torch_threads": torch.get_num_threads(),
        },
    }
    if main and t_cfg.calibrate_prompts > 0:
        results["calibration"] = _calibrate(cfg, accelerator, target, tokenizer, draft, eval_ds)
    if main:
        write_report(out, results, run_config)
    accelerator.end_training()
    return results
