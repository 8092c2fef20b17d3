"""A round that verifies L drafts drafts only L (`propose(..., steps=L)`): the same tokens and
confidences as the first L of the whole block, and the decoder's output is unchanged."""

import pytest
import torch
from helpers import greedy_reference, prompts_for, random_draft

from dspark.decoding import DecoderOptions, SpeculativeDecoder, VerifyPolicy
from dspark.decoding.draft_step import propose
from dspark.eval.capped_decoder import CappedVerifyDecoder
from dspark.target.capture import OnlineTargetCapture


def _round(draft, target, ids, p, steps, temperature=0.0, seed=0):
    feats = OnlineTargetCapture(target, draft.config.target_layer_ids)(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    )
    pos = torch.arange(ids.shape[1])[None]
    kv = draft.context_kv(draft.encode_context(feats.tapped), pos)
    return propose(
        draft,
        ids[:, p],
        torch.tensor([p]),
        kv,
        torch.arange(ids.shape[1])[None] < p,
        gamma=int(draft.config.block_size),
        mask_token_id=int(draft.config.mask_token_id),
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
        steps=steps,
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_first_steps_of_the_block_are_the_whole_blocks_first(tiny_target, temperature):
    target, tok = tiny_target("llama")
    draft = random_draft(target, tok, "llama", block_size=5)
    ids = torch.tensor([prompts_for(target.config.vocab_size, (14,), 3)[0]])
    with torch.inference_mode():
        whole = _round(draft, target, ids, 9, None, temperature)
        assert whole.tokens.shape == (1, 5)
        for n in range(1, 6):
            part = _round(draft, target, ids, 9, n, temperature)
            assert torch.equal(part.tokens, whole.tokens[:, :n]), n
            assert torch.allclose(part.confidence, whole.confidence[:, :n], atol=1e-6), n
            if temperature > 0:  # the warped q of each drafted slot, same seed
                assert torch.allclose(part.q, whole.q[:, :n], atol=1e-6)
        with pytest.raises(ValueError, match="steps"):
            _round(draft, target, ids, 9, 6)


def test_capped_rounds_draft_only_what_they_verify_and_stay_lossless(tiny_target, monkeypatch):
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3", block_size=5)
    prompts = prompts_for(target.config.vocab_size, (6, 11), 4)
    asked = []
    import dspark.decoding.decoder as decoder_mod

    real = decoder_mod.propose

    def spy(*args, **kw):
        asked.append(kw.get("steps"))
        return real(*args, **kw)

    monkeypatch.setattr(decoder_mod, "propose", spy)
    for cap in (1, 2, 5):
        asked.clear()
        dec = CappedVerifyDecoder(target, draft, DecoderOptions(max_length=128), max_verify=cap)
        out = dec.generate(prompts, 14)
        assert out.sequences == [greedy_reference(target, p, 14) for p in prompts]
        assert max(asked) <= cap and asked[0] == cap  # the budget lowers the last rounds
    asked.clear()
    dec = SpeculativeDecoder(
        target, draft, DecoderOptions(policy=VerifyPolicy(confidence_threshold=0.5), max_length=128)
    )
    dec.generate(prompts, 14)
    assert set(asked) == {None}  # a confidence policy reads every slot's confidence
