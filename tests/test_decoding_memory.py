"""Finished requests leave nothing behind: the decoder pins no caches unless a test asks
(`keep_final_caches`); holding them cost GBs per call at batch 16+ (a regeneration job OOMed)."""

from test_decoding import _real_draft, prompts_for

from dspark.decoding import SpeculativeDecoder


def test_no_caches_are_kept_after_a_call_unless_asked(tiny_target):
    model, tok = tiny_target("qwen3")
    prompts = prompts_for(model.config.vocab_size, (4, 7, 9), 5)
    dec = SpeculativeDecoder(model, _real_draft(model, tok))
    dec.generate(prompts, 6)
    dec.generate_autoregressive(prompts, 6)
    assert dec.last_caches == {}
    dec.keep_final_caches = True
    dec.generate_autoregressive(prompts, 6)
    assert sorted(dec.last_caches) == [0, 1, 2]
