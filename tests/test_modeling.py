"""DSparkConfig and DSparkDraftModel: layer ids, validation, masks, training == inference,
heads == formulas, serving-layout save/load."""

import json

import pytest
import torch
from helpers import make_draft as _make_draft

from dspark.config import (
    DSparkConfig,
    choose_mask_token_id,
    default_target_layer_ids,
)
from dspark.modeling import DSparkDraftModel
from dspark.modeling.backbone import (
    block_input_ids,
    block_position_ids,
    training_block_mask,
    training_flex_block_mask,
)
from dspark.modeling.draft import teacher_forced_prev_tokens


def make_draft(target, tok, **kw):
    kw.setdefault("num_hidden_layers", 2)
    return _make_draft(target, tok, **kw)


def tapped_of(target, ids, layer_ids):
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in layer_ids], dim=-1)


# ---------------------------------------------------------------------------- config


def test_default_target_layer_ids():
    assert default_target_layer_ids(36) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(30) == [1, 8, 14, 21, 27]  # SmolLM2-135M
    assert default_target_layer_ids(4) == [0, 1, 2]  # tiny targets
    for n_layers in range(2, 81):
        for n in (1, 3, 5):
            ids = default_target_layer_ids(n_layers, n)
            assert ids == sorted(set(ids)) and ids
            assert 0 <= ids[0] and ids[-1] <= n_layers - 2
            assert len(ids) == min(n, n_layers - 1)


def test_config_copies_target(tiny_target, arch):
    target, tok = tiny_target(arch)
    cfg = DSparkConfig.from_target_config(
        target.config, mask_token_id=choose_mask_token_id(tok), target_name_or_path="tiny-x"
    )
    tc = target.config
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
        "vocab_size",
        "max_position_embeddings",
    ):
        assert getattr(cfg, key) == getattr(tc, key), key
    assert (
        cfg.head_dim == 16 and cfg.rope_parameters["rope_theta"] == tc.rope_parameters["rope_theta"]
    )
    assert cfg.num_hidden_layers == 5 and cfg.num_target_layers == 4
    assert cfg.target_layer_ids == [0, 1, 2]
    assert cfg.target_model_type == arch
    assert cfg.mask_token_id == tok.convert_tokens_to_ids("<|reserved_0|>")
    d = cfg.to_dict()
    # One servable architecture for every family: Qwen3 layers, parsed by engines as Qwen3Config.
    assert d["architectures"] == ["Qwen3DSparkModel"] and d["tie_word_embeddings"] is False
    assert d["model_type"] == "qwen3" and d["target_model_type"] == arch
    assert d["sample_from_anchor"] is True and d["target_name_or_path"] == "tiny-x"
    assert d["attention_bias"] is False  # a Qwen2 target's q/k/v biases are not copied


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"target_layer_ids": [0, 3]}, "final layer"),
        ({"target_layer_ids": [0, 7]}, "out of range"),
        ({"target_layer_ids": [2, 1]}, "strictly increasing"),
        ({"block_size": 0}, "block_size"),
        ({"mask_token_id": 10_000}, "outside the vocabulary"),
    ],
)
def test_config_validation(tiny_target, kw, msg):
    target, _ = tiny_target("qwen3")
    kw = {"mask_token_id": 5, **kw}
    with pytest.raises(ValueError, match=msg):
        DSparkConfig.from_target_config(target.config, **kw)


def test_unknown_markov_head_is_refused_when_the_draft_is_built(tiny_target):
    target, _ = tiny_target("qwen3")
    cfg = DSparkConfig.from_target_config(target.config, mask_token_id=5, markov_head_type="lstm")
    with pytest.raises(ValueError, match=r"markov_head_type 'lstm'.*'vanilla'"):
        DSparkDraftModel.from_target(target, cfg)


def test_markov_rank_0_means_confidence_on_h_k_alone(tiny_target, tmp_path):
    """`draft.markov_rank=0` with the schema's other defaults (README sweep) is a valid draft:
    no Markov head, a confidence head Linear(H -> 1) reading h_k only, saved as such."""
    target, _ = tiny_target("qwen3")
    cfg = DSparkConfig.from_target_config(
        target.config, mask_token_id=5, markov_rank=0, confidence_head_with_markov=True
    )
    assert cfg.confidence_head_with_markov is False and cfg.enable_confidence_head
    draft = DSparkDraftModel.from_target(target, cfg)
    assert draft.markov_head is None
    assert draft.confidence_head.proj.in_features == cfg.hidden_size
    cfg.save_pretrained(tmp_path)
    assert DSparkConfig.from_pretrained(tmp_path).confidence_head_with_markov is False


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"markov_head_type": "rnn"},
        {"markov_rank": 0, "confidence_head_with_markov": False},
        {"enable_confidence_head": False},
    ],
)
def test_draft_satisfies_the_inference_protocol(tiny_target, kw):
    """The decoder's draft API (docs/contracts.md, `DraftInference`) is what the model has."""
    from types import SimpleNamespace

    from dspark.modeling.protocols import (
        ConfidenceHeadInference,
        DraftInference,
        MarkovHeadInference,
    )

    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok, num_hidden_layers=1, **kw)
    assert isinstance(draft, DraftInference)
    if draft.markov_head is not None:
        assert isinstance(draft.markov_head, MarkovHeadInference)
    if draft.confidence_head is not None:
        assert isinstance(draft.confidence_head, ConfidenceHeadInference)
    assert (draft.markov_head is None) == (kw.get("markov_rank") == 0)
    assert (draft.confidence_head is None) == (kw.get("enable_confidence_head") is False)
    # the runtime check sees missing members
    partial = SimpleNamespace(config=draft.config, lm_head=draft.lm_head, markov_head=None)
    assert not isinstance(partial, DraftInference)


def test_choose_mask_token_fallbacks():
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

        def __len__(self):
            return len(self.vocab)

    assert choose_mask_token_id(Tok({"a": 0, "b": 1}), vocab_size=8) == 2  # first spare row
    assert choose_mask_token_id(Tok({"a": 0, "<empty_output>": 1}), vocab_size=2) == 1
    assert choose_mask_token_id(Tok({"<|reserved_special_token_0|>": 9, "x": 0})) == 9
    with pytest.raises(ValueError, match="mask_token_id"):
        choose_mask_token_id(Tok({"a": 0}), vocab_size=1)


# ---------------------------------------------------------------------------- masks


def test_training_mask_layout():
    anchors = torch.tensor([[0, 3], [2, 0]])
    valid = torch.tensor([[True, True], [True, False]])
    m = training_block_mask(anchors, valid, seq_len=5, block_size=2)[:, 0]
    assert m.shape == (2, 4, 5 + 4)
    # block 0 of row 0 (anchor 0): no context, own block only
    assert m[0, 0].tolist() == [False] * 5 + [True, True, False, False]
    # block 1 of row 0 (anchor 3): context 0..2, own block
    assert m[0, 3].tolist() == [True] * 3 + [False] * 2 + [False, False, True, True]
    # dummy block of row 1: own block only (never a fully masked row)
    assert m[1, 2].tolist() == [False] * 5 + [False, False, True, True]
    assert m[1, 0].tolist() == [True, True, False, False, False, True, True, False, False]


def _example(S=14):
    ids = torch.randint(0, 300, (2, S))
    anchors = torch.tensor([[0, 4, 9], [3, 6, 0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    return ids, anchors, valid


def test_no_context_leak_and_bidirectional(tiny_target):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok).eval()
    ids, anchors, valid = _example()
    tapped = tapped_of(target, ids, draft.config.target_layer_ids)
    with torch.no_grad():
        h = draft.forward_blocks(tapped, ids, anchors, valid)
        for b, n in ((0, 1), (0, 2), (1, 0)):
            p = int(anchors[b, n])
            late = tapped.clone()
            late[b, p:] += torch.randn_like(late[b, p:])
            h_late = draft.forward_blocks(late, ids, anchors, valid)
            assert torch.equal(h_late[b, n], h[b, n]), "a block saw context at/after its anchor"
            early = tapped.clone()
            early[b, p - 1] += 1.0
            assert not torch.allclose(
                draft.forward_blocks(early, ids, anchors, valid)[b, n], h[b, n]
            )
        # another block's anchor token never reaches this block
        ids2 = ids.clone()
        ids2[0, 9] = (ids2[0, 9] + 1) % 300
        h2 = draft.forward_blocks(tapped, ids2, anchors, valid)
        assert torch.equal(h2[0, :2], h[0, :2]) and not torch.allclose(h2[0, 2], h[0, 2])
        # bidirectional inside a block: a later slot's token changes an earlier slot's output
        ctx = draft.encode_context(tapped)
        kv = draft.context_kv(ctx, torch.arange(ids.shape[1]).expand(2, -1))
        blk = block_input_ids(ids, anchors, draft.config.mask_token_id, 7)[:, 1]
        pos = block_position_ids(anchors, 7)[:, 1]
        ctx_valid = torch.arange(ids.shape[1])[None] < anchors[:, 1:2]
        h_a = draft.block_hidden(blk, pos, kv, ctx_valid)
        blk2 = blk.clone()
        blk2[:, 5] = 7
        h_b = draft.block_hidden(blk2, pos, kv, ctx_valid)
        assert not torch.allclose(h_a[:, 1], h_b[:, 1])


def test_training_forward_equals_block_hidden(tiny_target, arch):
    target, tok = tiny_target(arch)
    draft = make_draft(target, tok).eval()
    ids, anchors, valid = _example()
    S = ids.shape[1]
    tapped = tapped_of(target, ids, draft.config.target_layer_ids)
    g = draft.config.block_size
    with torch.no_grad():
        h = draft.forward_blocks(tapped, ids, anchors, valid)
        kv = draft.context_kv(draft.encode_context(tapped), torch.arange(S).expand(2, -1))
        blocks = block_input_ids(ids, anchors, draft.config.mask_token_id, g)
        pos = block_position_ids(anchors, g)
        for n in range(anchors.shape[1]):
            ctx_valid = (torch.arange(S)[None] < anchors[:, n : n + 1]) & valid[:, n : n + 1]
            hb = draft.block_hidden(blocks[:, n], pos[:, n], kv, ctx_valid)
            torch.testing.assert_close(hb, h[:, n], rtol=1e-5, atol=1e-5)


def test_flex_mask_matches_sdpa(tiny_target):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, num_hidden_layers=1).eval()
    ids, anchors, valid = _example()
    tapped = tapped_of(target, ids, draft.config.target_layer_ids)
    with torch.no_grad():
        h = draft.forward_blocks(tapped, ids, anchors, valid)
        bm = training_flex_block_mask(anchors, valid, ids.shape[1], 7)
        dense = training_block_mask(anchors, valid, ids.shape[1], 7)
        assert torch.equal(bm.to_dense().bool().any(), torch.tensor(True))
        draft.attn_backend = "flex"
        h_flex = draft.forward_blocks(tapped, ids, anchors, valid)
    torch.testing.assert_close(h_flex, h, rtol=1e-5, atol=1e-5)
    assert dense.shape == (2, 1, 21, 14 + 21)


# ---------------------------------------------------------------------------- heads


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_markov_heads_match_formulas(tiny_target, head_type):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok, markov_head_type=head_type).eval()
    head, conf = draft.markov_head, draft.confidence_head
    B, g, H = 3, 7, draft.config.hidden_size
    h = torch.randn(B, g, H)
    prev = torch.randint(0, 300, (B, g))
    W1, W2 = head.markov_w1.weight, head.markov_w2.weight
    assert W2.shape == (draft.config.vocab_size, 8)
    with torch.no_grad():
        s = torch.zeros(B, 8)
        want_bias = []
        for k in range(g):
            e = W1[prev[:, k]]
            if head_type == "vanilla":
                m = e
            elif head_type == "gated":
                gate = torch.sigmoid(
                    torch.cat([h[:, k], e], -1) @ head.gate_proj.weight.T + head.gate_proj.bias
                )
                m = gate * e
            else:
                # DeepSpec: [g; c; o] = joint_proj([s; e; h]); the output reads s_{k-1}.
                gg, c, o = (
                    torch.cat([s, e, h[:, k]], -1) @ head.joint_proj.weight.T + head.joint_proj.bias
                ).chunk(3, -1)
                z = torch.sigmoid(gg)
                m = torch.tanh(o)
                s = z * s + (1 - z) * torch.tanh(c)
            want_bias.append(m @ W2.T)
        want_bias = torch.stack(want_bias, 1)
        # serial step API (decoder)
        state = head.init_state(B)
        for k in range(g):
            bias, feat, state = head.step(h[:, k], prev[:, k], state)
            torch.testing.assert_close(bias, want_bias[:, k])
            torch.testing.assert_close(feat, W1[prev[:, k]])
            want_c = torch.cat([h[:, k], W1[prev[:, k]]], -1) @ conf.proj.weight[0] + conf.proj.bias
            torch.testing.assert_close(conf(h[:, k], feat), want_c)
        # teacher-forced path (training) == serial path
        logits, c_logits = draft.head_outputs(h, prev)
        torch.testing.assert_close(logits, draft.lm_head(h) + want_bias)
        want_conf = torch.cat([h, W1[prev]], -1) @ conf.proj.weight[0] + conf.proj.bias
        torch.testing.assert_close(c_logits, want_conf)
        sel = torch.rand(B, g) > 0.4
        l_sel, c_sel = draft.head_outputs(h, prev, sel)
        torch.testing.assert_close(l_sel, logits[sel])
        torch.testing.assert_close(c_sel, c_logits[sel])


def test_confidence_head_without_markov(tiny_target):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, confidence_head_with_markov=False).eval()
    conf = draft.confidence_head
    assert conf.proj.weight.shape == (1, draft.config.hidden_size)
    h = torch.randn(4, draft.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(
            conf(h, torch.randn(4, 8)), h @ conf.proj.weight[0] + conf.proj.bias
        )
    none = make_draft(target, tok, markov_rank=0, enable_confidence_head=False)
    assert none.markov_head is None and none.confidence_head is None


def test_forward_teacher_forced(tiny_target):
    target, tok = tiny_target("qwen2")
    draft = make_draft(target, tok, markov_head_type="rnn").eval()
    ids, anchors, valid = _example()
    tapped = tapped_of(target, ids, draft.config.target_layer_ids)
    sel = torch.rand(2, 3, 7) > 0.3
    with torch.no_grad():
        out = draft(tapped, ids, anchors, valid, slot_mask=sel)
        prev = teacher_forced_prev_tokens(ids, anchors, 7)
        assert prev[0, 1, 0] == ids[0, 4] and prev[0, 1, 3] == ids[0, 7]
        logits, conf = draft.head_outputs(out.hidden, prev)
    torch.testing.assert_close(out.logits, logits[sel])
    torch.testing.assert_close(out.confidence_logits, conf[sel])


# ---------------------------------------------------------------------------- checkpoints

SECTION7_COMMON = {
    "embed_tokens.weight",
    "lm_head.weight",
    "fc.weight",
    "hidden_norm.weight",
    "norm.weight",
}
LAYER_KEYS = (
    [f"self_attn.{p}_proj.weight" for p in "qkvo"]
    + [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    + ["input_layernorm.weight", "post_attention_layernorm.weight"]
)


def expected_keys(arch, n_layers, head_type, rank, conf):
    keys = set(SECTION7_COMMON)
    for i in range(n_layers):
        keys |= {f"layers.{i}.{k}" for k in LAYER_KEYS}
        # Qwen3-style layers for every family: q/k norms always, no projection biases.
        keys |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
    if rank:
        keys |= {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}
        if head_type == "gated":
            keys |= {"markov_head.gate_proj.weight", "markov_head.gate_proj.bias"}
        if head_type == "rnn":
            keys |= {"markov_head.joint_proj.weight", "markov_head.joint_proj.bias"}
    if conf:
        keys |= {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    return keys


@pytest.mark.parametrize(
    "arch_, head_type, rank, conf",
    [
        ("qwen3", "vanilla", 8, True),
        ("qwen3", "gated", 8, True),
        ("qwen3", "rnn", 8, True),
        ("qwen3", "vanilla", 0, False),
        ("qwen2", "vanilla", 8, True),
        ("llama", "gated", 8, True),
    ],
)
def test_save_load_serving_layout(tiny_target, tmp_path, arch_, head_type, rank, conf):
    from safetensors import safe_open

    target, tok = tiny_target(arch_)
    draft = make_draft(
        target,
        tok,
        markov_head_type=head_type,
        markov_rank=rank,
        enable_confidence_head=conf,
        confidence_head_with_markov=bool(rank),
    )
    draft.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        if rank:
            assert tuple(f.get_tensor("markov_head.markov_w2.weight").shape) == (384, rank)
            assert tuple(f.get_tensor("markov_head.markov_w1.weight").shape) == (384, rank)
    assert keys == expected_keys(arch_, 2, head_type, rank, conf)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["sample_from_anchor"] is True
    if head_type == "rnn":  # DeepSpec's joint_proj: Linear(2r + H -> 3r)
        assert tuple(draft.markov_head.joint_proj.weight.shape) == (3 * rank, 2 * rank + 64)
    for key in (
        "num_hidden_layers",
        "num_target_layers",
        "block_size",
        "mask_token_id",
        "target_layer_ids",
        "num_anchors",
        "markov_rank",
        "markov_head_type",
        "enable_confidence_head",
        "confidence_head_with_markov",
        "hidden_size",
        "num_key_value_heads",
        "rms_norm_eps",
        "vocab_size",
        "intermediate_size",
    ):
        assert key in cfg, key
    assert cfg["tie_word_embeddings"] is False and cfg["num_hidden_layers"] == 2

    loaded = DSparkDraftModel.from_pretrained(tmp_path).eval()
    assert not loaded.embed_tokens.weight.requires_grad and not loaded.lm_head.weight.requires_grad
    ids, anchors, valid = _example()
    tapped = tapped_of(target, ids, draft.config.target_layer_ids)
    with torch.no_grad():
        a = draft.eval()(tapped, ids, anchors, valid)
        b = loaded(tapped, ids, anchors, valid)
    assert torch.equal(a.logits, b.logits)
    if conf:
        torch.testing.assert_close(a.confidence_logits, b.confidence_logits, rtol=0, atol=1e-6)


def test_from_target_with_tied_embeddings(tiny_target, tmp_path):
    from transformers import AutoModelForCausalLM

    from dspark.target.tiny import tiny_config

    _, tok = tiny_target("llama")
    torch.manual_seed(1)
    tied = AutoModelForCausalLM.from_config(
        tiny_config("llama", vocab_size=384, tie_word_embeddings=True)
    ).eval()
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    draft = make_draft(tied, tok)
    assert draft.embed_tokens.weight.data_ptr() != draft.lm_head.weight.data_ptr()
    assert torch.equal(draft.embed_tokens.weight, tied.model.embed_tokens.weight)
    assert torch.equal(draft.lm_head.weight, tied.lm_head.weight)
    draft.save_pretrained(tmp_path)
    loaded = DSparkDraftModel.from_pretrained(tmp_path)
    assert torch.equal(loaded.lm_head.weight, tied.lm_head.weight)
    assert loaded.embed_tokens.weight.data_ptr() != loaded.lm_head.weight.data_ptr()
