"""Fit the confidence head's Sequential Temperature Scaling on decoded prompts and write it
into a draft.

Decodes prompts with full-block verification and RAW confidences (so every position has a
label), fits STS (method doc section 4, `dspark.calibration.metrics`) on the even-indexed
requests, scores the odd-indexed ones before/after, and writes the temperatures into the
draft's `config.json` as `confidence_temperatures` (which `DSparkConfig` reads and the decoder
applies). Used by the benchmark-prompt fit (`dspark.eval.calibrate`, `eval/calibrate.py`) and
by the end-of-training fit on the run's held-out split (`dspark.training.calibrate`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dspark.calibration import metrics as cal
from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder, VerifyPolicy

CONFIG_KEY = "confidence_temperatures"


def write_temperatures(draft_dir: str | os.PathLike, temperatures: list[float] | None) -> Path:
    """Set (or with None remove) `confidence_temperatures` in `draft_dir/config.json`, atomically."""
    path = Path(draft_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: pass a draft saved with save_pretrained")
    config = json.loads(path.read_text())
    if temperatures is None:
        config.pop(CONFIG_KEY, None)
    else:
        config[CONFIG_KEY] = [float(t) for t in temperatures]
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def collect(decoder, prompts: list[list[int]], max_new_tokens: int, batch_size: int, eos, seed):
    """Per-request `round_matrices` triples (raw confidences) from decoding `prompts`."""
    gamma = decoder.gamma
    per_request = []
    for lo in range(0, len(prompts), batch_size):
        out = decoder.generate(
            prompts[lo : lo + batch_size], max_new_tokens, eos_token_id=eos, seed=seed + lo
        )
        for c, a, v in zip(out.confidences, out.accept_lengths, out.verify_lengths):
            per_request.append(cal.round_matrices([c], [a], [v], gamma))
    return per_request


def fit_on_prompts(
    target,
    draft,
    prompts: list[list[int]],
    eos,
    *,
    max_new_tokens: int,
    batch_size: int,
    bins: int,
    seed: int,
    temperature: float = 0.0,
    max_length: int | None = None,
) -> dict | None:
    """Decode `prompts` with full-block verification and raw confidences, fit STS on the
    even-indexed requests and score the odd ones: the fit (None when no draft was verified)
    with the decoding conditions under "conditions" (callers add what the prompts were)."""

    if max_length is None:
        max_length = int(getattr(target.config, "max_position_embeddings", 0) or 32768)
    decoder = SpeculativeDecoder(
        target,
        draft,
        DecoderOptions(
            Sampling(temperature), VerifyPolicy("full", calibrate=False), max_length=max_length
        ),
    )
    torch.manual_seed(seed)
    per_request = collect(decoder, prompts, max_new_tokens, batch_size, eos, seed)
    fit = cal.sts_split_fit(per_request, bins)
    if fit is None:
        return None
    param = next(target.parameters())
    conditions = {
        "requests": len(prompts),
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "block_size": decoder.gamma,
        "verification": "full block, raw confidences",
        "bins": bins,
        "device": str(param.device),
        "dtype": str(param.dtype).replace("torch.", ""),
        "seed": seed,
    }
    return {"conditions": conditions, **fit}
