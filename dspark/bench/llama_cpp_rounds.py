"""The acceptance side of llama.cpp's flag choice (`dspark.bench.llama_cpp_flags`): the bundled
decoder's rounds on the tuning prompts, with the raw confidences llama.cpp's `p_min` cut reads
and the STS-calibrated survival that predicts acceptance."""

from __future__ import annotations

import numpy as np

from dspark.bench import llama_cpp_flags as flags


def decoder_rounds(draft_dir, target_spec: str, prompt_sets, max_new_tokens: int) -> dict:
    """Rounds of the bundled decoder (fp32, T=0, full-block verification, raw confidences) on
    `prompt_sets`: `conf [R, gamma]` (NaN where unrecorded), its STS-calibrated `survival`,
    and what was decoded. The acceptance side of `llama_cpp_flags`."""
    import torch  # light module: defers torch

    from dspark.calibration.fit import collect  # light module: defers torch
    from dspark.decoding import (  # light module: defers torch
        DecoderOptions,
        SpeculativeDecoder,
        VerifyPolicy,
    )
    from dspark.export.load import load_draft  # light module: defers torch
    from dspark.target import load_target  # light module: defers torch

    target, tokenizer = load_target(target_spec, dtype=torch.float32)
    draft = load_draft(draft_dir).eval().requires_grad_(False)
    temps = getattr(draft.config, "confidence_temperatures", None)
    full = VerifyPolicy("full", calibrate=False)
    decoder = SpeculativeDecoder(target, draft, DecoderOptions(policy=full, max_length=4096))
    prompts = [p for ps in prompt_sets.values() for p in ps]
    eos = tokenizer.eos_token_id
    per_request = collect(decoder, prompts, max_new_tokens, 1, eos, 0)
    conf = np.concatenate([m[0] for m in per_request]) if per_request else np.zeros((0, 1))
    return {
        "conf": conf,
        "survival": flags.calibrated_survival(conf, temps),
        "count": int(conf.shape[0]),
        "requests": len(prompts),
        "calibrated": temps is not None,
        "decoder": "bundled, float32, T=0, full-block verification",
        "mean_accepted_full_block": float(
            np.mean([a.sum(1).mean() for _, a, _ in per_request]) if per_request else 0.0
        ),
    }
