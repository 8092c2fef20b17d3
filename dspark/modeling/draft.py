"""`DSparkDraftModel`: backbone + Markov head + confidence head, saved in the serving layout.

State-dict keys are exactly the unprefixed names of method doc section 7 (`embed_tokens.weight`,
`fc.weight`, `layers.0.self_attn.q_proj.weight`, `markov_head.markov_w1.weight`,
`confidence_head.proj.weight`, ...), so `save_pretrained` writes the DeepSpec / upstream-vLLM
layout and `DSparkDraftModel.from_pretrained(dir)` loads it back without the trainer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from dspark.config import DSparkConfig
from dspark.modeling.backbone import BlockParallelBackbone
from dspark.modeling.heads import build_confidence_head, build_markov_head

if TYPE_CHECKING:
    from dspark.modeling.protocols import DraftInference


@dataclass
class DSparkDraftOutput(ModelOutput):
    """Training forward output.

    hidden: final-normed block states `[B, N, gamma, H]`.
    logits: Markov-corrected draft logits, teacher-forced (previous token = data token);
        `[M, V]` over the slots selected by `slot_mask` (row-major order of `[B, N, gamma]`),
        or `[B, N, gamma, V]` without a `slot_mask`.
    confidence_logits: confidence-head logits, same leading shape as `logits` (None if off).
    """

    hidden: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    confidence_logits: torch.Tensor | None = None


def teacher_forced_prev_tokens(
    input_ids: torch.Tensor, anchor_positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Previous token of each slot: slot k of the block at p gets x_{p+k} (slot 0: the anchor).

    Positions past the sequence end are clamped (those slots are never supervised).
    """
    offs = torch.arange(block_size, device=anchor_positions.device)
    pos = (anchor_positions[..., None] + offs).clamp(max=input_ids.shape[1] - 1)
    B = input_ids.shape[0]
    return input_ids.gather(1, pos.view(B, -1)).view(pos.shape)


class DSparkDraftModel(BlockParallelBackbone, PreTrainedModel):
    config: DSparkConfig
    config_class = DSparkConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    _no_split_modules = ["DSparkDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        if config.mask_token_id is None:
            raise ValueError("DSparkConfig.mask_token_id must be set to build a draft")
        if not config.target_layer_ids:
            raise ValueError("DSparkConfig.target_layer_ids must be set to build a draft")
        self._build_backbone(config)
        self.markov_head = build_markov_head(config)
        self.confidence_head = build_confidence_head(config)
        self.post_init()
        self.freeze_target_copies()

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_target(
        cls,
        target_model: PreTrainedModel,
        config: DSparkConfig,
        *,
        dtype: torch.dtype | None = None,
    ) -> DSparkDraftModel:
        """A fresh draft for `target_model`: `embed_tokens` and `lm_head` are copies (never ties,
        also for tied-embedding targets such as SmolLM2) of the target's, frozen.

        Placed on the target's device, in `dtype` (default float32).
        """
        emb = target_model.get_input_embeddings().weight
        head = target_model.get_output_embeddings().weight
        assert isinstance(emb, torch.Tensor) and isinstance(head, torch.Tensor)  # module weights
        V, H = config.vocab_size, config.hidden_size
        if tuple(emb.shape) != (V, H) or tuple(head.shape) != (V, H):
            raise ValueError(
                f"target embeddings {tuple(emb.shape)} / lm_head {tuple(head.shape)} do not match "
                f"the draft config (vocab {V}, hidden {H}); build the config from this target"
            )
        model = cls(config)
        with torch.no_grad():
            model.embed_tokens.weight.copy_(emb.detach().float())
            model.lm_head.weight.copy_(head.detach().float())
        # transformers' `to` is @wraps(nn.Module.to), which mypy types as an unbound function
        model.to(device=emb.device, dtype=dtype or torch.float32)  # type: ignore[call-arg]
        model.freeze_target_copies()
        return model

    def freeze_target_copies(self) -> None:
        """`embed_tokens` and `lm_head` are the target's, never trained."""
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> DSparkDraftModel:
        model = super().from_pretrained(*args, **kwargs)
        model.freeze_target_copies()
        return model

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any):
        from dspark.training.lora import has_lora, merged_copy

        if has_lora(self):  # LoRA fine-tuning: a saved draft is always the merged serving layout
            kwargs.pop("state_dict", None)
            return merged_copy(self).save_pretrained(save_directory, *args, **kwargs)
        out = super().save_pretrained(save_directory, *args, **kwargs)
        # PreTrainedModel writes its class name; the serving name lives in the config.
        self.config.architectures = [self.config.serving_architecture()]
        return out

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    # ---------------------------------------------------------------- heads, teacher-forced
    def head_outputs(
        self,
        hidden: torch.Tensor,
        prev_tokens: torch.Tensor,
        slot_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Markov-corrected logits and confidence logits with given previous tokens.

        `hidden [..., gamma, H]`, `prev_tokens [..., gamma]`; with `slot_mask [..., gamma]` the
        outputs are `[M, V]` / `[M]` over the selected slots, else `[..., gamma, V]` / `[..., gamma]`.
        The rnn head runs over every slot (its state needs the prefix) before the selection.
        """
        head = self.markov_head
        h = hidden if slot_mask is None else hidden[slot_mask]
        feat = None
        if head is None:
            logits = self.lm_head(h)
        else:
            mixed, feat = head.teacher_forced(hidden, prev_tokens)
            if slot_mask is not None:
                mixed, feat = mixed[slot_mask], feat[slot_mask]
            logits = self.lm_head(h) + head.bias(mixed)
        conf = None
        if self.confidence_head is not None:
            conf = self.confidence_head(h, feat if self.confidence_head.with_markov else None)
        return logits, conf

    def forward(
        self,
        tapped: torch.Tensor,
        input_ids: torch.Tensor,
        anchor_positions: torch.Tensor,
        anchor_valid: torch.Tensor | None = None,
        slot_mask: torch.Tensor | None = None,
        return_logits: bool = True,
        document_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> DSparkDraftOutput:
        """Training forward: all anchor blocks in one pass, heads teacher-forced.

        `tapped [B, S, L*H]`, `input_ids [B, S]`, `anchor_positions [B, N]`, `anchor_valid [B, N]`,
        `slot_mask [B, N, gamma]` (which slots to compute logits for; None = all); packed rows
        add `document_ids` / `position_ids [B, S]` (see `forward_blocks`).
        """
        hidden = self.forward_blocks(
            tapped, input_ids, anchor_positions, anchor_valid, document_ids, position_ids
        )
        if not return_logits:
            return DSparkDraftOutput(hidden=hidden)
        prev = teacher_forced_prev_tokens(input_ids, anchor_positions, int(self.config.block_size))
        logits, conf = self.head_outputs(hidden, prev, slot_mask)
        return DSparkDraftOutput(hidden=hidden, logits=logits, confidence_logits=conf)


if TYPE_CHECKING:  # mypy (make test) checks that the draft is what the decoder takes

    def _is_draft_inference(draft: DSparkDraftModel) -> DraftInference:
        return draft
