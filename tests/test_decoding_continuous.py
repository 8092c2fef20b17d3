"""Continuous batching in plain decoding (`generate_autoregressive(max_batch=...)`): every request
equals HF `generate` run on it alone, the batch stays full while requests wait, and a request
admitted into a row a longer one left never reads that one's slots."""

import pytest
import torch
from test_data_decoder_backend import hf_reference

from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder

PROMPTS = [  # long before short, so short requests inherit rows whose slots a longer one wrote
    [5, 9, 13, 2, 44, 17, 8, 30, 31, 32, 33, 34, 35, 36],
    [3, 17, 40, 9, 11, 12, 13, 14, 15, 16, 18],
    [7, 8],
    [21],
    [50, 51, 52, 53, 54],
    [60, 61, 62],
    [70, 71, 72, 73, 74, 75, 76, 77],
]


@pytest.mark.parametrize("max_batch", [1, 2, 3])
def test_each_request_equals_hf_generate_alone(tiny_target, arch, max_batch):
    model, _ = tiny_target(arch)
    max_new = 10
    # ids greedy decoding does produce (read off unstopped runs) as EOS, so rows end early
    free = [hf_reference(model, p, max_new, [0]) for p in PROMPTS]
    eos = sorted({free[0][2], free[4][5]})
    refs = [hf_reference(model, p, max_new, eos) for p in PROMPTS]
    assert len({len(r) for r in refs}) >= 2  # requests finish at different steps
    dec = SpeculativeDecoder(model, None, DecoderOptions(max_length=64))
    out = dec.generate_autoregressive(PROMPTS, max_new, eos_token_id=eos, max_batch=max_batch)
    assert out.sequences == refs
    assert out.round_rows == continuous_rows([len(r) - 1 for r in refs], max_batch)


def continuous_rows(steps: list[int], slots: int) -> list[int]:
    """Live rows per step when request i needs `steps[i]` steps after its prefill and a freed
    row takes the next waiting request before the next step (the schedule by hand)."""
    waiting, live, rows = list(steps), [], []
    while waiting or live:
        while waiting and len(live) < slots:
            n = waiting.pop(0)
            if n:  # a request done on its prefill token never takes a step
                live.append(n)
        if not live:
            continue
        rows.append(len(live))
        live = [n - 1 for n in live if n > 1]
    return rows


def test_the_batch_stays_full_while_requests_wait(tiny_target):
    model, _ = tiny_target("llama")
    dec = SpeculativeDecoder(model, None, DecoderOptions(max_length=64))
    budgets = 6  # no EOS: every request runs its whole budget
    out = dec.generate_autoregressive(PROMPTS, budgets, max_batch=3)
    assert out.new_tokens == [budgets] * len(PROMPTS)
    # each request: 1 token from its prefill, then 5 steps; 7 requests through 3 rows
    steps = sum(out.round_rows)
    assert steps == len(PROMPTS) * (budgets - 1)
    # the first 3 requests end together; the next 3 take their rows at once, so every round
    # runs 3 rows until only the 7th request is left
    assert out.round_rows == [3] * 10 + [1] * 5
    grouped = SpeculativeDecoder(model, None, DecoderOptions(max_length=64))
    plain = grouped.generate_autoregressive(PROMPTS, budgets)
    assert plain.sequences == out.sequences


def test_requests_finishing_on_their_first_token_free_their_rows(tiny_target):
    model, _ = tiny_target("qwen3")
    dec = SpeculativeDecoder(model, None, DecoderOptions(max_length=64))
    out = dec.generate_autoregressive(PROMPTS, 1, max_batch=2)
    with torch.inference_mode():
        firsts = [int(model(torch.tensor([p])).logits[0, -1].argmax()) for p in PROMPTS]
    assert out.sequences == [[t] for t in firsts]
    assert out.round_rows == []  # every token came from a prefill


def test_sampled_requests_depend_only_on_their_own_generator(tiny_target):
    model, _ = tiny_target("llama")
    dec = SpeculativeDecoder(
        model, None, DecoderOptions(sampling=Sampling(temperature=1.0), max_length=64)
    )

    def gens():
        return [torch.Generator().manual_seed(100 + i) for i in range(len(PROMPTS))]

    together = dec.generate_autoregressive(PROMPTS, 8, generators=gens(), max_batch=2)
    alone = [
        dec.generate_autoregressive([p], 8, generators=[g]).sequences[0]
        for p, g in zip(PROMPTS, gens())
    ]
    assert together.sequences == alone


def test_max_batch_must_be_positive(tiny_target):
    model, _ = tiny_target("llama")
    dec = SpeculativeDecoder(model, None, DecoderOptions(max_length=64))
    with pytest.raises(ValueError, match="max_batch"):
        dec.generate_autoregressive(PROMPTS, 4, max_batch=0)
