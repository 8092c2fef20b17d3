"""A target given as a PEFT adapter directory (base + LoRA) loads merged, and computes exactly
what peft computes with the adapter unmerged; a missing base is a clear error."""

import json

import pytest
import torch

from dspark.target import TargetNotFoundError, load_target, load_tokenizer


@pytest.fixture
def adapter_dir(tiny_target_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_target_dir("qwen3"))
    torch.manual_seed(1)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, cfg).eval()
    peft_model.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter", peft_model


def test_adapter_target_merged_equals_peft_unmerged(adapter_dir, tiny_target):
    path, peft_model = adapter_dir
    assert json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    merged, tok = load_target(str(path))
    assert not any("lora" in n for n, _ in merged.named_parameters())  # merged: a plain model
    assert not any(p.requires_grad for p in merged.parameters())
    ids = tok("def add(a, b):\n    return a + b", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits  # base + adapter, unmerged (peft's own path)
        got = merged(input_ids=ids).logits
        base_logits = tiny_target("qwen3")[0](input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - base_logits).abs().max() > 1e-2  # the adapter changes the function
    assert load_tokenizer(str(path)).get_vocab() == tok.get_vocab()


def test_adapter_with_missing_base_names_the_file(adapter_dir):
    path, _ = adapter_dir
    cfg_file = path / "adapter_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["base_model_name_or_path"] = "/nonexistent/base-model"
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(TargetNotFoundError, match=r"adapter_config\.json.*base_model_name_or_path"):
        load_target(str(path))
