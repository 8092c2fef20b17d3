"""LoRA fine-tuning of an existing draft (draft.lora): only the adapters train, the untouched
tensors stay bit for bit, and every saved / exported draft is the merged serving layout that
computes what the adapted model computes."""

import json

import pytest
import torch
from helpers import debug_cfg, make_draft

from dspark.modeling.lora import apply_lora, has_lora, merged_copy

MODULES = ["q_proj", "v_proj", "down_proj"]


def outputs(draft, target, tok):
    from dspark.export.reference import all_anchor_outputs

    ids = tok("def add(a, b):\n    return a + b. The answer", return_tensors="pt")["input_ids"][
        :, :16
    ]
    out = all_anchor_outputs(draft, target, ids)
    return out["logits"], out["confidence_logits"]


def test_lora_starts_as_identity_and_merges_exactly(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok, num_hidden_layers=2, block_size=4).eval()
    before = outputs(draft, target, tok)
    n = apply_lora(draft, r=4, alpha=8, target_modules=MODULES)
    trainable = [k for k, p in draft.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in k for k in trainable)
    assert n == sum(p.numel() for p in draft.parameters() if p.requires_grad)
    start = outputs(draft, target, tok)
    assert all(torch.equal(a, b) for a, b in zip(before, start))  # B = 0 at init
    with torch.no_grad():
        for k, p in draft.named_parameters():
            if "lora_B" in k:
                p.normal_(0, 0.2)
    adapted = outputs(draft, target, tok)
    assert (adapted[0] - before[0]).abs().max() > 1e-3
    merged = merged_copy(draft)
    assert not has_lora(merged) and has_lora(draft)
    for a, b in zip(outputs(merged, target, tok), adapted):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # save_pretrained and export write the merged layout, loadable without peft
    from dspark.export import export_draft, load_draft

    draft.save_pretrained(tmp_path / "saved")
    exported = export_draft(draft, tmp_path / "exp", "speculators", dtype="float32")
    for path in (tmp_path / "saved", exported):
        back = load_draft(path)
        assert not any("lora" in k for k in back.state_dict())
        for a, b in zip(outputs(back, target, tok), adapted):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="frozen copies"):
        apply_lora(make_draft(target, tok), r=4, alpha=8, target_modules=["lm_head"])


def test_lora_run_trains_only_adapters_and_publishes_merged(tmp_path, debug_data):
    from dspark.training.loop import run

    base = debug_cfg(tmp_path / "base", debug_data, "trainer.max_steps=4", "trainer.eval_every=0")
    first = run(base)["draft"]
    cfg = debug_cfg(
        tmp_path / "lora",
        debug_data,
        f"draft.init_from={first}",
        "draft.lora.r=4",
        "trainer.max_steps=6",
        "trainer.eval_every=0",
        "trainer.log_every=1",
        "optim.lr=1e-2",
    )
    res = run(cfg)
    from safetensors.torch import load_file

    old = load_file(f"{first}/model.safetensors")
    new = load_file(f"{res['draft']}/model.safetensors")
    assert old.keys() == new.keys()  # merged: no lora_* keys
    changed = {k for k in old if not torch.equal(old[k], new[k])}
    adapted = {
        k
        for k in old
        if any(
            f".{m}." in k
            for m in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        )
    }
    assert changed and changed <= adapted, changed - adapted  # fc, heads, norms untouched
    rows = [json.loads(x) for x in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in r for r in rows)
