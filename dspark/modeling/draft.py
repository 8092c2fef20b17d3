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
from dspark.errors import BadInputError
from dspark.modeling.backbone import BlockParallelBackbone
from dspark.modeling.heads import build_confidence_head, build_markov_head
from dspark.modeling.lora import has_lora, merged_copy
from dspark.modeling.slot_chunks import SlotLoss, chunked_slot_terms
from dspark.modeling.vocab_map import check_t2d, ids_from_d2t, mapping_from_ids

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
    slot_terms: with `forward(..., slot_loss=)`, the loss's per-slot terms `{name: [M]}`
        (computed chunk by chunk, `dspark.modeling.slot_chunks`); `logits` is then None.
    """

    hidden: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    confidence_logits: torch.Tensor | None = None
    slot_terms: dict[str, torch.Tensor] | None = None


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


def _kept_rows(config: DSparkConfig, kept_ids) -> torch.Tensor | None:
    """The sorted target ids `[K]` a fresh reduced draft keeps (None for a full one),
    checked against `config.draft_vocab_size`."""
    K = config.draft_vocab_size
    if kept_ids is None:
        if K is not None:
            raise ValueError(
                f"config.draft_vocab_size={K}: pass kept_ids, the {K} target ids the draft scores "
                "(dspark.data.draft_vocab writes them)"
            )
        return None
    ids = torch.as_tensor(kept_ids, dtype=torch.long).flatten().cpu()
    if ids.numel() == int(config.vocab_size) and K is None:
        mapping_from_ids(ids, int(config.vocab_size))  # every id once: the full vocabulary
        return None
    if K is None or ids.numel() != int(K):
        raise ValueError(
            f"kept_ids holds {ids.numel()} target ids but config.draft_vocab_size is {K}: "
            "build the config with draft_vocab_size=len(kept_ids)"
        )
    mapping_from_ids(ids, int(config.vocab_size), source="kept_ids")  # in range, no repeats
    return torch.unique(ids)


class DSparkDraftModel(BlockParallelBackbone, PreTrainedModel):
    config: DSparkConfig
    # buffers of a reduced draft vocabulary only (absent on a full draft): `d2t [K]` long,
    # `t2d [V]` bool
    d2t: torch.Tensor
    t2d: torch.Tensor
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
        if config.draft_vocab_size is not None:
            # The reduced vocabulary's maps (dspark/modeling/vocab_map.py), saved with the
            # weights: d2t [K] offsets (target id = draft id + d2t), t2d [V] kept-id flags.
            # Placeholders (ids 0..K-1) until `from_target` or a checkpoint fills them.
            K, V = int(config.draft_vocab_size), int(config.vocab_size)
            t2d = torch.zeros(V, dtype=torch.bool)
            t2d[:K] = True
            self.register_buffer("d2t", torch.zeros(K, dtype=torch.long), persistent=True)
            self.register_buffer("t2d", t2d, persistent=True)
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
        kept_ids: torch.Tensor | list[int] | None = None,
    ) -> DSparkDraftModel:
        """A fresh draft for `target_model`: `embed_tokens` and `lm_head` are copies (never ties,
        also for tied-embedding targets such as SmolLM2) of the target's, frozen.

        A reduced vocabulary (`config.draft_vocab_size` K) needs `kept_ids`, the K target ids
        the draft scores (any order, no repeats): `lm_head` takes the target head's rows at
        those ids in increasing order, and `d2t` / `t2d` map them. Placed on the target's
        device, in `dtype` (default float32).
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
        rows = _kept_rows(config, kept_ids)  # [K] sorted target ids, None when full
        model = cls(config)
        with torch.no_grad():
            model.embed_tokens.weight.copy_(emb.detach().float())
            if rows is None:
                model.lm_head.weight.copy_(head.detach().float())
            else:
                model.lm_head.weight.copy_(head.detach()[rows.to(head.device)].float())

                d2t, t2d = mapping_from_ids(rows, int(V))
                model.d2t.copy_(d2t)
                model.t2d.copy_(t2d)
        # transformers' `to` is @wraps(nn.Module.to), which mypy types as an unbound function
        model.to(device=emb.device, dtype=dtype or torch.float32)  # type: ignore[call-arg]
        model.freeze_target_copies()
        return model

    def freeze_target_copies(self) -> None:
        """`embed_tokens` and `lm_head` are the target's, never trained."""
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    # ---------------------------------------------------------------- draft vocabulary
    @property
    def kept_target_ids(self) -> torch.Tensor | None:
        """The target ids `[K]` (long, strictly increasing) the draft's logits score, i.e.
        `d2t + arange(K)`; None for a full-vocabulary draft (draft id == target id)."""
        d2t = getattr(self, "d2t", None)
        if d2t is None:
            return None
        return d2t + torch.arange(d2t.numel(), device=d2t.device)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of `draft_ids [...]` (values in 0..K-1), same shape; the identity for a
        full-vocabulary draft."""
        d2t = getattr(self, "d2t", None)
        if d2t is None:
            return draft_ids
        return draft_ids + d2t[draft_ids]

    def check_vocab_maps(self) -> None:
        """Raise `BadInputError` when `d2t` / `t2d` are not one consistent map of K increasing
        target ids (a damaged or hand-edited checkpoint); a full draft has nothing to check."""
        d2t = getattr(self, "d2t", None)
        if d2t is None:
            return

        ids = ids_from_d2t(d2t.cpu(), int(self.config.vocab_size))
        check_t2d(self.t2d.cpu(), ids)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> DSparkDraftModel:
        want_info = bool(kwargs.pop("output_loading_info", False))
        loaded: Any = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        model: DSparkDraftModel = loaded[0]
        info: dict[str, Any] = loaded[1]
        lost = sorted({"d2t", "t2d"} & set(info.get("missing_keys") or ()))
        if lost:  # transformers only warns; the placeholder maps would score the wrong tokens
            raise BadInputError(
                f"{args[0] if args else 'the checkpoint'}: config.json declares a reduced draft "
                f"vocabulary (draft_vocab_size={model.config.draft_vocab_size}) but the weights "
                f"hold no {' / '.join(lost)}; re-save or re-export the draft with its maps"
            )
        model.freeze_target_copies()
        model.check_vocab_maps()
        return (model, info) if want_info else model  # type: ignore[return-value]  # transformers' tuple form

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any):
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
    def _selected_slots(
        self,
        hidden: torch.Tensor,
        prev_tokens: torch.Tensor,
        slot_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`(h, mixed, feat)` of the selected slots: `[M, H]`, `[M, r]`, `[M, r]` (mixed / feat
        None without a Markov head), or `[..., gamma, *]` without `slot_mask`. Rank-r only: the
        rnn head runs over every slot (its state needs the block's prefix) before selection."""
        head = self.markov_head
        h = hidden if slot_mask is None else hidden[slot_mask]
        if head is None:
            return h, None, None
        mixed, feat = head.teacher_forced(hidden, prev_tokens)
        if slot_mask is not None:
            mixed, feat = mixed[slot_mask], feat[slot_mask]
        return h, mixed, feat

    def _slot_logits(self, h: torch.Tensor, mixed: torch.Tensor | None) -> torch.Tensor:
        """Markov-corrected logits `[.., K]` = lm_head(h) + W2(mixed) (K = V when full)."""
        logits = self.lm_head(h)
        if self.markov_head is not None and mixed is not None:
            logits = logits + self.markov_head.bias(mixed)
        return logits

    def _confidence_logits(self, h: torch.Tensor, feat: torch.Tensor | None) -> torch.Tensor | None:
        if self.confidence_head is None:
            return None
        return self.confidence_head(h, feat if self.confidence_head.with_markov else None)

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
        h, mixed, feat = self._selected_slots(hidden, prev_tokens, slot_mask)
        return self._slot_logits(h, mixed), self._confidence_logits(h, feat)

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
        slot_loss: SlotLoss | None = None,
        chunk_size: int | None = None,
    ) -> DSparkDraftOutput:
        """Training forward: all anchor blocks in one pass, heads teacher-forced.

        `tapped [B, S, L*H]`, `input_ids [B, S]`, `anchor_positions [B, N]`, `anchor_valid [B, N]`,
        `slot_mask [B, N, gamma]` (which slots to compute logits for; None = all); packed rows
        add `document_ids` / `position_ids [B, S]` (see `forward_blocks`).

        `slot_loss` (needs `slot_mask`): instead of the `[M, K]` logits, return its per-slot
        terms in `slot_terms`, computed `chunk_size` slots at a time with recomputation in
        backward (0 / None: all slots in one chunk); it is called as
        `slot_loss(logits [m, K], rows, kept_ids)` with the chunk's slice `rows` of the M
        selected slots (row-major order of `slot_mask`) and the reduced vocabulary's sorted
        target ids `kept_ids [K]` (None for the full vocabulary).
        """
        hidden = self.forward_blocks(
            tapped, input_ids, anchor_positions, anchor_valid, document_ids, position_ids
        )
        if slot_loss is None and not return_logits:
            return DSparkDraftOutput(hidden=hidden)
        prev = teacher_forced_prev_tokens(input_ids, anchor_positions, int(self.config.block_size))
        if slot_loss is None:
            logits, conf = self.head_outputs(hidden, prev, slot_mask)
            return DSparkDraftOutput(hidden=hidden, logits=logits, confidence_logits=conf)
        if slot_mask is None:
            raise ValueError("forward(slot_loss=...) needs the slot_mask of the supervised slots")
        h, mixed, feat = self._selected_slots(hidden, prev, slot_mask)
        # the sorted kept target ids of a reduced draft vocabulary [K] (None: the full one)
        kept_ids = self.kept_target_ids
        terms = chunked_slot_terms(self._slot_logits, slot_loss, h, mixed, kept_ids, chunk_size)
        return DSparkDraftOutput(
            hidden=hidden, confidence_logits=self._confidence_logits(h, feat), slot_terms=terms
        )


if TYPE_CHECKING:  # mypy (make test) checks that the draft is what the decoder takes

    def _is_draft_inference(draft: DSparkDraftModel) -> DraftInference:
        return draft
