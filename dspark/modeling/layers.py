"""Building blocks of the draft backbone: RMSNorm, RoPE, KV-injected block attention, MLP.

Attention takes its queries from the block tokens only; its keys/values are the concatenation
of precomputed context keys/values (the projected target features through this layer's own
k/v projections) and the block's own keys/values. The mask is explicit: a boolean tensor
`[B, 1, Q, K]` (True = may attend) on the SDPA path, or a flex-attention `BlockMask`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import flex_attention
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask
    from typing_extensions import TypeIs

    from dspark.config import DSparkConfig


class DSparkRMSNorm(nn.Module):
    """RMSNorm computed in fp32 (as Llama/Qwen do); the weight multiplies in the input dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * xf.to(dtype)


class DSparkRope:
    """Rotary tables for the target's RoPE (default, linear, llama3, yarn, ...).

    Deliberately not an `nn.Module` with buffers: nothing to save, nothing for a meta-device
    load to leave uninitialised. The inverse frequencies are computed once per device.
    """

    def __init__(self, config: DSparkConfig) -> None:
        self.config = config
        self._cache: dict[torch.device, tuple[torch.Tensor, float]] = {}

    def _inv_freq(self, device: torch.device) -> tuple[torch.Tensor, float]:
        if device not in self._cache:
            params = self.config.rope_parameters or {}
            rope_type = params.get("rope_type", "default")
            if rope_type == "default":
                base = float(params.get("rope_theta", 10000.0))
                dim = int(self.config.head_dim * params.get("partial_rotary_factor", 1.0))
                inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
                scale = 1.0
            else:
                if rope_type == "dynamic":
                    raise ValueError("dynamic RoPE scaling is not supported by DSpark drafts")
                inv, scale = ROPE_INIT_FUNCTIONS[rope_type](self.config, device="cpu")
            self._cache[device] = (inv.float().to(device), float(scale))
        return self._cache[device]

    def __call__(
        self, position_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`position_ids [B, T]` -> `(cos, sin)` each `[B, T, head_dim]` in `dtype`."""
        inv, scale = self._inv_freq(position_ids.device)
        freqs = position_ids[..., None].float() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x [B, heads, T, d]`, `cos/sin [B, T, d']` (d' <= d: partial rotary keeps the rest)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def _is_block_mask(mask: object) -> TypeIs[BlockMask]:
    return type(mask).__name__ == "BlockMask"


_COMPILED_FLEX = None


def _flex_attention(device: torch.device):
    """flex_attention, compiled on CUDA (uncompiled it materialises the full score matrix)."""
    global _COMPILED_FLEX

    if device.type != "cuda":
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


class DSparkAttention(nn.Module):
    """Block queries over [context ; block] keys/values; Qwen3-style (per-head q/k RMSNorm)
    for every target family, so the one engine class `Qwen3DSparkModel` serves every draft."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        # DSparkConfig.__post_init__ fills both from the attention heads / hidden size
        assert config.head_dim is not None and config.num_key_value_heads is not None
        H, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.n_rep = self.num_heads // self.num_kv_heads
        bias = config.qkv_bias
        self.q_proj = nn.Linear(H, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(H, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(H, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, H, bias=bias)
        self.q_norm = DSparkRMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = DSparkRMSNorm(d, eps=config.rms_norm_eps)

    def project_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`x [B, T, H]` -> `(k, v)` each `[B, n_kv, T, d]`, k normed and rotated."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | BlockMask,
    ) -> torch.Tensor:
        """`x [B, Q, H]` block states; `ctx_k/ctx_v [B, n_kv, C, d]`; `mask` over `C + Q` keys."""
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.num_heads, self.head_dim))
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k_b, v_b = self.project_kv(x, cos, sin)
        k = torch.cat([ctx_k.to(k_b.dtype), k_b], dim=2)
        v = torch.cat([ctx_v.to(v_b.dtype), v_b], dim=2)
        if _is_block_mask(mask):
            flex = _flex_attention(q.device)
            out = flex(q, k, v, block_mask=mask, enable_gqa=self.n_rep > 1)
        else:
            k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(B, Q, self.num_heads * self.head_dim)
        return self.o_proj(out)


class DSparkMLP(nn.Module):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()

        H, inter = config.hidden_size, config.intermediate_size
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_proj = nn.Linear(H, inter, bias=bias)
        self.up_proj = nn.Linear(H, inter, bias=bias)
        self.down_proj = nn.Linear(inter, H, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DSparkDecoderLayer(nn.Module):
    """Pre-norm decoder layer; the context enters as precomputed keys/values only."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.self_attn = DSparkAttention(config)
        self.mlp = DSparkMLP(config)
        self.input_layernorm = DSparkRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DSparkRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | BlockMask,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
