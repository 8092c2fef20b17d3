"""End-to-end tests of the bundled speculative decoder on tiny random targets.

The decoder must be lossless for ANY draft, so most tests use small stand-in drafts that
implement the draft inference API of docs/contracts.md:
- `ToyDraft` (here): a random one-layer attention drafter over the real tapped target
  features (exercises the context cache and its positions), optional Markov / confidence heads;
- `OracleDraft` (tests/helpers.py): proposes the known greedy continuation with seeded
  corruptions, so rounds mix accepted prefixes and rejections at every depth (a random draft is
  almost always rejected at the first token under T = 0).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    TAPS,
    OracleDraft,
    PromptAwareDraft,
    Recorder,
    chisquare,
    exact_joint,
    greedy_reference,
    prompts_for,
    real_draft,
)
from torch import nn

from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder, VerifyPolicy


class ToyMarkov(nn.Module):
    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.w1 = nn.Embedding(vocab, rank)
        self.w2 = nn.Linear(rank, vocab, bias=False)

    def init_state(self, batch):
        return None

    def step(self, h_k, prev_token, state):
        feat = self.w1(prev_token)
        return self.w2(feat), feat, state


class ToyConfidence(nn.Module):
    def __init__(self, hidden: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden + rank, 1)
        self.rank = rank

    def forward(self, h_k, feat):
        if feat is None:
            feat = h_k.new_zeros(h_k.shape[0], self.rank)
        return self.proj(torch.cat([h_k, feat], -1)).squeeze(-1)


class ToyDraft(nn.Module):
    """Random drafter over projected target features (rope-free, position via sinusoids)."""

    def __init__(self, target, gamma=4, rank=8, confidence=True, copy_lm_head=True, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        cfg = target.config
        hid, vocab = cfg.hidden_size, cfg.vocab_size
        self.config = SimpleNamespace(
            block_size=gamma, target_layer_ids=list(TAPS), mask_token_id=vocab - 1, markov_rank=rank
        )
        self.fc = nn.Linear(len(TAPS) * hid, hid, bias=False)
        self.embed = nn.Embedding(vocab, hid)
        self.embed.weight.data.copy_(target.model.embed_tokens.weight.data)
        self.kv = nn.ModuleList([nn.Linear(hid, 2 * 2 * 8) for _ in range(2)])
        self.q = nn.ModuleList([nn.Linear(hid, 2 * 8) for _ in range(2)])
        self.o = nn.ModuleList([nn.Linear(2 * 8, hid) for _ in range(2)])
        self.norm = nn.LayerNorm(hid)
        self.head = nn.Linear(hid, vocab, bias=False)
        for p in self.parameters():
            if p is not self.embed.weight:
                p.data.copy_(torch.randn(p.shape, generator=g) * 0.2)
        if copy_lm_head:
            self.head.weight.data.copy_(target.lm_head.weight.data)
        self.markov_head = ToyMarkov(vocab, rank) if rank else None
        self.confidence_head = ToyConfidence(hid, rank) if confidence else None
        self.eval().requires_grad_(False)

    @staticmethod
    def _pe(pos, dim):
        freq = torch.exp(-torch.arange(dim // 2) / (dim // 2) * 4.0)
        ang = pos[..., None].float() * freq
        return torch.cat([ang.sin(), ang.cos()], -1) * 0.1

    def encode_context(self, tapped):
        return torch.tanh(self.fc(tapped))

    def context_kv(self, ctx, position_ids):
        x = ctx + self._pe(position_ids, ctx.shape[-1])
        out = []
        for kv in self.kv:
            k, v = kv(x).view(*x.shape[:2], 2, 2, 8).unbind(2)
            out.append((k.transpose(1, 2), v.transpose(1, 2)))
        return out

    def block_hidden(self, block_ids, block_position_ids, ctx_kv, ctx_valid):
        x = self.embed(block_ids) + self._pe(block_position_ids, self.embed.embedding_dim)
        bsz, g = block_ids.shape
        for (k_c, v_c), q, o in zip(ctx_kv, self.q, self.o):
            qh = q(x).view(bsz, g, 2, 8).transpose(1, 2)
            allowed = ctx_valid[:, None, None, :].expand(bsz, 1, g, ctx_valid.shape[1])
            att = F.scaled_dot_product_attention(qh, k_c, v_c, attn_mask=allowed)
            att = torch.nan_to_num(att)  # a row with no context yet
            x = x + o(att.transpose(1, 2).reshape(bsz, g, 16))
        return self.norm(x)

    def lm_head(self, h):
        return self.head(h)


# ------------------------------------------------------------------ greedy == greedy
@pytest.mark.parametrize("lengths,seed", [((5,), 0), ((3, 9, 6), 1), ((12,), 2)])
def test_greedy_speculative_equals_plain_greedy_oracle(tiny_target, arch, lengths, seed):
    model, _ = tiny_target(arch)
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, lengths, seed)
    max_new = 14
    refs = [greedy_reference(model, p, max_new) for p in prompts]
    draft = OracleDraft(
        [p + r for p, r in zip(prompts, refs)], vocab, gamma=4, markov=seed != 1, seed=seed
    )
    dec = SpeculativeDecoder(model, draft, DecoderOptions(observer=draft.recorder))
    out = dec.generate(prompts, max_new)
    assert out.sequences == refs
    rounds = [a for accs in out.accept_lengths for a in accs]
    assert any(a > 0 for a in rounds) and any(a < 4 for a in rounds), rounds
    assert all(len(s) == max_new for s in out.sequences)
    for b in range(len(prompts)):
        assert out.new_tokens[b] == 1 + sum(out.accept_lengths[b]) + out.num_rounds[b]


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_speculative_equals_plain_greedy_random_draft(tiny_target, arch, seed):
    model, _ = tiny_target(arch)
    prompts = prompts_for(model.config.vocab_size, (4, 7), seed)
    draft = ToyDraft(model, gamma=3, rank=8 if seed == 0 else 0, seed=seed)
    out = SpeculativeDecoder(model, draft).generate(prompts, 10)
    assert out.sequences == [greedy_reference(model, p, 10) for p in prompts]
    ar = SpeculativeDecoder(model, draft).generate_autoregressive(prompts, 10)
    assert ar.sequences == out.sequences
    assert ar.num_rounds == [9, 9]


def test_batched_equals_one_by_one(tiny_target):
    model, _ = tiny_target("qwen3")
    prompts = prompts_for(model.config.vocab_size, (3, 11, 6), 5)
    draft = ToyDraft(model, gamma=4, seed=3)
    dec = SpeculativeDecoder(model, draft)
    batched = dec.generate(prompts, 12)
    for b, p in enumerate(prompts):
        single = dec.generate([p], 12)
        assert single.sequences[0] == batched.sequences[b]
        assert single.accept_lengths[0] == batched.accept_lengths[b]
    ar = dec.generate_autoregressive(prompts, 12)
    assert ar.sequences == batched.sequences


def test_confidence_threshold_is_lossless_and_shortens_verify(tiny_target):
    model, _ = tiny_target("llama")
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, (4, 8), 7)
    refs = [greedy_reference(model, p, 16) for p in prompts]
    draft = OracleDraft([p + r for p, r in zip(prompts, refs)], vocab, gamma=5, seed=4)
    dec = SpeculativeDecoder(
        model,
        draft,
        DecoderOptions(policy=VerifyPolicy(confidence_threshold=0.5), observer=draft.recorder),
    )
    out = dec.generate(prompts, 16)
    assert out.sequences == refs
    vers = [v for vs in out.verify_lengths for v in vs]
    assert min(vers) >= 1 and any(v < 5 for v in vers)
    for vs, cs in zip(out.verify_lengths, out.confidences):
        assert [len(c) for c in cs] == vs
    # the oracle's confidence is informative: every verified draft but the last is accepted
    for accs, vs in zip(out.accept_lengths, out.verify_lengths):
        assert all(a >= v - 1 for a, v in zip(accs, vs))


# ------------------------------------------------------------------ edges
def test_eos_and_max_new_tokens(tiny_target):
    model, _ = tiny_target("qwen2")
    vocab = model.config.vocab_size
    prompt = prompts_for(vocab, (6,), 11)[0]
    ref = greedy_reference(model, prompt, 20)
    draft = OracleDraft([prompt + ref], vocab, gamma=4, corrupt=0.1, seed=2)
    dec = SpeculativeDecoder(model, draft, DecoderOptions(observer=draft.recorder))
    for n in (1, 2, 3, 4, 5, 6, 9, 20):
        draft.refs = [prompt + ref]
        out = dec.generate([prompt], n)
        assert out.sequences[0] == ref[:n]
        assert dec.generate_autoregressive([prompt], n).sequences[0] == ref[:n]
    assert dec.generate([prompt], 0).sequences == [[]]
    for k in (0, 3, 7):  # EOS first token, inside a round, later
        eos = ref[k]
        if eos in ref[:k]:
            continue
        out = dec.generate([prompt], 20, eos_token_id=[eos, vocab - 5])
        assert out.sequences[0] == ref[: k + 1]
        assert (
            dec.generate_autoregressive([prompt], 20, eos_token_id=eos).sequences[0] == ref[: k + 1]
        )


def test_eos_in_one_request_leaves_others_running(tiny_target):
    model, _ = tiny_target("qwen3")
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, (5, 9), 13)
    refs = [greedy_reference(model, p, 15) for p in prompts]
    eos = refs[0][2]
    expect = [greedy_reference(model, p, 15, eos=(eos,)) for p in prompts]
    draft = OracleDraft([p + r for p, r in zip(prompts, refs)], vocab, gamma=4, seed=5)
    dec = SpeculativeDecoder(model, draft, DecoderOptions(observer=draft.recorder))
    out = dec.generate(prompts, 15, eos_token_id=eos)
    assert out.sequences == expect
    assert len(out.sequences[0]) <= 3
    assert dec.generate_autoregressive(prompts, 15, eos_token_id=eos).sequences == expect


def test_max_length_is_enforced(tiny_target):
    model, _ = tiny_target("qwen3")
    draft = ToyDraft(model, gamma=4)
    with pytest.raises(ValueError, match="max_length"):
        SpeculativeDecoder(model, draft, DecoderOptions(max_length=32)).generate([[1, 2, 3]], 40)


# ------------------------------------------------------------------ caches
def _fresh_kv(model, tokens):
    with torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=True, output_hidden_states=True)
    cache = out.past_key_values
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    return keys, values, out.hidden_states


def test_target_and_context_caches_match_a_rebuild(tiny_target, arch):
    model, _ = tiny_target(arch)
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, (4, 10, 7), 17)
    full = [greedy_reference(model, p, 13) for p in prompts]
    eos = full[1][4]  # request 1 stops early: the live batch shrinks mid-way
    refs = [greedy_reference(model, p, 13, eos=(eos,)) for p in prompts]
    draft = ToyDraft(model, gamma=4, seed=6)
    oracle = OracleDraft([p + r for p, r in zip(prompts, full)], vocab, gamma=4, seed=6)
    # the oracle picks the tokens; the toy draft's context API fills the context cache
    oracle.encode_context, oracle.context_kv = draft.encode_context, draft.context_kv
    oracle.recorder.keep_caches = True  # the test hook
    dec = SpeculativeDecoder(model, oracle, DecoderOptions(observer=oracle.recorder))
    out = dec.generate(prompts, 13, eos_token_id=eos)
    assert out.sequences == refs
    assert len({len(s) for s in refs}) > 1
    assert any(a < 4 for accs in out.accept_lengths for a in accs)  # there were rejections
    for b, (p, seq) in enumerate(zip(prompts, out.sequences)):
        committed = p + seq[:-1]  # everything but the pending anchor is in the caches
        n = len(committed)
        keys, values, hidden = _fresh_kv(model, committed)
        cache, ctx, row = oracle.recorder.final[b]  # the live batch shrinks as requests finish
        for layer in range(model.config.num_hidden_layers):
            torch.testing.assert_close(
                cache.keys[layer][row, :, :n], keys[layer][0], atol=1e-4, rtol=1e-4
            )
            torch.testing.assert_close(
                cache.values[layer][row, :, :n], values[layer][0], atol=1e-4, rtol=1e-4
            )
        tapped = torch.cat([hidden[i + 1] for i in TAPS], -1)
        kv = draft.context_kv(draft.encode_context(tapped), torch.arange(n)[None])
        for (k, v), kc, vc in zip(kv, ctx.keys, ctx.values):
            torch.testing.assert_close(kc[row, :, :n], k[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(vc[row, :, :n], v[0], atol=1e-4, rtol=1e-4)


def test_hf_forward_path_matches_fast_path(tiny_target):
    model, _ = tiny_target("qwen2")
    prompts = prompts_for(model.config.vocab_size, (5, 8), 19)
    draft = ToyDraft(model, gamma=3, seed=8)
    fast = SpeculativeDecoder(model, draft).generate(prompts, 9)
    dec = SpeculativeDecoder(model, draft)
    dec.runner = type(dec.runner)(model, TAPS, fast=False)
    slow = dec.generate(prompts, 9)
    assert slow.sequences == fast.sequences
    assert slow.accept_lengths == fast.accept_lengths


# ------------------------------------------------------------------ sampling is lossless
@pytest.mark.parametrize("markov,top_k,top_p", [(True, 3, 1.0), (False, 4, 0.9)])
def test_sampled_output_has_the_target_distribution(tiny_target, markov, top_k, top_p):
    """First 4 tokens (prefill + one round verifying 2 drafts) over N independent rows vs the
    exact warped target joint, for a draft that differs from the target."""
    model, _ = tiny_target("qwen3")
    prompt = prompts_for(model.config.vocab_size, (6,), 23)[0]
    temperature, n, depth = 1.5, 1500, 4
    draft = PromptAwareDraft(model, prompt, gamma=3, markov=markov, seed=9)
    dec = SpeculativeDecoder(
        model,
        draft,
        DecoderOptions(sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p)),
    )
    joint = exact_joint(model, prompt, depth, temperature, top_k, top_p)
    out = dec.generate([prompt] * n, depth, seed=1234)
    firsts = [a[0] for a in out.accept_lengths]
    assert all(v[0] == 2 for v in out.verify_lengths)
    assert 0.1 * n < sum(a > 0 for a in firsts) < 0.95 * n  # accepts and rejections
    assert sum(a == 2 for a in firsts) > 0.02 * n
    assert chisquare(out.sequences, joint) > 1e-3
    if markov:  # the AR baseline samples the same distribution
        ar = dec.generate_autoregressive([prompt] * n, depth, seed=99)
        assert chisquare(ar.sequences, joint) > 1e-3


# ------------------------------------------------------------------ the real DSpark draft
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"markov_head_type": "rnn", "block_size": 3},
        {"markov_rank": 0, "confidence_head_with_markov": False},
    ],
)
def test_real_draft_greedy_equals_plain_greedy(tiny_target, arch, kw):
    model, tok = tiny_target(arch)
    draft = real_draft(model, tok, **kw)
    prompts = prompts_for(model.config.vocab_size, (5, 9), 29)
    kept = Recorder(keep_caches=True)
    dec = SpeculativeDecoder(
        model,
        draft,
        DecoderOptions(
            policy=VerifyPolicy(confidence_threshold=0.3 if kw else None), observer=kept
        ),
    )
    out = dec.generate(prompts, 10)
    assert out.sequences == [greedy_reference(model, p, 10) for p in prompts]
    assert all(
        len(c) == v for cs, vs in zip(out.confidences, out.verify_lengths) for c, v in zip(cs, vs)
    )
    # the draft context cache holds context_kv of the committed sequence's tapped features
    for b, (p, seq) in enumerate(zip(prompts, out.sequences)):
        committed = p + seq[:-1]
        n = len(committed)
        with torch.no_grad():
            hs = model(torch.tensor([committed]), output_hidden_states=True).hidden_states
        tapped = torch.cat([hs[i + 1] for i in draft.config.target_layer_ids], -1)
        kv = draft.context_kv(draft.encode_context(tapped), torch.arange(n)[None])
        _, ctx, row = kept.final[b]
        for (k, v), kc, vc in zip(kv, ctx.keys, ctx.values):
            torch.testing.assert_close(kc[row, :, :n], k[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(vc[row, :, :n], v[0], atol=1e-4, rtol=1e-4)


def test_real_draft_sampling_runs_and_is_seeded(tiny_target):
    model, tok = tiny_target("qwen3")
    draft = real_draft(model, tok)
    prompts = prompts_for(model.config.vocab_size, (4, 7, 5), 31)
    dec = SpeculativeDecoder(
        model, draft, DecoderOptions(sampling=Sampling(temperature=0.8, top_p=0.95))
    )
    a = dec.generate(prompts, 12, seed=7)
    b = dec.generate(prompts, 12, seed=7)
    assert a.sequences == b.sequences and all(len(s) == 12 for s in a.sequences)
    # the round record accounts for every committed token: the prefill commits the first, a
    # round its accepted drafts plus one target token; only the last may be cut by the limit
    for seq, acc in zip(a.sequences, a.accept_lengths):
        committed = 1 + sum(acc) + len(acc)
        assert committed - dec.gamma <= len(seq) <= committed
    rounds = sum(len(x) for x in a.accept_lengths)
    assert a.tau == pytest.approx((sum(sum(x) for x in a.accept_lengths) + rounds) / rounds)
    c = dec.generate(prompts, 12, seed=8)
    assert c.sequences != a.sequences  # the seed decides the samples


@pytest.mark.parametrize("w2_scale", [1.0, 30.0, 1000.0])
def test_pruned_greedy_markov_step_equals_full(tiny_target, monkeypatch, w2_scale):
    """The CPU T=0 shortcut (Cauchy-Schwarz pruning of the W2 GEMV) drafts the same tokens."""
    from dspark.decoding import cpu_paths, decoder, draft_step

    model, tok = tiny_target("qwen3")
    drafted = []

    def spy(*args, **kwargs):
        prop = draft_step.propose(*args, **kwargs)
        drafted.append(prop.tokens.tolist())
        return prop

    monkeypatch.setattr(decoder, "propose", spy)
    for head_type in ("vanilla", "gated"):
        draft = real_draft(model, tok, markov_head_type=head_type, block_size=5)
        with torch.no_grad():
            draft.markov_head.markov_w2.weight.mul_(w2_scale)
        prompts = prompts_for(model.config.vocab_size, (6, 3), 37)
        dec = SpeculativeDecoder(model, draft)
        drafted.clear()
        pruned = dec.generate(prompts, 12)
        pruned_drafts = list(drafted)
        assert cpu_paths.GreedyPruner.get(draft.markov_head) is not None
        with monkeypatch.context() as m:
            m.setattr(cpu_paths.GreedyPruner, "get", classmethod(lambda cls, h: None))
            drafted.clear()
            full = dec.generate(prompts, 12)
        assert pruned_drafts == drafted
        assert pruned.sequences == full.sequences
        assert pruned.confidences == full.confidences


@pytest.mark.parametrize("kw", [{}, {"markov_head_type": "gated", "block_size": 5}])
def test_cpu_fast_paths_flag_keeps_greedy_outputs(tiny_target, kw):
    """`cpu_fast_paths=False` (plain lm_head, no Markov pruning) decodes the same tokens."""
    from dspark.decoding import cpu_paths

    model, tok = tiny_target("qwen3")
    draft = real_draft(model, tok, **kw)
    with torch.no_grad():  # a large W2 makes the Markov bias decide tokens
        draft.markov_head.markov_w2.weight.mul_(30.0)
    assert cpu_paths.GreedyPruner.get(draft.markov_head) is not None  # the path is live
    prompts = prompts_for(model.config.vocab_size, (6, 3, 9), 43)
    outs = {
        flag: SpeculativeDecoder(model, draft, DecoderOptions(cpu_fast_paths=flag)).generate(
            prompts, 12
        )
        for flag in (True, False)
    }
    assert outs[True].sequences == outs[False].sequences
    assert outs[True].accept_lengths == outs[False].accept_lengths
    assert outs[True].sequences == [greedy_reference(model, p, 12) for p in prompts]
    ar = {
        flag: SpeculativeDecoder(
            model, draft, DecoderOptions(cpu_fast_paths=flag)
        ).generate_autoregressive(prompts, 12)
        for flag in (True, False)
    }
    assert ar[True].sequences == ar[False].sequences == outs[True].sequences


def test_matvec_head_logits_matches_the_plain_head():
    from dspark.decoding.cpu_paths import matvec_head_logits
    from dspark.decoding.target_step import head_logits

    torch.manual_seed(0)
    head = nn.Linear(16, 512, bias=False)  # vocab >= 8 x hidden: the CPU path applies
    hidden = torch.randn(3, 4, 16)
    fast = head_logits(head, hidden)
    assert matvec_head_logits(head, hidden) is not None
    plain = head_logits(head, hidden, cpu_fast_paths=False)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    assert torch.equal(fast.argmax(-1), plain.argmax(-1))
    assert matvec_head_logits(head, hidden[:1, :1]) is None  # one row: F.linear already fast
