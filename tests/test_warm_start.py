"""Warm start from target layers: copied weights, and context keys/values that equal the copied
target layer's own on the tapped features (an independent reference: HF's layer, hooked)."""

import pytest
import torch
from helpers import make_draft

from dspark.modeling.warm_start import default_init_layers, warm_start_from_target


def test_default_init_layers():
    assert default_init_layers(30, 2) == [28, 29]
    assert default_init_layers(4, 1) == [3]
    with pytest.raises(ValueError, match="cannot copy"):
        default_init_layers(2, 3)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_warm_start_copies_layers_and_reproduces_context_kv(tiny_target, arch):
    target, tok = tiny_target(arch)
    # Tap layer 1 so that its output feeds the first copied layer (2): the context keys of
    # draft layer 0 must then be target layer 2's keys on the same positions.
    draft = make_draft(target, tok, num_hidden_layers=2, target_layer_ids=[0, 1]).eval()
    ids = warm_start_from_target(draft, target)
    assert ids == [2, 3]
    src = target.model.layers[2]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert torch.equal(
            getattr(draft.layers[0].self_attn, name).weight, getattr(src.self_attn, name).weight
        )
    assert torch.equal(
        draft.layers[1].mlp.down_proj.weight, target.model.layers[3].mlp.down_proj.weight
    )
    assert torch.equal(draft.norm.weight, target.model.norm.weight)
    assert torch.count_nonzero(draft.markov_head.markov_w2.weight) == 0

    x = torch.randint(0, 300, (2, 11))
    seen = {}
    h = src.self_attn.k_proj.register_forward_hook(lambda m, a, y: seen.__setitem__("k", y))
    hv = src.self_attn.v_proj.register_forward_hook(lambda m, a, y: seen.__setitem__("v", y))
    with torch.no_grad():
        hs = target(x, output_hidden_states=True).hidden_states
    h.remove()
    hv.remove()
    tapped = torch.cat([hs[1], hs[2]], dim=-1)
    with torch.no_grad():
        ctx = draft.encode_context(tapped)
        attn = draft.layers[0].self_attn
        B, S = x.shape
        k = attn.k_proj(ctx).view(B, S, attn.num_kv_heads, attn.head_dim)
        v = attn.v_proj(ctx)
    if arch == "qwen2":  # Qwen2's k/v biases have no place in Qwen3-style layers
        want_k = seen["k"] - src.self_attn.k_proj.bias
        want_v = seen["v"] - src.self_attn.v_proj.bias
    else:
        want_k, want_v = seen["k"], seen["v"]
    torch.testing.assert_close(k.reshape(B, S, -1), want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, want_v, rtol=1e-5, atol=1e-5)
    if arch == "qwen3":
        assert torch.equal(attn.k_norm.weight, src.self_attn.k_norm.weight)
    else:
        # q/k norms calibrated to the target's mean per-head RMS: RMSNorm(k) keeps k's scale.
        kn = attn.k_norm(k)
        ratio = kn.pow(2).mean().sqrt() / k.pow(2).mean().sqrt()
        assert 0.7 < float(ratio) < 1.4
