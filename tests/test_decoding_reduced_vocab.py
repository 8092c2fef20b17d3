"""The bundled decoder with a reduced draft vocabulary (K of the target's V tokens).

A reduced draft scores draft ids 0..K-1 (`lm_head` / `markov_w2` with K rows, `d2t` / `t2d`
maps; `DSparkDraftModel.from_target(..., kept_ids=)`); the decoder proposes target ids and, at T > 0, verifies against
q over V with q = 0 outside the kept ids. References: plain greedy decoding (T = 0), the full
draft restricted to the kept ids by hand (proposals), verification with q materialised over V
(the same random draws), and the chi-square test against the exact target joint (T > 0).
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import (
    OracleDraft,
    PromptAwareDraft,
    ZeroMarkov,
    chisquare,
    exact_joint,
    greedy_reference,
    make_draft,
    prompts_for,
)
from torch import nn

from dspark.decoding import (
    DecoderOptions,
    Sampling,
    SpeculativeDecoder,
    VerifyPolicy,
    verify_sampled,
)
from dspark.decoding.draft_step import propose
from dspark.decoding.draft_vocab import DraftVocab
from dspark.decoding.sampling import sample, warp
from dspark.decoding.sps import SPSProfile, cache_path, draft_weight_bytes


def kept_ids(vocab: int, k: int, seed: int, keep=(), drop=()) -> torch.Tensor:
    """`k` sorted target ids, seeded, holding every id of `keep` and none of `drop`."""
    g = torch.Generator().manual_seed(seed)
    keep, skip = sorted(set(keep)), set(keep) | set(drop)
    rest = [i for i in torch.randperm(vocab, generator=g).tolist() if i not in skip]
    return torch.tensor(sorted(keep + rest[: k - len(keep)]))


def reduce_vocab(draft, target, kept: torch.Tensor):
    """The reduced twin of a full `DSparkDraftModel`: built by `from_target(kept_ids=)` (which
    takes the target's lm_head rows at `kept` and the d2t / t2d maps), then given every other
    weight of `draft`, its `markov_w2` at the kept rows (increasing target-id order)."""
    from dspark.modeling import DSparkDraftModel

    kept = torch.as_tensor(kept).long().sort().values
    cfg = copy.deepcopy(draft.config)
    cfg.draft_vocab_size = int(kept.numel())
    red = DSparkDraftModel.from_target(target, cfg, kept_ids=kept)
    weights = dict(draft.state_dict())
    for name in ("lm_head.weight", "markov_head.markov_w2.weight"):
        if name in weights:
            weights[name] = weights[name][kept]
    weights["d2t"], weights["t2d"] = red.d2t, red.t2d
    red.load_state_dict(weights)
    return red.eval().requires_grad_(False)


def real_drafts(model, tok, k: int, seed: int = 0, keep=(), w2_scale: float = 1.0, **kw):
    """`(full, reduced)` tiny DSpark drafts sharing every weight; `w2_scale` makes the Markov
    bias decide tokens."""
    kw.setdefault("block_size", 4)
    full = make_draft(model, tok, markov_rank=kw.pop("markov_rank", 16), **kw)
    full = full.eval().requires_grad_(False)
    if full.markov_head is not None:
        with torch.no_grad():
            full.markov_head.markov_w2.weight.mul_(w2_scale)
    return full, reduce_vocab(full, model, kept_ids(model.config.vocab_size, k, seed, keep))


# ------------------------------------------------------------------ the mapping itself
def test_draft_vocab_maps_gathers_and_subtracts_by_hand(tiny_target):
    model, tok = tiny_target("qwen3")
    full, red = real_drafts(model, tok, 40)
    assert DraftVocab.of(full) is None
    vocab = DraftVocab.of(red)
    ids = kept_ids(model.config.vocab_size, 40, 0)  # what real_drafts kept
    assert torch.equal(red.kept_target_ids, ids)
    assert vocab is not None and vocab.size == 40 and torch.equal(vocab.ids, ids)
    by_hand = torch.tensor([[int(ids[0]), int(ids[39])], [int(ids[5]), int(ids[5])]])
    assert torch.equal(vocab.to_target(torch.tensor([[0, 39], [5, 5]])), by_hand)
    g = torch.Generator().manual_seed(0)
    q = torch.rand(2, 3, 40, generator=g)  # [B, L, K]
    V = model.config.vocab_size
    dense = torch.zeros(2, 3, V)
    dense[..., ids] = q  # q over V by hand
    assert torch.equal(vocab.expand(q, V), dense)
    outside = int(next(i for i in range(V) if i not in set(ids.tolist())))
    tokens = torch.tensor([[int(ids[3]), outside, int(ids[39])], [int(ids[0]), 0, outside]])
    assert torch.equal(vocab.gather(q, tokens), dense.gather(2, tokens[..., None]).squeeze(2))
    p = torch.rand(2, V, generator=g)
    assert torch.equal(vocab.subtract_from(p, q[:, 0]), p - dense[:, 0])
    bad = copy.deepcopy(red)
    bad.lm_head = nn.Linear(bad.lm_head.in_features, 41, bias=False)
    with pytest.raises(ValueError, match="41 rows for 40"):
        DraftVocab.of(bad)
    bad = copy.deepcopy(red)
    bad.d2t.zero_()  # offsets read as ids: 0, 1, ..., not the kept ids
    bad.d2t[1] = -1
    with pytest.raises(ValueError, match="strictly increasing"):
        DraftVocab.of(bad)


@pytest.mark.parametrize("n_draft,vlen", [(3, 3), (3, 1), (2, 0)])
def test_verify_sampled_over_kept_ids_equals_q_materialised_over_v(n_draft, vlen):
    """Reduced q `[B, L, K]` with its ids decides exactly what the same q spread over V
    (zeros elsewhere) decides, with the same random draws."""
    V, K, rows = 50, 12, 400
    g = torch.Generator().manual_seed(n_draft * 10 + vlen)
    vocab = DraftVocab(torch.randperm(V, generator=g)[:K].sort().values)
    q = torch.randn(rows, n_draft, K, generator=g).mul(2).softmax(-1)
    p = torch.randn(rows, n_draft + 1, V, generator=g).mul(2).softmax(-1)
    drafts = vocab.to_target(sample(q, g))
    lens = torch.full((rows,), vlen)
    reduced = verify_sampled(drafts, q, p, lens, torch.Generator().manual_seed(5), q_vocab=vocab)
    dense = verify_sampled(drafts, vocab.expand(q, V), p, lens, torch.Generator().manual_seed(5))
    assert torch.equal(reduced[0], dense[0]) and torch.equal(reduced[1], dense[1])
    if vlen:  # rejections happen, and their resamples land outside the kept ids too
        rejected = reduced[0] < vlen
        assert rejected.any() and (reduced[0] > 0).any()  # rejections and acceptances
        assert (~torch.isin(reduced[1][rejected], vocab.ids)).any()


# ------------------------------------------------------------------ proposals (T = 0)
def _context(model, draft, prompt):
    """Context K/V of `prompt` (positions 0..S-1) for the draft, all slots valid."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    tapped = torch.cat([hs[i + 1] for i in draft.config.target_layer_ids], -1)
    pos = torch.arange(len(prompt))[None]
    kv = draft.context_kv(draft.encode_context(tapped), pos)
    return kv, torch.ones(1, len(prompt), dtype=torch.bool)


def _restricted_by_hand(full, kept, anchor, apos, kv, valid, gamma):
    """The full draft's T = 0 proposal with every logit outside `kept` removed, as a loop."""
    block = torch.full((1, gamma), int(full.config.mask_token_id))
    block[:, 0] = anchor
    h = full.block_hidden(block, apos[:, None] + torch.arange(gamma), kv, valid)
    u = full.lm_head(h).float()[..., kept]  # [1, gamma, K]
    head, prev, state, toks, feats = full.markov_head, anchor, None, [], []
    if head is not None:
        state = head.init_state(1)
    for k in range(gamma):
        logit = u[:, k]
        feat = None
        if head is not None:
            bias, feat, state = head.step(h[:, k], prev, state)  # prev: a target id
            logit = logit + bias.float()[:, kept]
        prev = kept[logit.argmax(-1)]
        toks.append(prev)
        feats.append(feat)
    conf = None
    if full.confidence_head is not None:
        f = torch.stack(feats, 1)[0] if head is not None else None
        conf = torch.sigmoid(full.confidence_head(h[0], f).float())[None]
    return torch.stack(toks, 1), conf


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"markov_head_type": "gated"},
        {"markov_head_type": "rnn", "block_size": 3},
        {"markov_rank": 0, "confidence_head_with_markov": False},
    ],
)
@pytest.mark.parametrize("fast", [True, False])
def test_reduced_proposal_is_the_full_draft_restricted_to_the_kept_ids(tiny_target, kw, fast):
    """Proposals are target ids (through d2t), and the Markov head reads the previous proposal
    as a target id: the full draft with the other logits removed, by hand, proposes the same.
    A large W2 makes the Markov bias decide tokens (and exercises the CPU pruner)."""
    model, tok = tiny_target("qwen3")
    V = model.config.vocab_size
    for seed in range(3):
        full, red = real_drafts(model, tok, 48, seed=seed, w2_scale=30.0, **kw)
        kept = red.d2t + torch.arange(48)
        gamma = int(red.config.block_size)
        prompt = prompts_for(V, (7,), 50 + seed)[0]
        kv, valid = _context(model, red, prompt)
        anchor, apos = torch.tensor([prompt[-1]]), torch.tensor([len(prompt)])
        with torch.no_grad():
            prop = propose(
                red, anchor, apos, kv, valid, gamma=gamma,
                mask_token_id=int(red.config.mask_token_id), cpu_fast_paths=fast,
            )  # fmt: skip
            toks, conf = _restricted_by_hand(full, kept, anchor, apos, kv, valid, gamma)
        assert torch.isin(prop.tokens, kept).all()
        assert torch.equal(prop.tokens, toks), (prop.tokens, toks)
        if conf is not None:
            torch.testing.assert_close(prop.confidence, conf, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ greedy == plain greedy
class ReducedOracle(OracleDraft):
    """`OracleDraft` (the known greedy continuation) scoring only the target ids `kept`: its
    logits are the oracle's at those ids, in increasing target-id order."""

    def __init__(self, refs, vocab, kept, **kw):
        super().__init__(refs, vocab, **kw)
        self.kept_target_ids = kept
        if self.markov_head is not None:
            self.markov_head = ZeroMarkov(int(kept.numel()))

    def lm_head(self, h):
        return super().lm_head(h)[..., self.kept_target_ids]


@pytest.mark.parametrize("markov", [True, False])
def test_reduced_oracle_is_accepted_through_d2t(tiny_target, arch, markov):
    """An oracle whose continuation lies in the kept ids is accepted in full, so its draft ids
    reach the verifier as the right target ids; the output is plain greedy's."""
    model, _ = tiny_target(arch)
    V = model.config.vocab_size
    prompts = prompts_for(V, (5, 9), 3)
    refs = [greedy_reference(model, p, 14) for p in prompts]
    needed = {t for r in refs for t in r}
    kept = kept_ids(V, max(len(needed), V // 4), 1, keep=needed, drop={V - 1})
    assert kept.numel() < V - 1
    seqs = [p + r for p, r in zip(prompts, refs)]
    draft = ReducedOracle(seqs, V, kept, gamma=4, corrupt=0.0, markov=markov)
    out = SpeculativeDecoder(model, draft, DecoderOptions(observer=draft.recorder)).generate(
        prompts, 14
    )
    assert out.sequences == refs
    assert out.accept_lengths == out.verify_lengths  # every verified draft accepted
    assert sum(map(sum, out.accept_lengths)) > 14


@pytest.mark.parametrize(
    "policy",
    [
        {},
        {"confidence_threshold": 0.3},
        # drafting priced cheap, then dear: the draft gate skips some rounds in the second
        {"verify_policy": "scheduler", "draft_s": 0.01},
        {"verify_policy": "scheduler", "draft_s": 5.0},
    ],
)
def test_reduced_real_draft_greedy_equals_plain_greedy(tiny_target, arch, policy):
    model, tok = tiny_target(arch)
    policy = dict(policy)
    draft_s = policy.pop("draft_s", None)
    if draft_s is not None:  # a profile with draft times: the gate is live
        policy["sps"] = SPSProfile([1, 8], [1, 5], [[1.0, 1.3], [1.2, 2.0]], [draft_s, 4 * draft_s])
    _, red = real_drafts(model, tok, 96, seed=2, w2_scale=10.0)
    prompts = prompts_for(model.config.vocab_size, (5, 9, 3), 29)
    kind = policy.pop("verify_policy", None)
    dec = SpeculativeDecoder(model, red, DecoderOptions(policy=VerifyPolicy(kind, **policy)))
    out = dec.generate(prompts, 10)
    assert out.sequences == [greedy_reference(model, p, 10) for p in prompts]
    if draft_s is not None:
        assert dec.policy.gate is not None
        skipped = sum(s == 0.0 for s in out.round_draft_s)
        assert skipped > 0 or draft_s < 1.0, out.round_draft_s
    ar = dec.generate_autoregressive(prompts, 10)
    assert ar.sequences == out.sequences


# ------------------------------------------------------------------ T > 0 is lossless
class ReducedPromptAware(PromptAwareDraft):
    """`PromptAwareDraft` (q near the target's, first round) restricted to the ids `kept`:
    q(v) = 0 outside them, so the target's mass there comes only from the residual."""

    def __init__(self, target, prompt, kept, **kw):
        super().__init__(target, prompt, **kw)
        self.kept_target_ids = kept
        if self.markov_head is not None:
            self.markov_head = _KeptMarkov(self.markov_head, kept)

    def lm_head(self, h):
        return h[..., self.kept_target_ids]


class _KeptMarkov(nn.Module):
    def __init__(self, inner, kept):
        super().__init__()
        self.inner, self.kept = inner, kept
        self.prev: list[torch.Tensor] = []

    def init_state(self, batch):
        return self.inner.init_state(batch)

    def step(self, h_k, prev_token, state):
        self.prev.append(prev_token)  # what the head was told was drafted before
        bias, feat, state = self.inner.step(h_k, prev_token, state)
        return bias[..., self.kept], feat, state


def _first_round_mass_outside(model, prompt, kept, temperature, top_k):
    """Target probability (warped) of the second token falling outside `kept`, averaged over
    the first token: the share only the residual can produce."""
    with torch.no_grad():
        p1 = warp(model(torch.tensor([prompt])).logits[0, -1], temperature, top_k)
        firsts = torch.nonzero(p1).flatten()
        rows = torch.tensor([prompt + [int(t)] for t in firsts])
        p2 = warp(model(rows).logits[:, -1], temperature, top_k)
    outside = ~torch.isin(torch.arange(p2.shape[-1]), kept)
    return float((p1[firsts] * p2[:, outside].sum(-1)).sum())


@pytest.mark.parametrize("markov,top_k,top_p", [(True, 3, 1.0), (False, 4, 0.9)])
def test_reduced_sampled_output_has_the_target_distribution(tiny_target, markov, top_k, top_p):
    """First 4 tokens (prefill + one round verifying 2 drafts) over N rows vs the exact warped
    target joint, for a draft that cannot propose some of the target's likely tokens."""
    model, _ = tiny_target("qwen3")
    V = model.config.vocab_size
    prompt = prompts_for(V, (6,), 23)[0]
    temperature, n, depth = 1.5, 1500, 4
    with torch.no_grad():
        top = model(torch.tensor([prompt])).logits[0, -1].topk(3).indices.tolist()
        row = torch.tensor([prompt + [top[0]]])
        second = model(row).logits[0, -1].topk(2).indices.tolist()
    # the likeliest path stays proposable; the runner-up after it does not
    kept = kept_ids(V, V // 2, 4, keep={second[0], *top}, drop={second[1], V - 1})
    assert _first_round_mass_outside(model, prompt, kept, temperature, top_k) > 0.05
    draft = ReducedPromptAware(model, prompt, kept, gamma=3, markov=markov, seed=9)
    dec = SpeculativeDecoder(
        model,
        draft,
        DecoderOptions(sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p)),
    )
    assert dec.draft_vocab is not None and dec.draft_vocab.size == V // 2
    joint = exact_joint(model, prompt, depth, temperature, top_k, top_p)
    out = dec.generate([prompt] * n, depth, seed=1234)
    firsts = [a[0] for a in out.accept_lengths]
    assert all(v[0] == 2 for v in out.verify_lengths)
    assert 0.1 * n < sum(a > 0 for a in firsts) < 0.95 * n  # accepts and rejections
    seconds = torch.tensor([s[1] for s in out.sequences])
    assert (~torch.isin(seconds, kept)).sum() > 0.02 * n  # committed outside the kept ids
    assert chisquare(out.sequences, joint) > 1e-3
    if markov:  # the head was handed target ids: the anchor, then kept ids
        # slot 1 of the first round (which drafts only the 2 tokens it verifies)
        told = draft.markov_head.prev[1]
        assert told.shape[0] == n and torch.isin(told, kept).all()


def test_a_residual_over_the_kept_ids_only_fails_the_chi_square(tiny_target, monkeypatch):
    """The same check fails when the residual forgets the target ids the draft cannot propose
    (q subtracted, but mass outside the kept ids dropped): the test can fail."""
    model, _ = tiny_target("qwen3")
    V = model.config.vocab_size
    prompt = prompts_for(V, (6,), 23)[0]
    temperature, top_k, n, depth = 1.5, 3, 1500, 3
    with torch.no_grad():
        top = model(torch.tensor([prompt])).logits[0, -1].topk(3).indices.tolist()
        row = torch.tensor([prompt + [top[0]]])
        second = model(row).logits[0, -1].topk(2).indices.tolist()
    kept = kept_ids(V, V // 2, 4, keep={second[0], *top}, drop={second[1], V - 1})
    real = DraftVocab.subtract_from

    def kept_only(self, p, q):
        inside = torch.zeros_like(p).index_fill(-1, self.ids, 1.0)
        return real(self, p, q) * inside

    monkeypatch.setattr(DraftVocab, "subtract_from", kept_only)
    draft = ReducedPromptAware(model, prompt, kept, gamma=3, markov=True, seed=9)
    dec = SpeculativeDecoder(
        model, draft, DecoderOptions(sampling=Sampling(temperature=temperature, top_k=top_k))
    )
    joint = exact_joint(model, prompt, depth, temperature, top_k)
    out = dec.generate([prompt] * n, depth, seed=1234)
    assert chisquare(out.sequences, joint) < 1e-4


# ------------------------------------------------------------------ the draft round's cost
def test_draft_round_cost_counts_k_rows(tiny_target):
    """The roofline's draft weights count K rows of lm_head and markov_w2 (by hand), and a
    reduced draft's measured profile is cached apart from a full draft's."""
    model, tok = tiny_target("qwen3")
    full, red = real_drafts(model, tok, 40, markov_rank=16)
    V, H, r = model.config.vocab_size, model.config.hidden_size, 16
    assert draft_weight_bytes(full) - draft_weight_bytes(red) == (V - 40) * (H + r) * 4
    embeds = full.embed_tokens.weight.numel() + full.markov_head.markov_w1.weight.numel()
    total = sum(p.numel() for p in full.parameters())
    assert draft_weight_bytes(full) == (total - embeds) * 4
    cpu = torch.device("cpu")
    assert cache_path("t", cpu, torch.float32, 4) != cache_path("t", cpu, torch.float32, 4, 40)
    assert cache_path("t", cpu, torch.float32, 4, None) == cache_path("t", cpu, torch.float32, 4)


def test_a_reduced_drafts_measured_profile_has_its_own_cache_file(tiny_target):
    """`load_or_measure` times the reduced draft's own round (propose over K ids) and files it
    under the K key, so a full draft's cached round times never price it."""
    from dspark.decoding import sps as sps_module

    model, tok = tiny_target("qwen3")
    full, red = real_drafts(model, tok, 40, block_size=3)
    kw = {"rows": [1, 2], "widths": [1, 4], "context_len": 8, "reps": 1}
    prof = sps_module.load_or_measure(model, red, gamma=3, **kw)
    assert prof.meta["draft_vocab_size"] == 40 and len(prof.draft_times) == 2
    name, cpu = model.config._name_or_path, torch.device("cpu")
    path = sps_module.cache_path(name, cpu, torch.float32, 3, 40)
    assert prof.meta["cache_path"] == str(path) and path.exists()
    full_prof = sps_module.load_or_measure(model, full, gamma=3, **kw)
    assert full_prof.meta["cache_path"] == str(sps_module.cache_path(name, cpu, torch.float32, 3))
    assert full_prof.meta.get("draft_vocab_size") is None
