"""The one training loop (Accelerate): every method plugs in as an objective.

`run` reads as its steps: `setup` (the parts, from the run config), `make_loaders`,
`prepare` (one Accelerate `prepare`, resume), then `train_step` (accumulate / backward / clip /
step) and `after_step` (log, periodic held-out `evaluate`, atomic checkpoints) until the step
budget, and `finish` (final eval, the published draft, results.json). Training reads its data
(`data.train`), it never makes it.
"""

from __future__ import annotations

import json
import math
import resource
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DataLoaderConfiguration, set_seed
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from dspark.data.features.cache_progress import cache_cost
from dspark.errors import StoppedWithWorkLeft
from dspark.locking import exclusive_output
from dspark.machine import device_kind
from dspark.objectives import Objective
from dspark.training.build import (
    build_draft,
    build_objective_for,
    draft_vocab_record,
    load_datasets,
    make_loader,
    require_data,
)
from dspark.training.calibrate import calibrate_after_training
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
from dspark.training.run_guards import DivergedError, check_divergence, check_launch
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


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run(cfg) -> dict:
    """Train a draft as `cfg` (a validated `DistillConfig`) says; returns the final results.

    One job per run directory: the main process holds its writer lock (dspark/locking.py)
    for the whole run, so a second job started on it is refused; the other ranks of a
    distributed run write nothing there but through the main process."""
    out = Path(cfg.trainer.output_dir)
    main = PartialState().is_main_process
    with exclusive_output(out, "the training run directory") if main else nullcontext():
        r = setup(cfg)
        make_loaders(r)
        prepare(r)
        started, earlier_s = time.perf_counter(), r.progress.train_seconds
        while r.progress.step < r.total:
            for batch in epoch_batches(r):
                metrics, grad_norm = train_step(r, batch)
                if r.accelerator.sync_gradients:  # an optimizer step, not an accumulation
                    r.progress.train_seconds = earlier_s + time.perf_counter() - started
                    after_step(r, metrics, grad_norm)
                    stop_if_out_of_time(r, started)
                if r.progress.step >= r.total:
                    break
            else:  # the epoch ran out before the budget
                r.progress.epoch += 1
                r.progress.batches_in_epoch = 0
        r.train_seconds = time.perf_counter() - started
        return finish(r)


@dataclass
class Run:
    """What the steps of one training run share."""

    cfg: Any
    out: Path
    run_config: dict
    accelerator: Accelerator
    mixed_precision: str
    target: Any
    tokenizer: Any
    draft: Any
    objective: Objective
    vocab: dict | None  # the draft vocabulary's record (None: the target's full vocabulary)
    reducer: AccelerateReducer
    train_ds: Any = None
    eval_ds: Any = None
    train_dl: Any = None
    eval_dl: Any = None
    optimizer: Any = None
    scheduler: Any = None
    total: int = 0  # optimizer steps
    progress: Progress = field(default_factory=Progress)
    resumed_from: Path | None = None
    bar: Any = None
    history: list[dict] = field(default_factory=list)  # the logged train rows
    first_loss: float | None = None
    tokens: int = 0  # tokens since the last log row
    t_window: float = 0.0  # when the last log row was written
    train_seconds: float = 0.0

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process


def setup(cfg) -> Run:
    """Check the data and the run directory, start Accelerate, build target, draft, objective."""
    require_data(cfg)  # training reads data; a missing set names the command that makes it
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
    if cfg.target.shard:  # load on the host; fully_shard moves each rank's shard to its device
        check_shardable(cfg, accelerator.num_processes)
    load_on = torch.device("cpu") if cfg.target.shard else accelerator.device
    main_first = accelerator.main_process_first
    target, tokenizer, draft = build_draft(cfg, load_on, main_first=main_first)
    draft.to(accelerator.device)
    vocab = draft_vocab_record(cfg, draft)  # None: the full vocabulary
    if vocab is not None:  # recorded, not compared on resume (draft.vocab_size is)
        run_config["draft_vocab"] = vocab
    objective = build_objective_for(cfg, target, draft.config)
    reducer = AccelerateReducer(accelerator)
    return Run(cfg, out, run_config, accelerator, mixed_precision, target, tokenizer, draft,
               objective, vocab, reducer)  # fmt: skip


def make_loaders(r: Run) -> None:
    """The train and held-out splits and their loaders (the main process reads first)."""
    with r.accelerator.main_process_first():
        r.train_ds, r.eval_ds = load_datasets(r.cfg, r.tokenizer, r.target, r.draft.config)
    if r.cfg.target.shard:  # after the data is loaded; the draft copied embed / head already
        shard_target(r.target, r.accelerator.device, r.accelerator.num_processes)
    r.train_dl = make_loader(r.train_ds, r.tokenizer, r.cfg, shuffle=r.cfg.data.shuffle)
    r.eval_dl = make_loader(r.eval_ds, r.tokenizer, r.cfg, shuffle=False)


def prepare(r: Run) -> None:
    """Optimizer and schedule, one Accelerate `prepare`, resume from the newest checkpoint,
    and the run directory's run_config.json and trackers."""
    cfg, t_cfg, acc = r.cfg, r.cfg.trainer, r.accelerator
    optimizer = build_optimizer(r.draft, cfg.optim)
    r.draft, r.optimizer, r.train_dl, r.eval_dl = acc.prepare(
        r.draft, optimizer, r.train_dl, r.eval_dl
    )
    steps_per_epoch = max(1, len(r.train_dl) // t_cfg.gradient_accumulation_steps)
    r.total = t_cfg.max_steps or max(1, math.ceil(t_cfg.epochs * steps_per_epoch))
    # Not prepared: Accelerate would step it once per process; it steps once per optimizer step.
    r.scheduler = warmup_cosine(
        r.optimizer, r.total, cfg.optim.warmup_ratio, cfg.optim.min_lr_ratio
    )
    acc.register_for_checkpointing(r.scheduler, r.progress, r.objective)  # + anchor RNG
    r.resumed_from = resume_latest(acc, r.draft, r.out) if t_cfg.resume else None
    if r.resumed_from:
        acc.print(f"resumed from {r.resumed_from} at step {r.progress.step}")
    if r.main:
        r.out.mkdir(parents=True, exist_ok=True)
        moved = supersede_metrics(r.out, r.progress.step)
        if moved:
            acc.print(f"{moved} metrics rows past step {r.progress.step} moved to "
                      "metrics.superseded.jsonl")  # fmt: skip
        # The step budget as resolved here, for a reader of the run directory alone
        # (`run_status`): trainer.max_steps is null when trainer.epochs sets it.
        r.run_config["schedule"] = {"steps_per_epoch": steps_per_epoch, "total_steps": r.total}
        (r.out / "run_config.json").write_text(json.dumps(r.run_config, indent=2))
    init_tracking(acc, cfg.tracking, r.out, r.run_config)
    r.bar = tqdm(total=r.total, initial=r.progress.step, desc="distill", disable=not r.main,
                 dynamic_ncols=True)  # fmt: skip
    r.draft.train()
    r.t_window = time.perf_counter()


def epoch_batches(r: Run):
    """This epoch's batches, past those a resumed run already consumed."""
    r.train_dl.set_epoch(r.progress.epoch)
    skip = r.progress.batches_in_epoch
    return r.accelerator.skip_first_batches(r.train_dl, skip) if skip else r.train_dl


def train_step(r: Run, batch) -> tuple[dict, torch.Tensor | None]:
    """One micro-step: loss, divergence check, backward; at the end of an accumulation, the
    clipped update. Returns the step's metrics and the gradient norm (None mid-accumulation)."""
    acc = r.accelerator
    with acc.accumulate(r.draft):
        loss, metrics = r.objective.step(r.draft, batch, r.reducer)
        loss_value = float(metrics.get("loss", loss))  # global where the objective has it
        stop_if_diverged(r, loss_value, None)
        r.first_loss = loss_value if r.first_loss is None else r.first_loss
        acc.backward(loss)
        grad_norm = None
        if acc.sync_gradients:
            # max_norm inf measures without clipping (grad_clip=0: clipping off)
            clip = r.cfg.optim.grad_clip if r.cfg.optim.grad_clip > 0 else math.inf
            grad_norm = acc.clip_grad_norm_(r.draft.parameters(), clip)
            stop_if_diverged(r, loss_value, None if grad_norm is None else float(grad_norm))
        r.optimizer.step()
        r.optimizer.zero_grad(set_to_none=True)
    r.progress.batches_in_epoch += 1
    r.tokens += int(r.reducer.sum(batch["attention_mask"].sum()))
    return metrics, grad_norm


def stop_if_diverged(r: Run, loss_value: float, grad_value: float | None) -> None:
    """Collective: every rank raises together (the verdict is summed over ranks)."""
    why = check_divergence(loss_value, grad_value, r.first_loss, r.cfg.trainer.divergence_factor)
    flag = torch.tensor(float(why is not None), device=r.accelerator.device)
    if float(r.reducer.sum(flag)) == 0:
        return
    good = latest_checkpoint(r.out)
    r.bar.close()  # the error line is the last thing printed, not a redrawn bar
    raise DivergedError(
        f"training diverged at step {r.progress.step + 1}: {why or 'on another rank'}. The "
        "step was not applied; "
        + (f"the last good checkpoint is {good}" if good else "no checkpoint was saved yet")
        + ". Lower optim.lr (or raise optim.warmup_ratio) and resume, or check the data"
    )


def stop_if_out_of_time(r: Run, started: float) -> None:
    """`trainer.stop_after_min`: past the budget, checkpoint and stop with work left. Collective:
    the ranks' verdicts are summed, so all stop at the same step."""
    budget_min = r.cfg.trainer.stop_after_min
    if budget_min <= 0 or r.progress.step >= r.total:
        return
    late = (time.perf_counter() - started) / 60 >= budget_min
    flag = torch.tensor(float(late), device=r.accelerator.device)
    if float(r.reducer.sum(flag)) == 0:
        return
    t_cfg = r.cfg.trainer
    if not (t_cfg.save_every and r.progress.step % t_cfg.save_every == 0):  # after_step saved it
        save_checkpoint(r.accelerator, r.draft, r.progress, r.out, t_cfg.keep_last)
    r.bar.close()
    raise StoppedWithWorkLeft(
        f"stopped after {budget_min:g} min of training (trainer.stop_after_min) at step "
        f"{r.progress.step} of {r.total}, checkpoint saved in {r.out}; rerun the same command "
        "to resume"
    )


def after_step(r: Run, metrics: dict, grad_norm: torch.Tensor | None) -> None:
    """After an optimizer step: the schedule, the log row, a periodic eval and checkpoint."""
    t_cfg, step = r.cfg.trainer, r.progress.step + 1
    r.scheduler.step()
    r.progress.step = step
    r.bar.update(1)
    if step % t_cfg.log_every == 0 or step == r.total:
        record = {
            "step": step,
            "epoch": r.progress.epoch,
            "lr": r.scheduler.get_last_lr()[0],
            "tokens_per_s": r.tokens / (time.perf_counter() - r.t_window),
            "peak_memory_mb": peak_memory_mb(r.accelerator.device),
            **{f"train/{k}": float(v) for k, v in metrics.items()},
        }
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        r.history.append(record)
        r.accelerator.log(record, step=step)
        shown = r.objective.progress_metrics
        r.bar.set_postfix({k: f"{float(metrics[k]):.3f}" for k in shown if k in metrics})
        r.tokens, r.t_window = 0, time.perf_counter()
    if t_cfg.eval_every and step % t_cfg.eval_every == 0 and step < r.total:
        r.accelerator.log({"step": step, **evaluate(r)}, step=step)
    if t_cfg.save_every and step % t_cfg.save_every == 0 and step < r.total:
        save_checkpoint(r.accelerator, r.draft, r.progress, r.out, t_cfg.keep_last)


def evaluate(r: Run) -> dict:
    """Held-out metrics, each batch weighted by the objective's first count; counts summed."""
    counted = r.objective.count_metrics
    r.draft.eval()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    weight = 0.0
    with torch.no_grad():
        for batch in r.eval_dl:
            m = {k: float(v) for k, v in r.objective.evaluate(r.draft, batch, r.reducer).items()}
            w = m.get(counted[0], 1.0) if counted else 1.0
            weight += w
            for k, v in m.items():
                if k in counted:
                    counts[k] = counts.get(k, 0.0) + v
                else:
                    sums[k] = sums.get(k, 0.0) + w * v
    r.draft.train()
    return {
        **{f"eval/{k}": v / max(weight, 1e-9) for k, v in sums.items()},
        **{f"eval/{k}": v for k, v in counts.items()},
    }


def finish(r: Run) -> dict:
    """The final eval and checkpoint, the published draft, results.json and the report."""
    cfg, acc = r.cfg, r.accelerator
    r.bar.close()
    final_eval = {"step": r.progress.step, **evaluate(r)}
    acc.log(final_eval, step=r.progress.step)
    save_checkpoint(acc, r.draft, r.progress, r.out, cfg.trainer.keep_last)
    draft_dir = publish_draft(acc, r.draft, r.out)
    results = {
        "draft": str(draft_dir),
        "steps": r.progress.step,
        "resumed_from": str(r.resumed_from or ""),
        "train_seconds": round(r.train_seconds, 3),  # a resumed run: its own steps only
        "train_seconds_total": round(r.progress.train_seconds, 3),  # every job of the run
        # the target's passes that wrote the features and its head's pass over them (wall s)
        "feature_cache": cache_cost(cfg.data.features) if cfg.data.features else None,
        "final_eval": final_eval,
        "last_train": r.history[-1] if r.history else {},
        "curve_metrics": list(r.objective.curve_metrics),
        "conditions": {
            "target": cfg.target.name,
            "target_dtype": cfg.target.dtype,
            "features": cfg.data.features or "online",
            "target_sharded": bool(cfg.target.shard),
            "device": str(acc.device),
            "device_name": device_kind(acc.device),
            "processes": acc.num_processes,
            "mixed_precision": r.mixed_precision,
            "packing": bool(cfg.data.packing),
            "block_size": cfg.draft.block_size,
            "draft_vocab": r.vocab,
            "batch_per_device": cfg.data.batch_size,
            "grad_accum": cfg.trainer.gradient_accumulation_steps,
            "torch_threads": torch.get_num_threads(),
        },
    }
    if r.main and cfg.trainer.calibrate_prompts > 0:
        results["calibration"] = calibrate_after_training(
            cfg, acc, r.target, r.tokenizer, r.draft, r.eval_ds
        )
    if r.main:
        write_report(r.out, results, r.run_config)
    acc.end_training()
    return results
