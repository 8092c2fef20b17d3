import time

import pytest
import torch

from dspark.target import TargetNotFoundError, load_target


def test_loads_each_tiny_architecture(tiny_target, arch):
    model, tok = tiny_target(arch)
    assert model.config.model_type == arch
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_tiny_targets_are_deterministic(tiny_target_dir, tmp_path):
    from safetensors.torch import load_file

    from dspark.target.tiny import build_tiny_target

    a = load_file(f"{tiny_target_dir('llama')}/model.safetensors")
    b = load_file(f"{build_tiny_target('llama', tmp_path / 'again')}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_loads_a_plain_directory_with_dtype(tiny_target_dir):
    model, _ = load_target(tiny_target_dir("qwen2"), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "spec, words",
    [
        ("./no/such/dir", "does not exist"),
        ("Qwen/Qwen3-8B", "HF_HUB_OFFLINE"),
        ("embedded", "prepare_target.py"),
        ("tiny-gpt2", "tiny-llama"),
    ],
)
def test_bad_targets_fail_fast_with_the_fix(spec, words):
    t0 = time.monotonic()
    with pytest.raises(TargetNotFoundError, match=words):
        load_target(spec)
    assert time.monotonic() - t0 < 5.0


def test_directory_without_config_is_named(tmp_path):
    with pytest.raises(TargetNotFoundError, match="config.json"):
        load_target(str(tmp_path))
