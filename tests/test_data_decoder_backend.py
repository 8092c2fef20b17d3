"""DecoderBackend: greedy == HF `generate` token for token; sampling per row, exact, seeded."""

import json
from pathlib import Path

import pytest
import torch

from dspark.data.prompts.prompt_set import normalize_rows
from dspark.data.regeneration.decoder_backend import DecoderBackend
from dspark.data.regeneration.hf_backend import HFBackend
from dspark.data.regeneration.regenerate import regenerate
from dspark.data.regeneration.run_files import FAILURES, OUTPUT
from dspark.data.regeneration.sampling import GenerationFailed, SamplingConfig, row_seed

CONVS = [
    [{"role": "user", "content": text}]
    for text in [
        "Hi.",
        "What is the capital of France, and why is it famous?",
        "Sort these: 3 1 2",
        "Write a haiku about static caches and long batches of rows.",
        "ok",
        "Explain right padding versus left padding in two sentences, please.",
        "def f(x):\n    return x * 2",
    ]
]


def hf_reference(model, ids: list[int], max_new: int, stop: list[int]) -> list[int]:
    """HF `generate`, one prompt at a time (no padding at all), greedy, the stop ids as EOS."""
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=stop,
        pad_token_id=stop[0],
    )
    new = out[0, len(ids) :].tolist()
    cut = next((j for j, t in enumerate(new) if t in stop), None)
    return new if cut is None else new[: cut + 1]  # HF pads after EOS; keep EOS


def test_greedy_equals_hf_generate_with_rows_ending_at_different_times(tiny_target, arch):
    model, tok = tiny_target(arch)
    be = DecoderBackend(model, tok, batch_size=3)  # 7 prompts: groups of 3, 3, 1
    ids = be.encode(CONVS)
    assert len({len(p) for p in ids}) >= 5  # lengths differ, so groups are padded
    max_new = 12
    # random tiny targets rarely emit their end-of-turn id: make two of the tokens greedy
    # decoding does produce (read off the unstopped reference) stop ids, so rows end early
    free = [hf_reference(model, p, max_new, be.stop_ids) for p in ids]
    be.stop_ids = sorted(set(be.stop_ids) | {free[1][3], free[3][6]})
    refs = [hf_reference(model, p, max_new, be.stop_ids) for p in ids]
    lengths = sorted({len(r) for r in refs})
    assert len(lengths) >= 2 and lengths[0] < max_new, lengths  # rows finish at different times
    got = be.generate_ids(ids, [0] * len(ids), SamplingConfig(max_new_tokens=max_new))
    assert got == refs
    # and the replies (text, token count, finish reason) equal HFBackend's, row by row
    hf = HFBackend(model, tok)
    hf.stop_ids = be.stop_ids
    g = SamplingConfig(max_new_tokens=max_new)
    expect = [hf.generate([c], [0], g)[0] for c in CONVS]
    assert be.generate(CONVS, [0] * len(CONVS), g) == expect
    assert {r.finish_reason for r in expect} == {"stop", "length"}


def test_sampled_row_depends_only_on_its_seed(tiny_target):
    model, tok = tiny_target("qwen3")
    s = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=8)
    seeds = [row_seed(3, i, 0) for i in range(len(CONVS))]
    a = DecoderBackend(model, tok, batch_size=4).generate(CONVS, seeds, s)
    # the same rows in another order, with other neighbours, in smaller groups
    pick = [5, 0, 3, 6]
    b = DecoderBackend(model, tok, batch_size=2).generate(
        [CONVS[i] for i in pick] + [CONVS[1]], [seeds[i] for i in pick] + [12345], s
    )
    assert [r.text for r in b[:4]] == [a[i].text for i in pick]
    # another seed gives another answer (the seed is used), and greedy differs too
    other = DecoderBackend(model, tok).generate([CONVS[3]], [seeds[3] + 1], s)[0]
    greedy = DecoderBackend(model, tok).generate([CONVS[3]], [seeds[3]], SamplingConfig(8))
    assert len({a[3].text, other.text, greedy[0].text}) == 3


def test_first_token_has_the_warped_target_distribution(tiny_target):
    """Chi-square of 600 first tokens (600 row seeds) against softmax over the top-6 logits."""
    from scipy.stats import chisquare

    model, tok = tiny_target("llama")
    be = DecoderBackend(model, tok, batch_size=64)
    ids = be.encode(CONVS[:1])[0]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    top = torch.topk(logits / 0.8, 6)
    probs = top.values.softmax(-1)  # by hand: T = 0.8, top-k = 6
    n = 600
    s = SamplingConfig(temperature=0.8, top_k=6, max_new_tokens=1)
    got = be.generate_ids([ids] * n, [row_seed(0, i, 0) for i in range(n)], s)
    first = [g[0] for g in got]
    allowed = top.indices.tolist()
    assert set(first) <= set(allowed)  # nothing outside the top-k
    counts = [first.count(t) for t in allowed]
    assert chisquare(counts, (probs * n).tolist()).pvalue > 1e-3, (counts, probs)


def test_too_long_prompt_fails_only_its_row(tiny_target, tmp_path):
    model, tok = tiny_target("qwen2")
    be = DecoderBackend(model, tok, batch_size=4, max_length=64)
    rows = [{"turns": ["short"]}, {"turns": ["long " * 80]}, {"turns": ["also short"]}]
    s = SamplingConfig(max_new_tokens=6)
    stats = regenerate(normalize_rows(rows), be, tmp_path, sampling=s, progress=False, log=None)
    assert stats["rows_done"] == 2 and stats["rows_failed"] == 1
    fails = [json.loads(x) for x in (tmp_path / FAILURES).read_text().splitlines()]
    assert [f["index"] for f in fails] == [1] and "length limit 64" in fails[0]["reason"]
    assert [json.loads(x)["index"] for x in (tmp_path / OUTPUT).read_text().splitlines()] == [0, 2]
    assert isinstance(be.generate_ids([[]], [0], s)[0], GenerationFailed)


@pytest.mark.slow
def test_smollm2_greedy_equals_hf_generate():
    """The embedded target (SmolLM2-135M-Instruct), four embedded prompts, one batch."""
    from dspark.data.prompts.sources import load_prompts
    from dspark.target import TargetNotFoundError, load_target, resolve_target

    user_cache = Path.home() / ".cache" / "dspark"  # conftest points DSPARK_CACHE elsewhere
    try:
        path = resolve_target("embedded", cache_dir=user_cache)
    except TargetNotFoundError as e:
        pytest.skip(f"embedded target not prepared: {e}")
    model, tok = load_target(path)
    rows = load_prompts("embedded", split="test", limit=4).rows
    convs = [r["messages"] for r in rows]
    be = DecoderBackend(model, tok, batch_size=4)
    ids = be.encode(convs)
    assert len({len(p) for p in ids}) > 1
    max_new = 48
    refs = [hf_reference(model, p, max_new, be.stop_ids) for p in ids]
    assert be.generate_ids(ids, [0] * 4, SamplingConfig(max_new_tokens=max_new)) == refs
