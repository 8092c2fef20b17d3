"""Warm start: a fresh draft initialised from the frozen target's own weights.

A cold draft has to learn from scratch what the target already knows; copying target decoder
layers gives it the target's own attention and MLP maps at step 0 (method doc: start a draft
from pretrained weights, not from scratch). What is copied, and why:

- draft layer i <- target decoder layer `layer_ids[i]` (q/k/v/o, MLP, both layer norms; the
  target's q/k norms for Qwen3 targets). Default: the last `n` target layers, N-n .. N-1, so
  the draft's output passes through the same final layers, final `norm` and `lm_head` as the
  target's own next-token prediction.
- q/k norms of Llama / Qwen2 targets (whose layers have none): set to the mean per-head RMS of
  the target's own q / k projections on a calibration sequence, so that RMSNorm(q) * w ~= q and
  the attention scale starts where the target's is. (Qwen2's q/k/v biases have no place in
  Qwen3-style layers and are not copied.)
- `fc` selects the last tapped layer's features (identity block, zeros elsewhere) and
  `hidden_norm` takes the first copied layer's `input_layernorm` weight: the context keys and
  values are then exactly what that target layer computes from the tapped layer's output (the
  default taps end at N-n-1, whose output feeds layer N-n).
- `norm` <- the target's final norm. Markov `W2` starts at zero (bias 0: the draft's first
  logits are the copied layers' own), `W1` and the confidence head keep their random init.
  A reduced draft vocabulary changes nothing here: its `lm_head` already holds the target
  head's rows at the kept ids (`from_target`), `W2` is zeroed at its K rows, and the q/k-norm
  calibration reads target ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from dspark.errors import BadInputError
from dspark.modeling.layers import DSparkDecoderLayer
from dspark.target.capture import base_model

if TYPE_CHECKING:
    from dspark.modeling.draft import DSparkDraftModel


def default_init_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The last `num_draft_layers` target decoder layers: N-n .. N-1."""
    n, N = int(num_draft_layers), int(num_target_layers)
    if n > N:
        raise ValueError(f"cannot copy {n} layers from a {N}-layer target")
    return list(range(N - n, N))


@torch.no_grad()
def _qk_rms(
    target, layer_ids: list[int], calib_ids: torch.Tensor
) -> dict[int, tuple[float, float]]:
    """Mean per-head RMS of q_proj / k_proj outputs of each layer on `calib_ids [1, S]`."""
    base = base_model(target)
    out: dict[int, list[float]] = {}
    hooks = []

    def hook_for(i, which, head_dim):
        def hook(_m, _args, y):
            heads = y.float().reshape(-1, head_dim)
            out.setdefault(i, [0.0, 0.0])[which] = float(heads.pow(2).mean(-1).sqrt().mean())

        return hook

    for i in layer_ids:
        attn = base.layers[i].self_attn
        d = (
            getattr(attn, "head_dim", None)
            or target.config.hidden_size // target.config.num_attention_heads
        )
        hooks.append(attn.q_proj.register_forward_hook(hook_for(i, 0, d)))
        hooks.append(attn.k_proj.register_forward_hook(hook_for(i, 1, d)))
    try:
        with torch.autocast(calib_ids.device.type, enabled=False):
            base(input_ids=calib_ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {i: (v[0], v[1]) for i, v in out.items()}


@torch.no_grad()
def warm_start_from_target(
    draft: DSparkDraftModel,
    target: nn.Module,
    layer_ids: list[int] | None = None,
    calib_ids: torch.Tensor | None = None,
) -> list[int]:
    """Initialise `draft` in place from `target` (see the module docstring); return the ids of
    the copied target layers. `calib_ids [1, S]` feeds the q/k-norm calibration of targets
    without q/k norms (default: a fixed pseudo-random sequence of the target's vocabulary)."""
    cfg = draft.config
    base = base_model(target)
    n_target = len(base.layers)
    ids = (
        list(layer_ids)
        if layer_ids is not None
        else default_init_layers(n_target, cfg.num_hidden_layers)
    )
    if len(ids) != cfg.num_hidden_layers:
        raise BadInputError(
            f"draft.init_layers has {len(ids)} ids but the draft has {cfg.num_hidden_layers} layers"
        )
    bad = [i for i in ids if not 0 <= i < n_target]
    if bad:
        raise BadInputError(
            f"draft.init_layers {bad} are not layers of a {n_target}-layer target: name ids "
            f"in 0..{n_target - 1}, or null for the last ones"
        )
    needs_calib = any(getattr(base.layers[i].self_attn, "q_norm", None) is None for i in ids)
    rms = {}
    if needs_calib:
        if calib_ids is None:
            g = torch.Generator().manual_seed(0)
            calib_ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=g)
        rms = _qk_rms(target, ids, calib_ids.to(next(target.parameters()).device))
    for i, src_id in enumerate(ids):
        src, dst = base.layers[src_id], draft.layers[i]
        assert isinstance(dst, DSparkDecoderLayer)  # what _build_backbone puts in draft.layers
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(dst.self_attn, name).weight.copy_(getattr(src.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(dst.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
        dst.input_layernorm.weight.copy_(src.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
        if getattr(src.self_attn, "q_norm", None) is not None:
            dst.self_attn.q_norm.weight.copy_(src.self_attn.q_norm.weight)
            dst.self_attn.k_norm.weight.copy_(src.self_attn.k_norm.weight)
        else:
            q_rms, k_rms = rms[src_id]
            dst.self_attn.q_norm.weight.fill_(q_rms)
            dst.self_attn.k_norm.weight.fill_(k_rms)
    H = cfg.hidden_size
    draft.fc.weight.zero_()
    draft.fc.weight[:, -H:].copy_(torch.eye(H))
    draft.hidden_norm.weight.copy_(base.layers[ids[0]].input_layernorm.weight)
    draft.norm.weight.copy_(base.norm.weight)
    if draft.markov_head is not None:
        draft.markov_head.markov_w2.weight.zero_()
    return ids
