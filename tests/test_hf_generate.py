"""transformers' own generate() API with a DSpark draft: the custom_generate directory of
examples/dspark_generate gives, at T=0, exactly what dspark's decoder gives and what plain
greedy generate() gives (left-padded batch, per-row lengths and EOS)."""

from pathlib import Path

import pytest
import torch
from helpers import make_draft

from dspark.decoding import DecoderOptions, SpeculativeDecoder

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dspark_generate"


def test_custom_generate_equals_decoder_and_greedy(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok, num_hidden_layers=1, block_size=4).eval()
    tok.padding_side = "left"
    enc = tok(["def add(a, b):", "The answer is 42. What"], return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()  # the batch really is padded
    out = target.generate(
        **enc,
        max_new_tokens=10,
        do_sample=False,
        custom_generate=str(EXAMPLE),
        trust_remote_code=True,
        draft=draft,
    )
    n = enc["input_ids"].shape[1]
    assert torch.equal(out[:, :n], enc["input_ids"])
    prompts = [row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"])]
    ours = SpeculativeDecoder(target, draft, DecoderOptions(max_length=128)).generate(
        prompts, 10, eos_token_id=target.generation_config.eos_token_id
    )
    pad = target.generation_config.pad_token_id
    for b, seq in enumerate(ours.sequences):
        assert out[b, n : n + len(seq)].tolist() == seq
        assert (out[b, n + len(seq) :] == pad).all()
        plain = target.generate(torch.tensor([prompts[b]]), max_new_tokens=10, do_sample=False)
        assert plain[0, len(prompts[b]) :].tolist() == seq


def test_draft_directory_and_bad_calls(tiny_target, tmp_path):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, num_hidden_layers=1, block_size=3).eval()
    from dspark.export import export_draft

    d = export_draft(draft, tmp_path / "spec", "speculators", dtype="float32")
    ids = tok("The answer is", return_tensors="pt")["input_ids"]
    kw = dict(
        max_new_tokens=6, do_sample=False, custom_generate=str(EXAMPLE), trust_remote_code=True
    )
    a = target.generate(ids, draft=str(d), **kw)
    b = target.generate(ids, **{**kw, "custom_generate": None, "trust_remote_code": None})
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="draft="):
        target.generate(ids, **kw)
    with pytest.raises(ValueError, match="num_beams"):
        target.generate(ids, draft=draft, num_beams=2, **kw)
