"""Target features for training: online capture from the frozen target, or a precomputed source.

The objective asks a `FeatureSource` for `TargetFeatures` of a batch:
- `tapped [B, S, L*H]`: raw outputs of the decoder layers in `target_layer_ids`, concatenated in
  that order (= HF `hidden_states[i + 1]` for layer id i);
- `final_hidden [B, S, H]`: the target's last hidden state AFTER its final norm (the target
  distribution is `softmax(lm_head(final_hidden))`; mixing pre-/post-norm corrupts every loss).

`OnlineTargetCapture` runs the frozen target inside the training step (no grad, in its own
dtype, autocast off) with forward hooks on the tapped decoder layers; `lm_head` is applied
later, by the objective, at supervised positions only (`target_logits`). An offline feature
cache plugs in as another `FeatureSource` (`BatchFeatures` reads tensors already in the batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from dspark.target.exact_linear import exact_in_bf16, fp32_linear


@dataclass
class TargetFeatures:
    tapped: torch.Tensor  # [B, S, L*H]
    final_hidden: torch.Tensor  # [B, S, H], post final norm
    # Optional, `[B, S]`, from an offline cache for a reduced-vocabulary draft
    # (`target_summary`): the logsumexp and argmax of the target's fp32 logits over its whole
    # vocabulary at `final_hidden`, so a step needs the target's logits at the kept ids only.
    final_logsumexp: torch.Tensor | None = None
    final_argmax: torch.Tensor | None = None


@runtime_checkable
class FeatureSource(Protocol):
    """Gives the target features of a batch (dict with `input_ids`, `attention_mask`, ...)."""

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> TargetFeatures: ...


def base_model(target: nn.Module) -> Any:
    """The decoder stack of an HF causal LM (`target.model` for Llama/Qwen).

    Typed `Any`: its class (and its layers') is each architecture's own; callers use its
    `layers`, `norm` and its forward.
    """
    prefix = getattr(target, "base_model_prefix", "model") or "model"
    base = getattr(target, prefix, None)
    if base is None or not hasattr(base, "layers"):
        raise TypeError(f"cannot find the decoder layers of {type(target).__name__}")
    return base


def num_decoder_layers(target: nn.Module) -> int:
    return len(base_model(target).layers)


class OnlineTargetCapture:
    """Run the frozen target on the batch and capture tapped layers + post-norm final state."""

    def __init__(self, target: nn.Module, target_layer_ids: Sequence[int]) -> None:
        self.target = target
        self.layer_ids = [int(i) for i in target_layer_ids]
        n = num_decoder_layers(target)
        bad = [i for i in self.layer_ids if not 0 <= i < n - 1]
        if bad:
            raise ValueError(
                f"target_layer_ids {bad} are not tappable in a {n}-layer target (valid: 0..{n - 2})"
            )

    @torch.no_grad()
    def __call__(self, batch: Mapping[str, torch.Tensor]) -> TargetFeatures:
        base = base_model(self.target)
        captured: dict[int, torch.Tensor] = {}
        hooks = []

        def make_hook(i):
            def hook(_module, _args, output):
                captured[i] = output[0] if isinstance(output, (tuple, list)) else output

            return hook

        for i in self.layer_ids:
            hooks.append(base.layers[i].register_forward_hook(make_hook(i)))
        input_ids = batch["input_ids"]
        try:
            with torch.autocast(input_ids.device.type, enabled=False):
                out = base(input_ids=input_ids, use_cache=False, **target_mask_kwargs(batch))
        finally:
            for h in hooks:
                h.remove()
        tapped = torch.cat([captured[i] for i in self.layer_ids], dim=-1)
        return TargetFeatures(tapped=tapped, final_hidden=out.last_hidden_state)


def target_mask_kwargs(batch: Mapping[str, torch.Tensor]) -> dict:
    """How the target must see a batch: padded rows by their `attention_mask`; packed rows
    (`position_ids` restarting at 0 per conversation, see `dspark.data.packing`) by their
    position ids alone, with NO 2D mask. transformers (>= 4.54, 5.x here) then derives
    document-aware causal attention from the position restarts (`find_packed_sequence_indices`:
    every restart opens a new document; each trailing pad, at position 0, is a document of its
    own), for sdpa, eager and flex alike, and flash-attention uses the same ids as varlen
    boundaries; RoPE uses the per-document positions. So each conversation's features equal
    those of the conversation run alone (tests/test_packing.py checks it on every tiny target).
    """
    if "position_ids" in batch:
        return {"position_ids": batch["position_ids"], "attention_mask": None}
    return {"attention_mask": batch.get("attention_mask")}


class BatchFeatures:
    """Offline seam: the features are already in the batch (`tapped`, `final_hidden`, and
    where the loader added them, `final_logsumexp` / `final_argmax`)."""

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> TargetFeatures:
        return TargetFeatures(
            tapped=batch["tapped"],
            final_hidden=batch["final_hidden"],
            final_logsumexp=batch.get("final_logsumexp"),
            final_argmax=batch.get("final_argmax"),
        )


def target_logits(lm_head: torch.nn.Module, final_hidden: torch.Tensor) -> torch.Tensor:
    """fp32 target logits from post-norm hidden states (only the rows you pass); autocast off,
    so a bf16 training step still gets an fp32 target distribution (`fp32_linear`)."""
    weight = lm_head.weight
    assert isinstance(weight, torch.Tensor)  # an nn.Linear-like head's [V, H] parameter
    return fp32_linear(final_hidden, weight, getattr(lm_head, "bias", None))


@torch.no_grad()
def target_summary(
    lm_head: torch.nn.Module, final_hidden: torch.Tensor, chunk_rows: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logsumexp [N], argmax [N])` of the target's fp32 logits over its whole vocabulary at
    `final_hidden [N, H]`, `chunk_rows` rows of `[rows, V]` logits at a time. With them, a
    reduced-vocabulary loss needs the target's logits at the kept ids only
    (`kept_target_logits`, `dspark.losses.target_probs_at_kept`)."""
    # The head cast to fp32 once, not per chunk: a [V, H] copy per 1024 rows was ~30% of the
    # time for a bf16 SmolLM2 head (V 49,152) on a 2-core CPU. The values of target_logits.
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    assert isinstance(weight, torch.Tensor)
    exact = exact_in_bf16(final_hidden, weight)
    weight, bias = weight.float(), None if bias is None else bias.float()
    lse, top = [], []
    for s in range(0, max(final_hidden.shape[0], 1), chunk_rows):  # an empty input: one chunk
        z = fp32_linear(final_hidden[s : s + chunk_rows], weight, bias, bf16_exact=exact)
        lse.append(torch.logsumexp(z, dim=-1))
        top.append(z.max(dim=-1).indices)  # argmax (max: faster than argmax on a CPU)
    return torch.cat(lse), torch.cat(top)


@dataclass(frozen=True)
class KeptHead:
    """The target head's rows at a draft's kept ids, cast to fp32 once (`kept_head`)."""

    weight: torch.Tensor  # [K, H] fp32
    bias: torch.Tensor | None  # [K] fp32, or None for a head without one
    bf16_exact: bool  # the head is bf16, so its rows are exact in bf16 (`fp32_linear`)


def kept_head(lm_head: torch.nn.Module, kept_ids: torch.Tensor) -> KeptHead:
    """The rows of the target's head at `kept_ids [K]`, for `kept_target_logits`."""
    weight = lm_head.weight
    assert isinstance(weight, torch.Tensor)
    idx = kept_ids.to(weight.device)
    bias = getattr(lm_head, "bias", None)
    return KeptHead(
        weight=weight.detach().index_select(0, idx).float(),
        bias=None if bias is None else bias.detach().index_select(0, idx).float(),
        bf16_exact=weight.dtype == torch.bfloat16,
    )


def kept_target_logits(head: KeptHead, final_hidden: torch.Tensor) -> torch.Tensor:
    """fp32 target logits `[M, K]` at the kept ids, autocast off: the columns `kept_ids` of
    `target_logits`, up to the matmul's rounding."""
    exact = head.bf16_exact and final_hidden.dtype == torch.bfloat16
    return fp32_linear(final_hidden, head.weight, head.bias, bf16_exact=exact)
