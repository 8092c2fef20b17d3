"""Attention of an n-token target pass computed one query row at a time (exact verification).

A CPU attention kernel computes 1 query and n queries differently: HF's SDPA packs the GQA
heads of a lone query into the query axis and repeats K/V for n, torch's CPU flash kernel then
blocks and multiplies each shape in its own order, and in bf16 that moves the attention output
by a few ulps (measured on an AVX2 EPYC: 2.4e-4 in SmolLM2's layer 1, 0.5 in the logits), so
the verify pass can pick another argmax than the 1-token step plain decoding takes. The linear
layers and norms act on each row alone and did not depend on n (1-8 rows) on that CPU; where a
CPU's GEMM does (an AVX-512-BF16 EPYC's), row_linear.py runs those layers per row too.
`TargetRunner.forward(row_kv_lens=)` switches a pass here (`dispatching_rows`).

`row_exact_attention` makes row i of a verify pass the very call the 1-token step makes at that
position: the base attention (sdpa, eager, ...) with that row's query alone, the K/V slots
`[0, row_kv_lens[i])` the 1-token step would attend (the decoder's bucketed length) and the same
mask row. Greedy speculative output then equals the decoder's own plain greedy output in any
dtype where the linear layers are row-independent or run per row (row_linear.py). Cost: n small
attention calls per layer instead of one (docs/results.md has the measured cost).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

NAME = "dspark_row_exact"


def row_exact_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    row_kv_lens: list[int] | None = None,
    base_attention: Callable | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """`query [B, h, n, d]`, `key`/`value [B, kv_h, S, d]`, mask `[B, 1, n, S]` (or None) ->
    `[B, n, h, d]` as HF attention functions return it. `row_kv_lens [n]` (each <= S): the
    K/V length row i attends; None (or n = 1) runs the base attention once, unchanged.
    `base_attention`: the model's own attention function (`base_attention_of`; None: sdpa)."""
    base = base_attention or ALL_ATTENTION_FUNCTIONS["sdpa"]
    n = query.shape[2]
    if row_kv_lens is None or n == 1:
        return base(module, query, key, value, attention_mask, **kwargs)
    if len(row_kv_lens) != n:
        raise ValueError(f"{len(row_kv_lens)} row KV lengths for {n} query rows")
    # One call per row, each with that row's query alone: the call the 1-token step makes.
    # (Folding rows into the batch axis instead is not bit-exact: torch's CPU kernel computed
    # 1 in 200 random cases differently at another batch size, measured on an AVX2 EPYC.)
    rows = []
    for i, kv in enumerate(row_kv_lens):
        mask = None if attention_mask is None else attention_mask[:, :, i : i + 1, :kv]
        out, _ = base(
            module, query[:, :, i : i + 1], key[:, :, :kv], value[:, :, :kv], mask, **kwargs
        )
        rows.append(out)  # [B, 1, h, d]
    return torch.cat(rows, dim=1), None


AttentionInterface.register(NAME, row_exact_attention)


def base_attention_of(model) -> Callable:
    """The attention function `model`'s layers call now: a registered one (sdpa, flex, ...), or
    for `eager` the function of the model's own modeling file (HF keeps one per model)."""
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[impl]
    attn = next((m for m in model.modules() if hasattr(m, "num_key_value_groups")), None)
    fn = getattr(sys.modules.get(type(attn).__module__), "eager_attention_forward", None)
    if attn is None or fn is None:
        raise ValueError(f"no attention function for attn_implementation={impl!r} to run per row")
    return fn


@contextmanager
def dispatching_rows(model):
    """Within the block, `model`'s attention layers dispatch to `row_exact_attention` (which
    runs the model's own implementation, named by the caller as `base_attention`)."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def exact_rows_for(target, requested: bool | None, compile: bool = False) -> bool:
    """`requested` when given, else `default_exact_rows` for the target's device and dtype now."""
    if requested is not None:
        return bool(requested)
    param = next(target.parameters())
    return default_exact_rows(param.device, compile, param.dtype)


def default_exact_rows(device: torch.device, compile: bool, dtype: torch.dtype) -> bool:
    """Row-exact verification by default for a bf16 / fp16 target on a CPU: there the batched
    pass changed greedy output on 7 of 12 prompts (SmolLM2, AVX2 EPYC), and row-exact costs
    ~5% of a verify pass (docs/results.md). Not in fp32 (no divergence measured, and up to
    ~25% of an 8-token pass), not under `compile` (the dispatch swap sits outside the compiled
    graph), not on GPUs (n kernel launches a layer; GPU GEMMs also round by shape)."""
    low = dtype in (torch.bfloat16, torch.float16)
    return device.type == "cpu" and not compile and low
