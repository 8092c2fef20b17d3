"""STS calibration at the end of training (`trainer.calibrate_prompts` > 0).

The published draft decodes the first `calibrate_prompts` held-out conversations' prompts
(each row's tokens before its first supervised one) with full-block verification and raw
confidences, fits Sequential Temperature Scaling on the even-indexed requests and scores the
odd-indexed ones before/after (`dspark/eval/calibration.py`), then writes the temperatures into
the draft's `config.json` (`confidence_temperatures`: the decoder applies them, export carries
them) and `calibration.{json,md}` + `calibration_reliability.png` beside it. The same fit as
`eval/calibrate.py`, on the run's own held-out split instead of benchmark-style prompt sets.
"""

from __future__ import annotations

from pathlib import Path

import torch


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
    from dspark.decoding import SpeculativeDecoder
    from dspark.eval import calibration as cal
    from dspark.eval.calibrate import (
        collect,
        reliability_png,
        render_markdown,
        write_temperatures,
    )
    from dspark.eval.runner import eos_ids

    if getattr(draft, "confidence_head", None) is None:
        return {"skipped": "the draft has no confidence head"}
    if len(prompts) < 2:
        return {"skipped": f"{len(prompts)} held-out prompts; STS needs at least 2"}
    was_training = draft.training
    draft.eval()
    longest = max(len(p) for p in prompts) + max_new_tokens + int(draft.config.block_size) + 2
    decoder = SpeculativeDecoder(
        target, draft, verify_policy="full", calibrate=False, max_length=longest
    )
    per_request = collect(
        decoder, prompts, max_new_tokens, batch_size, eos_ids(tokenizer, target), seed
    )
    draft.train(was_training)
    fit = cal.sts_split_fit(per_request, bins)
    if fit is None:
        return {"skipped": "no verified drafts were recorded"}
    param = next(target.parameters())
    res = {
        "conditions": {
            "draft": str(Path(draft_dir).resolve()),
            "target": str(getattr(target.config, "_name_or_path", "") or "target"),
            "datasets": ["the run's held-out split (data.eval)"],
            "requests": len(prompts),
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "block_size": decoder.gamma,
            "verification": "full block, raw confidences",
            "bins": bins,
            "device": str(param.device),
            "dtype": str(param.dtype).replace("torch.", ""),
            "seed": seed,
        },
        **fit,
    }
    draft_dir = Path(draft_dir)
    res["written_to"] = str(write_temperatures(draft_dir, fit["temperatures"]))
    (draft_dir / "calibration.json").write_text(_json(res))
    (draft_dir / "calibration.md").write_text(render_markdown(res))
    reliability_png(res, draft_dir / "calibration_reliability.png")
    return res


def _json(obj) -> str:
    import json

    return json.dumps(obj, indent=2) + "\n"
