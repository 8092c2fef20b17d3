"""Decode with a DSpark draft through transformers' own `generate()` API.

    out = target.generate(input_ids, attention_mask=mask, max_new_tokens=64,
                          custom_generate="examples/dspark_generate",  # a local directory
                          trust_remote_code=True, draft="exports/my-draft")

`draft` is a `DSparkDraftModel` or a draft directory of any layout `dspark.export.load_draft`
reads. The output is what `generate()` returns for decoder-only models: the input ids (padding
kept) followed by the new tokens, rows that stopped early padded with `pad_token_id`. Greedy
(`do_sample=False`) output equals the target's own greedy decoding; with `do_sample=True` the
tokens follow the target's distribution under `temperature` / `top_k` / `top_p` (lossless
speculative sampling, dspark.decoding). Logits processors, stopping criteria, beams and
streamers are not supported (a clear error, not a silent ignore).
"""

from __future__ import annotations

import torch

from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder
from dspark.export import load_draft

_UNSUPPORTED = (
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "assistant_model",
    "streamer",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
)


def _setting(name, kwargs, generation_config, model, default=None):
    if kwargs.get(name) is not None:
        return kwargs[name]
    for cfg in (generation_config, getattr(model, "generation_config", None)):
        value = getattr(cfg, name, None) if cfg is not None else None
        if value is not None:
            return value
    return default


@torch.no_grad()
def generate(model, inputs=None, generation_config=None, draft=None, **kwargs) -> torch.Tensor:
    """`model.generate(...)` with DSpark speculative decoding (see the module docstring)."""

    if draft is None:
        raise ValueError("pass draft= (a DSparkDraftModel or a draft directory) to generate()")
    for name in _UNSUPPORTED:
        if kwargs.get(name):
            raise ValueError(f"dspark's generate() does not support {name}")
    if (_setting("num_beams", kwargs, generation_config, model, 1) or 1) > 1:
        raise ValueError("dspark's generate() decodes one sequence per prompt (num_beams=1)")
    if isinstance(draft, (str, bytes)) or hasattr(draft, "__fspath__"):
        device = next(model.parameters()).device
        draft = load_draft(draft, device=device)
    input_ids = inputs if inputs is not None else kwargs.get("input_ids")
    if input_ids is None:
        raise ValueError("generate() needs input_ids")
    mask = kwargs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(input_ids)
    prompts = [row[m.bool()].tolist() for row, m in zip(input_ids, mask)]
    max_new = _setting("max_new_tokens", kwargs, generation_config, model)
    if max_new is None:
        max_len = _setting("max_length", kwargs, generation_config, model, 20)
        max_new = max(0, int(max_len) - input_ids.shape[1])
    sample = bool(_setting("do_sample", kwargs, generation_config, model, False))
    temperature = (
        float(_setting("temperature", kwargs, generation_config, model, 1.0)) if sample else 0.0
    )
    sampling = Sampling(
        temperature,
        int(_setting("top_k", kwargs, generation_config, model, 0) or 0) if sample else 0,
        float(_setting("top_p", kwargs, generation_config, model, 1.0) or 1.0) if sample else 1.0,
    )
    max_length = max(len(p) for p in prompts) + int(max_new) + int(draft.config.block_size) + 8
    decoder = SpeculativeDecoder(model, draft, DecoderOptions(sampling, max_length=max_length))
    eos = _setting("eos_token_id", kwargs, generation_config, model)
    out = decoder.generate(prompts, int(max_new), eos_token_id=eos, seed=kwargs.get("seed"))
    pad = _setting("pad_token_id", kwargs, generation_config, model)
    if pad is None:
        pad = eos[0] if isinstance(eos, (list, tuple)) else (eos if eos is not None else 0)
    width = max((len(s) for s in out.sequences), default=0)
    new = torch.full(
        (len(prompts), width), int(pad), dtype=input_ids.dtype, device=input_ids.device
    )
    for b, seq in enumerate(out.sequences):
        new[b, : len(seq)] = torch.tensor(seq, dtype=input_ids.dtype)
    return torch.cat([input_ids, new], dim=1)
