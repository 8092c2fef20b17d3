"""llama.cpp's names for a DSpark draft in a GGUF file: the architecture (`dflash`) and the tensor
names. Shared by the writer (`dspark/export/gguf.py`) and the reader (`dspark/export/gguf_load.py`),
so the reader needs no part of the writer.
"""

from __future__ import annotations

import re

ARCH = "dflash"
# llama.cpp's tensor names for ours (HF names without the `model.` prefix)
TOP_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",  # the fused target features' norm
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(name: str) -> str | None:
    """llama.cpp's name for a draft tensor, or None when llama.cpp has no place for it."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if m and m.group(2) in LAYER_NAMES:
        return f"blk.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    return None
