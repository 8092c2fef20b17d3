"""The block-parallel backbone over KV-injected target features (DFlash-style).

Context: tapped target features `[B, S, L*H]` -> `hidden_norm(fc(.))` -> `ctx [B, S, H]`, which
every draft layer turns into keys/values with its own k/v projections (RoPE positions 0..S-1).
Blocks, anchor-first: `[x_p, mask x (gamma-1)]` at positions p..p+gamma-1; slot j predicts
x_{p+j+1}. A block attends to the context strictly before its anchor and bidirectionally to
its own slots, never to another block.

Two entry points share the same layers, so training and decoding cannot drift apart:
`block_hidden` (one block per row, over a KV cache: the decoder's) and `forward_blocks` (all
anchor blocks of a batch in one pass with an explicit mask: training's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask

# Imported at run time, not only for the checker: PreTrainedModel.__init_subclass__ resolves the
# `config` annotations of the draft's bases (typing.get_type_hints) when the class is created.
from dspark.config import DSparkConfig
from dspark.modeling.layers import DSparkDecoderLayer, DSparkRMSNorm, DSparkRope

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

# flex attention's mask_mod(b, h, q_idx, kv_idx) -> bool tensor
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def block_input_ids(
    input_ids: torch.Tensor, anchor_positions: torch.Tensor, mask_token_id: int, block_size: int
) -> torch.Tensor:
    """`[B, S]`, `[B, N]` -> block ids `[B, N, gamma]` = `[x_p, mask, ..., mask]`."""
    anchors = input_ids.gather(1, anchor_positions.clamp(0, input_ids.shape[1] - 1))
    B, N = anchor_positions.shape
    ids = anchors.new_full((B, N, block_size), int(mask_token_id))
    ids[:, :, 0] = anchors
    return ids


def block_position_ids(anchor_positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """`[B, N]` -> `[B, N, gamma]` positions p..p+gamma-1."""
    offs = torch.arange(block_size, device=anchor_positions.device)
    return anchor_positions[..., None] + offs


def training_block_mask(
    anchor_positions: torch.Tensor,
    anchor_valid: torch.Tensor | None,
    seq_len: int,
    block_size: int,
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean attention mask `[B, 1, N*gamma, S + N*gamma]` (True = may attend).

    Query slot of block n attends to context keys at positions < p_n and to the keys of block
    n only. With `document_ids [B, S]` (packed rows) a context key must also belong to the
    anchor's document, so nothing of another conversation in the row reaches the block.
    Invalid (dummy) blocks see their own block only: never a fully masked row (SDPA would
    return NaN), and their outputs are masked out of every loss anyway.
    """
    B, N = anchor_positions.shape
    dev = anchor_positions.device
    g = block_size
    q_block = torch.arange(N * g, device=dev) // g  # [Q]
    p = anchor_positions.gather(1, q_block.expand(B, -1))  # [B, Q]
    ctx_pos = torch.arange(seq_len, device=dev)
    ctx_ok = ctx_pos[None, None, :] < p[:, :, None]  # [B, Q, S]
    if document_ids is not None:
        anchor_doc = document_ids.gather(1, p.clamp(0, seq_len - 1))  # [B, Q]
        ctx_ok = ctx_ok & (document_ids[:, None, :] == anchor_doc[:, :, None])
    if anchor_valid is not None:
        ctx_ok = ctx_ok & anchor_valid.gather(1, q_block.expand(B, -1))[:, :, None]
    blk_ok = (q_block[:, None] == q_block[None, :]).expand(B, -1, -1)  # [B, Q, Q]
    return torch.cat([ctx_ok, blk_ok], dim=2)[:, None]


def training_mask_mod(
    anchor_positions: torch.Tensor,
    anchor_valid: torch.Tensor | None,
    seq_len: int,
    block_size: int,
    document_ids: torch.Tensor | None = None,
) -> MaskMod:
    """The flex-attention `mask_mod(b, h, q_idx, kv_idx)` of `training_block_mask` (same rule,
    element-wise), over `S + N*gamma` keys: context first, then the blocks."""
    g, S = block_size, seq_len
    valid = (
        anchor_valid
        if anchor_valid is not None
        else torch.ones_like(anchor_positions, dtype=torch.bool)
    )

    def mask_mod(
        b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        qb = q_idx // g
        p = anchor_positions[b, qb]
        in_ctx = (kv_idx < S) & (kv_idx < p) & valid[b, qb]
        if document_ids is not None:
            kv_c = torch.clamp(kv_idx, max=S - 1)
            in_ctx = in_ctx & (document_ids[b, kv_c] == document_ids[b, torch.clamp(p, 0, S - 1)])
        in_blk = (kv_idx >= S) & ((kv_idx - S) // g == qb)
        return in_ctx | in_blk

    return mask_mod


def training_flex_block_mask(
    anchor_positions: torch.Tensor,
    anchor_valid: torch.Tensor | None,
    seq_len: int,
    block_size: int,
    document_ids: torch.Tensor | None = None,
) -> BlockMask:
    """The same mask as `training_block_mask`, as a flex-attention `BlockMask` (CUDA path)."""
    B, N = anchor_positions.shape
    mask_mod = training_mask_mod(anchor_positions, anchor_valid, seq_len, block_size, document_ids)
    return create_block_mask(
        mask_mod,
        B=B,
        H=None,
        Q_LEN=N * block_size,
        KV_LEN=seq_len + N * block_size,
        device=anchor_positions.device,
    )


def flex_attention_available() -> bool:
    """Flex attention runs compiled on CUDA only (torch >= 2.13 always ships it)."""
    return torch.cuda.is_available()


class BlockParallelBackbone:
    """Mixin for the draft `PreTrainedModel`: owns `embed_tokens`, `fc`, `hidden_norm`,
    `layers`, `norm`, `lm_head` at the top level, so the state-dict keys are the serving
    layout's unprefixed names.
    """

    config: DSparkConfig  # set by the PreTrainedModel it is mixed into

    def _build_backbone(self, config: DSparkConfig) -> None:
        H, V = config.hidden_size, config.vocab_size
        self.embed_tokens = nn.Embedding(V, H)
        self.fc = nn.Linear(config.num_target_features * H, H, bias=False)
        self.hidden_norm = DSparkRMSNorm(H, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(
            [DSparkDecoderLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.norm = DSparkRMSNorm(H, eps=config.rms_norm_eps)
        # K rows: the target's head at the draft's ids (K = V unless the vocabulary is reduced)
        self.lm_head = nn.Linear(H, config.num_draft_tokens, bias=False)
        self.rope = DSparkRope(config)
        # "sdpa" (explicit boolean mask; the tested path), "flex" or "auto" (flex on CUDA).
        self.attn_backend = "sdpa"

    # ---------------------------------------------------------------- inference API
    def encode_context(self, tapped: torch.Tensor) -> torch.Tensor:
        """`tapped [B, S, L*H]` -> `ctx [B, S, H]` = `hidden_norm(fc(tapped))`."""
        return self.hidden_norm(self.fc(tapped.to(self.fc.weight.dtype)))

    def context_kv(
        self, ctx: torch.Tensor, position_ids: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer `(k, v)`, each `[B, n_kv, S, d]`, k normed and rotated."""
        cos, sin = self.rope(position_ids, ctx.dtype)
        # nn.ModuleList is not generic (it yields nn.Module); these are the layers built above
        layers = cast(Iterable[DSparkDecoderLayer], self.layers)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in layers]

    def block_hidden(
        self,
        block_ids: torch.Tensor,
        block_position_ids: torch.Tensor,
        ctx_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        ctx_valid: torch.Tensor,
    ) -> torch.Tensor:
        """One block per row over cached context keys/values -> `h [B, gamma, H]` (final norm).

        `ctx_valid [B, C]` says which cache slots the block may attend to (positions < p).
        """
        B, g = block_ids.shape
        x = self.embed_tokens(block_ids)
        cos, sin = self.rope(block_position_ids, x.dtype)
        own = torch.ones(B, g, g, dtype=torch.bool, device=x.device)
        ctx_ok = ctx_valid.to(torch.bool)[:, None, :].expand(B, g, -1)
        mask = torch.cat([ctx_ok, own], dim=2)[:, None]
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    # ---------------------------------------------------------------- training path
    def _use_flex(self, device: torch.device) -> bool:
        if self.attn_backend == "flex":
            return True
        if self.attn_backend == "auto":
            return device.type == "cuda" and flex_attention_available()
        return False

    def forward_blocks(
        self,
        tapped: torch.Tensor,
        input_ids: torch.Tensor,
        anchor_positions: torch.Tensor,
        anchor_valid: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every anchor block of a batch in one pass -> final-normed `h [B, N, gamma, H]`.

        `tapped [B, S, L*H]`, `input_ids [B, S]`, `anchor_positions [B, N]` (long), optional
        `anchor_valid [B, N]` bool (False = dummy block, masked out downstream). Packed rows add
        `document_ids [B, S]` (context keys from the anchor's document only) and per-document
        `position_ids [B, S]` (RoPE: context at its own position, block at pos(p)..pos(p)+gamma-1).
        """
        cfg = self.config
        assert cfg.mask_token_id is not None  # DSparkDraftModel refuses a config without one
        g = int(cfg.block_size)
        B, S = input_ids.shape
        N = anchor_positions.shape[1]
        ctx = self.encode_context(tapped)
        if position_ids is None:
            ctx_pos = torch.arange(S, device=input_ids.device).expand(B, -1)
            block_start = anchor_positions
        else:
            ctx_pos = position_ids
            block_start = position_ids.gather(1, anchor_positions.clamp(0, S - 1))
        ctx_kv = self.context_kv(ctx, ctx_pos)
        ids = block_input_ids(input_ids, anchor_positions, cfg.mask_token_id, g).view(B, N * g)
        pos = block_position_ids(block_start, g).view(B, N * g)
        x = self.embed_tokens(ids)
        cos, sin = self.rope(pos, x.dtype)
        mask: torch.Tensor | BlockMask
        if self._use_flex(x.device):
            mask = training_flex_block_mask(anchor_positions, anchor_valid, S, g, document_ids)
        else:
            mask = training_block_mask(anchor_positions, anchor_valid, S, g, document_ids)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x).view(B, N, g, -1)
