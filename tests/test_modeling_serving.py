"""The serving architecture: every draft is Qwen3-style whatever the target family, its config
parses as transformers' own Qwen3Config, its decoder layer computes what HF's Qwen3 layer
computes, and checkpoints in the earlier per-family layout fail with the conversion command (and convert)."""

import json

import pytest
import torch
from helpers import make_draft

from dspark.modeling import DSparkDraftModel


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_draft_layer_equals_hf_qwen3_layer(tiny_target, tmp_path, arch):
    """An independent reference: transformers' Qwen3 decoder layer, built from the config.json
    we write (parsed by Qwen3Config, as engines do) and loaded with our layer's weights, gives
    our layer's output on a block with no context (bidirectional inside the block)."""
    from transformers import AutoConfig
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    target, tok = tiny_target(arch)
    draft = make_draft(target, tok, num_hidden_layers=1).eval()
    with torch.no_grad():  # non-trivial norms, so a misplaced q/k norm shows
        for p in draft.layers[0].parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    draft.save_pretrained(tmp_path)
    hf_cfg = AutoConfig.for_model(**json.loads((tmp_path / "config.json").read_text()))
    assert type(hf_cfg).__name__ == "Qwen3Config"
    hf_cfg._attn_implementation = "eager"
    hf = Qwen3DecoderLayer(hf_cfg, layer_idx=0).eval()
    missing, unexpected = hf.load_state_dict(
        {
            k[len("layers.0.") :]: v
            for k, v in draft.state_dict().items()
            if k.startswith("layers.0.")
        },
        strict=False,
    )
    assert not missing and not unexpected
    B, g, H = 2, 5, draft.config.hidden_size
    x = torch.randn(B, g, H)
    pos = torch.arange(3, 3 + g)[None].expand(B, -1)
    with torch.no_grad():
        rope = Qwen3RotaryEmbedding(hf_cfg)(x, pos)
        want = hf(
            x, attention_mask=torch.zeros(B, 1, g, g), position_embeddings=rope, position_ids=pos
        )
        want = want[0] if isinstance(want, tuple) else want
        cos, sin = draft.rope(pos, x.dtype)
        n_kv, d = draft.config.num_key_value_heads, draft.config.head_dim
        empty = torch.zeros(B, n_kv, 0, d)
        got = draft.layers[0](x, cos, sin, empty, empty, torch.ones(B, 1, g, g, dtype=torch.bool))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_legacy_checkpoint_fails_with_the_fix_and_converts(tiny_target, tmp_path):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, num_hidden_layers=2)
    old = tmp_path / "old"
    draft.save_pretrained(old)
    # Make it the earlier per-family layout: LlamaDSparkModel, no q/k norms.
    cfg = json.loads((old / "config.json").read_text())
    cfg.update(architectures=["LlamaDSparkModel"], model_type="llama")
    (old / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    state = {
        k: v
        for k, v in load_file(str(old / "model.safetensors")).items()
        if "_norm." not in k or "layernorm" in k
    }
    assert not any("q_norm" in k for k in state)
    save_file(state, str(old / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"python -m dspark\.modeling\.legacy"):
        DSparkDraftModel.from_pretrained(old)

    from dspark.modeling.legacy import convert_legacy_draft

    new = tmp_path / "new"
    notes = convert_legacy_draft(old, new)
    assert any("q_norm" in n for n in notes)
    loaded = DSparkDraftModel.from_pretrained(new)
    assert json.loads((new / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    for k, v in state.items():  # every old tensor kept, bit for bit
        assert torch.equal(loaded.state_dict()[k], v), k
    assert torch.equal(loaded.layers[0].self_attn.q_norm.weight, torch.ones(draft.config.head_dim))
    with pytest.raises(FileExistsError):
        convert_legacy_draft(old, new)
