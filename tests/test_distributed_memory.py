"""The per-rank memory estimator (dspark/bench/train_memory.py): exact parameter counts against
real models and published sizes, and the sharded/replicated bookkeeping by hand."""

import pytest

from dspark.bench.train_memory import RunShape, count_params, estimate, target_config


def test_parameter_counts_equal_the_real_models(tiny_target):
    from helpers import make_draft

    target, tok = tiny_target("qwen3")
    shape = RunShape(num_hidden_layers=1, markov_rank=8, block_size=7)
    n = count_params(target_config("tiny-qwen3"), shape)
    draft = make_draft(target, tok, num_hidden_layers=1, markov_rank=8, block_size=7)
    assert n["target"] == sum(p.numel() for p in target.parameters())
    assert n["target_layer"] == sum(p.numel() for p in target.model.layers[0].parameters())
    assert n["draft_trainable"] == sum(p.numel() for p in draft.parameters() if p.requires_grad)
    assert n["draft_frozen"] == sum(p.numel() for p in draft.parameters() if not p.requires_grad)


def test_known_targets_have_their_published_sizes():
    n8 = count_params(target_config("Qwen/Qwen3-8B"), RunShape())
    assert n8["target"] == pytest.approx(8.19e9, rel=0.01)  # model card: 8.2B
    n70 = count_params(target_config("meta-llama/Llama-3.1-70B-Instruct"), RunShape())
    assert n70["target"] == pytest.approx(70.55e9, rel=0.01)  # model card: 70.6B


def test_sharding_divides_the_target_body_and_keeps_the_head_and_two_layers():
    shape = RunShape(world_size=8)
    r = estimate("Qwen/Qwen3-8B", shape)
    n, b = r["params"], r["bytes"]
    assert b["replicated"]["target_weights"] == n["target"] * 2  # bf16
    body = n["target"] - n["target_lm_head"]
    by_hand = (body / 8 + n["target_lm_head"] + 2 * n["target_layer"]) * 2
    assert b["sharded"]["target_weights"] == pytest.approx(by_hand)
    for part in ("draft_weights", "draft_grads", "optimizer", "activations"):
        assert b["sharded"][part] == b["replicated"][part]
    fsdp = b["sharded+fsdp_draft"]
    assert fsdp["optimizer"] == b["sharded"]["optimizer"] / 8
    assert fsdp["draft_grads"] == 4 * n["draft_trainable"] / 8  # no DDP bucket copy
    assert fsdp["total"] < b["sharded"]["total"] < b["replicated"]["total"]
    # AdamW: two fp32 moments per trainable parameter; DDP keeps a bucket copy of the grads.
    assert b["sharded"]["optimizer"] == 8 * n["draft_trainable"]
    assert b["sharded"]["draft_grads"] == 8 * n["draft_trainable"]
