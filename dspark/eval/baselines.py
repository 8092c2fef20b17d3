"""What a user would otherwise run on the same target: transformers' own `generate`.

- `hf_generate`: plain greedy `model.generate` (the reference speed for the other two);
- `hf_assisted`: assisted generation, `generate(..., assistant_model=draft)`. With no hub,
  the small standalone draft is a *truncated self-draft*: a copy of the target keeping its
  embedding, its first k decoder layers, its final norm and its lm_head (LayerSkip-style
  early exit without the LayerSkip training, so acceptance is what an untrained early exit
  gives; k = `assistant_layers`);
- `hf_prompt_lookup`: prompt-lookup decoding, `generate(..., prompt_lookup_num_tokens=n)`.
All greedy, batch 1, same prompts and `max_new_tokens` as dspark's decoder.
"""

from __future__ import annotations

import copy
import time

import torch

from dspark.timing import sync

BASELINES = ("hf_generate", "hf_assisted", "hf_prompt_lookup")


def truncated_self_draft(target, num_layers: int):
    """A copy of `target` with only its first `num_layers` decoder layers (shared weights cloned)."""
    total = target.config.num_hidden_layers
    if not 1 <= num_layers < total:
        raise ValueError(
            f"assistant_layers={num_layers} must be in 1..{total - 1} for a {total}-layer target"
        )
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    param = next(target.parameters())
    draft = type(target)(cfg).to(dtype=param.dtype, device=param.device)
    missing, unexpected = draft.load_state_dict(target.state_dict(), strict=False)
    kept = [k for k in unexpected if ".layers." not in k]
    if missing or kept:
        raise RuntimeError(f"truncated draft mismatch: missing {missing}, unexpected {kept}")
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval().requires_grad_(False)


@torch.inference_mode()
def hf_generate(
    model, prompt: list[int], max_new_tokens: int, eos_token_id, pad_token_id, **kwargs
) -> tuple[list[int], float]:
    """Greedy `model.generate` on one prompt; returns (new tokens, wall seconds)."""
    device = model.device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    sync(device)
    start = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        **kwargs,
    )
    sync(device)
    seconds = time.perf_counter() - start
    new = out[0, ids.shape[1] :].tolist()
    return _until_eos(new, eos_token_id), seconds


def _until_eos(tokens: list[int], eos_token_id) -> list[int]:
    eos = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def baseline_kwargs(
    name: str,
    assistant=None,
    prompt_lookup_num_tokens: int = 10,
    num_assistant_tokens: int | None = None,
) -> dict:
    """`generate` kwargs that select baseline `name`."""
    if name == "hf_generate":
        return {}
    if name == "hf_assisted":
        kw = {"assistant_model": assistant}
        if num_assistant_tokens is not None:
            kw["num_assistant_tokens"] = num_assistant_tokens
        return kw
    if name == "hf_prompt_lookup":
        return {"prompt_lookup_num_tokens": prompt_lookup_num_tokens}
    raise ValueError(f"unknown baseline {name!r}; choose from {BASELINES}")
