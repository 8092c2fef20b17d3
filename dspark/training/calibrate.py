"""STS calibration at the end of training (`trainer.calibrate_prompts` > 0).

The published draft decodes the first `calibrate_prompts` held-out conversations' prompts
(each row's tokens before its first supervised one) with full-block verification and raw
confidences, fits Sequential Temperature Scaling on the even-indexed requests and scores the
odd-indexed ones before/after (`dspark/calibration/`), then writes the temperatures into
the draft's `config.json` (`confidence_temperatures`: the decoder applies them, export carries
them) and `calibration.{json,md}` + `calibration_reliability.png` beside it. The same fit as
`eval/calibrate.py`, on the run's own held-out split instead of benchmark-style prompt sets.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dspark.calibration.fit import fit_on_prompts, write_temperatures
from dspark.calibration.report import write_report
from dspark.target.loading import eos_ids


def held_out_prompts(rows, limit: int) -> list[list[int]]:
    """Prompt tokens of the first `limit` rows with a supervised token: `input_ids` before the
    first `loss_mask` 1 (rows with none, or with no prompt before it, are skipped)."""
    prompts: list[list[int]] = []
    for i in range(len(rows)):
        if len(prompts) >= limit:
            break
        row = rows[i]
        mask = [int(m) for m in row["loss_mask"]]
        first = mask.index(1) if 1 in mask else 0
        if first > 0:
            prompts.append([int(t) for t in row["input_ids"][:first]])
    return prompts


@torch.no_grad()
def calibrate_published(
    target,
    tokenizer,
    draft,
    draft_dir: str | Path,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int = 8,
    bins: int = 20,
    seed: int = 0,
) -> dict:
    """Fit STS on `prompts` decoded by `draft`, write it beside the draft; the fit's summary.

    Returns `{"skipped": reason}` when there is nothing to fit (no confidence head, no
    verified drafts), so a run never fails at its very end over calibration."""
    if getattr(draft, "confidence_head", None) is None:
        return {"skipped": "the draft has no confidence head"}
    if len(prompts) < 2:
        return {"skipped": f"{len(prompts)} held-out prompts; STS needs at least 2"}
    was_training = draft.training
    draft.eval()
    longest = max(len(p) for p in prompts) + max_new_tokens + int(draft.config.block_size) + 2
    res = fit_on_prompts(
        target,
        draft,
        prompts,
        eos_ids(tokenizer, target),
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        bins=bins,
        seed=seed,
        max_length=longest,
    )
    draft.train(was_training)
    if res is None:
        return {"skipped": "no verified drafts were recorded"}
    draft_dir = Path(draft_dir)
    res["conditions"] = {
        "draft": str(draft_dir.resolve()),
        "target": str(getattr(target.config, "_name_or_path", "") or "target"),
        "datasets": ["the run's held-out split (data.eval)"],
        **res["conditions"],
    }
    res["written_to"] = str(write_temperatures(draft_dir, res["temperatures"]))
    write_report(res, draft_dir)
    return res


def calibrate_after_training(cfg, accelerator, target, tokenizer, draft, eval_ds) -> dict:
    """STS on the run's held-out split, written beside its published draft (main process
    only; a sharded target is left to eval/calibrate.py on the saved draft)."""
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
