"""The prefix scheduler (paper Algorithm 1): pure-function checks against a loop written from
the paper, losslessness inside the decoder at every load, and the Appendix A counter-example
(dropping the break makes the committed-token distribution wrong, so these tests can fail)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    OracleDraft,
    PrefixMarkov,
    PromptAwareDraft,
    chisquare,
    exact_joint,
    greedy_reference,
    oracle_case,
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
from dspark.decoding import verify_policy as policy_module
from dspark.decoding.scheduler import schedule_padded, schedule_ragged
from dspark.decoding.sps import Roofline, SPSProfile


# ------------------------------------------------------------------ references from the paper
def ragged_reference(a: list[list[float]], sps, cap=None, stop_at_first=True) -> list[int]:
    """Algorithm 1 as a plain loop: sort slots by a (desc), B = R, admit while Theta improves."""
    rows, gamma = len(a), len(a[0])
    cap = cap or [gamma] * rows
    slots = sorted(
        ((a[r][j], j, r) for r in range(rows) for j in range(cap[r])), key=lambda s: (-s[0], s[1])
    )
    tau, b = float(rows), rows
    best, lengths = tau * sps[b], [0] * rows
    history = [(best, list(lengths))]
    for val, _, r in slots:
        cand = (tau + val) * sps[b + 1]
        if stop_at_first and not cand > best:
            break
        tau, b, best = tau + val, b + 1, cand
        lengths[r] += 1
        history.append((cand, list(lengths)))
    if stop_at_first:
        return lengths
    return max(history, key=lambda h: h[0])[1]  # first global maximum


def padded_reference(a, sps, cap=None) -> list[int]:
    rows, gamma = len(a), len(a[0])
    cap = cap or [gamma] * rows

    def theta(depth):
        tau = rows + sum(a[r][j] for r in range(rows) for j in range(min(depth, cap[r])))
        return tau * sps[rows * (1 + depth)]

    depth = 0
    while depth < gamma and theta(depth + 1) > theta(depth):
        depth += 1
    return [min(depth, c) for c in cap]


def random_case(g: torch.Generator, rows: int, gamma: int):
    c = torch.rand(rows, gamma, generator=g) ** 0.3  # confidences mostly high
    a = c.cumprod(1)
    b = torch.arange(rows * (gamma + 1) + 1, dtype=torch.float32)
    fixed, per_token = 0.2 + torch.rand(1, generator=g).item(), torch.rand(1, generator=g).item()
    sps = 1.0 / (fixed + per_token * b / rows)  # cost affine in tokens per request
    sps[0] = sps[1]
    return a, sps


@pytest.mark.parametrize("seed", range(6))
def test_ragged_matches_the_paper_loop(seed):
    g = torch.Generator().manual_seed(seed)
    for rows, gamma in ((1, 3), (3, 5), (8, 7)):
        a, sps = random_case(g, rows, gamma)
        cap = torch.randint(0, gamma + 1, (rows,), generator=g)
        for caps in (None, cap):
            ref = ragged_reference(
                a.tolist(), sps.tolist(), None if caps is None else caps.tolist()
            )
            assert schedule_ragged(a, sps, caps).tolist() == ref
            ref_pad = padded_reference(
                a.tolist(), sps.tolist(), None if caps is None else caps.tolist()
            )
            assert schedule_padded(a, sps, caps).tolist() == ref_pad
        ref_nb = ragged_reference(a.tolist(), sps.tolist(), stop_at_first=False)
        assert schedule_ragged(a, sps, stop_at_first=False).tolist() == ref_nb


def test_scheduler_extremes_and_zero_drafts():
    a = torch.tensor([[0.9, 0.8, 0.7], [0.2, 0.1, 0.05]])
    flat = torch.ones(2 * 4 + 1)  # verifying is free: everything with a > 0
    assert schedule_ragged(a, flat).tolist() == [3, 3]
    assert schedule_padded(a, flat).tolist() == [3, 3]
    steep = 1.0 / torch.arange(0, 9).clamp_min(1).float() ** 2  # cost grows faster than tau
    assert schedule_ragged(a, steep).tolist() == [0, 0]
    # one extra token costs 30%: only the confident request verifies, the other verifies none
    mid = 1.0 / (1.0 + 0.3 * (torch.arange(9).float() - 2).clamp_min(0))
    lengths = schedule_ragged(a, mid).tolist()
    assert lengths[1] == 0 and lengths[0] >= 1
    assert schedule_ragged(a, flat, torch.tensor([1, 0])).tolist() == [1, 0]
    with pytest.raises(ValueError, match="SPS table"):
        schedule_ragged(a, torch.ones(5))


def test_sps_profile_interpolates_and_tables():
    prof = SPSProfile([1, 4], [1, 3], [[1.0, 2.0], [2.0, 5.0]])
    assert prof.step_time(1, 2) == pytest.approx(1.5)
    assert prof.step_time(2, 1) == pytest.approx(1 + 1 / 3)
    assert prof.step_time(4, 5) == pytest.approx(8.0)  # linear past the last width
    table = prof.table(4, 2)
    assert table.shape == (13,) and table[4] == pytest.approx(1 / 2.0)
    assert table[12] == pytest.approx(1 / prof.step_time(4, 3))
    roof = Roofline(weight_bytes=16e9, hbm_bytes_per_s=4.8e12, flops_per_s=990e12, overhead_s=1e-3)
    t1, t256 = roof.step_time(1, 1), roof.step_time(32, 8)
    assert t1 == pytest.approx(16e9 / 4.8e12)  # memory-bound at one token
    assert t256 == pytest.approx(max(16e9 / 4.8e12, 2 * 8e9 * 256 / 990e12))


# ------------------------------------------------------------------ lossless in the decoder
def _profile(fixed: float, per_token: float, gamma: int, draft_s: float | None = None):
    rows = [1, 2, 4, 8]
    widths = list(range(1, gamma + 2))
    times = [[fixed + per_token * r * w for w in widths] for r in rows]
    return SPSProfile(rows, widths, times, None if draft_s is None else [draft_s] * len(rows))


def test_scheduler_skips_unprofitable_drafts_losslessly(tiny_target):
    model, _ = tiny_target("qwen2")
    prompts, refs, draft = oracle_case(model, seed=43, max_new=30)
    for draft_s, max_interval, expect in (
        (50.0, 64, [0] + [1] * 3 + [0] + [1] * 6 + [0] + [1] * 12 + [0]),  # back-off doubles
        (50.0, 3, [0] + [1] * 3 + [0] + [1] * 3 + [0] + [1] * 3 + [0]),  # capped: fixed
        (0.0, 64, [0] * 8),  # the draft is free: never skipped
    ):
        dec = SpeculativeDecoder(
            model,
            draft,
            DecoderOptions(
                policy=VerifyPolicy(
                    "scheduler",
                    sps=_profile(1.0, 0.02, 4, draft_s),
                    draft_probe_interval=3,
                    max_draft_probe_interval=max_interval,
                    draft_probe_budget=0.0,
                ),
                observer=draft.recorder,
            ),
        )
        out = dec.generate(prompts, 30)
        assert out.sequences == refs
        skipped = [int(d == 0.0 and w == 1) for d, w in zip(out.round_draft_s, out.round_width)]
        # while the load holds (a new load is priced afresh from the gate's prior)
        steady = next((i for i, r in enumerate(out.round_rows) if r != 3), len(skipped))
        n = min(len(expect), steady)
        assert n >= 8 and skipped[:n] == expect[:n], skipped


@pytest.mark.parametrize("batch_mode", ["ragged", "padded"])
def test_scheduler_greedy_equals_plain_greedy_at_every_load(tiny_target, arch, batch_mode):
    model, _ = tiny_target(arch)
    vocab = model.config.vocab_size
    max_new, gamma = 12, 4
    prompts_all = prompts_for(vocab, (5, 3, 9, 6, 4, 7, 8, 5), 41)
    refs_all = [greedy_reference(model, p, max_new) for p in prompts_all]
    lengths_seen = set()
    for load in (1, 2, 3, 5, 8):
        prompts, refs = prompts_all[:load], refs_all[:load]
        draft = OracleDraft([p + r for p, r in zip(prompts, refs)], vocab, gamma=gamma, seed=load)
        sps = _profile(1.0, 0.08, gamma)
        dec = SpeculativeDecoder(
            model,
            draft,
            DecoderOptions(
                policy=VerifyPolicy("scheduler", sps=sps, scheduler_batch=batch_mode),
                observer=draft.recorder,
            ),
        )
        out = dec.generate(prompts, max_new)
        assert out.sequences == refs, load
        lengths_seen |= {v for vs in out.verify_lengths for v in vs}
        assert len(out.round_draft_s) == len(out.round_verify_s) == max(out.num_rounds)
        assert all(t == r + sum(v) for t, r, v in zip(out.round_tokens, out.round_rows, [
            [vs[i] for vs in out.verify_lengths if i < len(vs)] for i in range(len(out.round_rows))
        ]))  # fmt: skip
    assert 0 in lengths_seen and max(lengths_seen) >= 2, lengths_seen


class _FeatMarkov(PrefixMarkov):
    """The prompt-aware Markov head, whose feature says which token came before (for c_k)."""

    def step(self, h_k, prev_token, state):
        bias, _, state = super().step(h_k, prev_token, state)
        return bias, F.one_hot(prev_token % 4, 4).float(), state


class _FeatConfidence(nn.Module):
    """c_k from the previous drafted token (Markov) or from the slot's logits (parallel)."""

    def __init__(self, weights=(2.5, -2.0, 1.0, -0.5)):
        super().__init__()
        self.weights = torch.tensor(weights)

    def forward(self, h_k, feat):
        if feat is not None and feat.abs().sum() > 0:
            return feat @ self.weights
        top = h_k.topk(2, dim=-1).values
        return 2.0 * (top[:, 0] - top[:, 1]) - 1.0


def _confident_draft(model, prompt, markov, seed, noise=1.0):
    draft = PromptAwareDraft(model, prompt, gamma=3, markov=markov, noise=noise, seed=seed)
    if markov:
        draft.markov_head = _FeatMarkov(draft)
    draft.confidence_head = _FeatConfidence()
    return draft


@pytest.mark.parametrize(
    "markov,batch_mode,draft_s",
    [
        (True, "ragged", None),
        (False, "ragged", None),
        (True, "padded", None),
        (True, "padded", 9.0),
    ],
)
def test_scheduler_sampled_output_has_the_target_distribution(
    tiny_target, markov, batch_mode, draft_s
):
    """First 4 tokens over N rows decoded together with the scheduler on vs the exact joint."""
    model, _ = tiny_target("qwen3")
    prompt = prompts_for(model.config.vocab_size, (6,), 23)[0]
    temperature, top_k, n, depth = 1.5, 3, 1500, 4
    draft = _confident_draft(model, prompt, markov, seed=9)
    # a row's extra draft costs ~ a fifth of a step: the scheduler picks mixed lengths
    drafts = None if draft_s is None else [draft_s, draft_s * n]  # 9.0: drafting never pays
    sps = SPSProfile([1, n], [1, 4], [[1.0, 1.6], [1.0 * n, 1.6 * n]], drafts)
    dec = SpeculativeDecoder(
        model,
        draft,
        DecoderOptions(
            sampling=Sampling(temperature=temperature, top_k=top_k),
            policy=VerifyPolicy("scheduler", sps=sps, scheduler_batch=batch_mode),
        ),
    )
    joint = exact_joint(model, prompt, depth, temperature, top_k)
    out = dec.generate([prompt] * n, depth, seed=1234)
    first = [v[0] for v in out.verify_lengths]
    if draft_s is not None:  # round 1 drafts, round 2 is an AR step
        assert out.round_draft_s[1] == 0.0 and out.round_width[1] == 1
    if batch_mode == "ragged":
        assert len(set(first)) >= 2, set(first)  # requests verify different lengths
    assert any(a > 0 for accs in out.accept_lengths for a in accs)
    assert chisquare(out.sequences, joint) > 1e-3


# ------------------------------------------------------------------ Appendix A: the break
# One request, gamma = 2. c_1 = 0.9 always; c_2 depends on the drafted x_1 (high for x_1 in
# {2, 3}). SPS: one extra token halves the step rate, a second one is free. With the break the
# first slot does not pay (Theta 0.95 < 1) and the request verifies nothing. Without it the
# scheduler looks past that slot: verifying both pays iff c_2(x_1) is high, so x_1 is verified
# only when it is 2 or 3, and the first committed token stops following p.
P = torch.tensor([0.4, 0.3, 0.2, 0.1])
Q = torch.tensor([0.1, 0.2, 0.3, 0.4])
C2 = torch.tensor([0.05, 0.05, 0.95, 0.95])
SPS_STEP = torch.tensor([1.0, 1.0, 0.5, 0.5])


def _lengths(x1: torch.Tensor, stop_at_first: bool) -> torch.Tensor:
    a = torch.stack([torch.full_like(C2[x1], 0.9), 0.9 * C2[x1]], 1)
    return torch.cat(
        [
            schedule_ragged(a[i : i + 1], SPS_STEP, stop_at_first=stop_at_first)
            for i in range(len(a))
        ]
    )


def _exact_first_token(stop_at_first: bool) -> torch.Tensor:
    """Exact law of the first committed token: sum over x_1 ~ q of the verify outcome."""
    lengths = _lengths(torch.arange(4), stop_at_first)
    residual = (P - Q).clamp_min(0)
    residual = residual / residual.sum()
    law = torch.zeros(4)
    for x in range(4):
        if lengths[x] == 0:
            law += Q[x] * P  # bonus token straight from p
        else:
            acc = min(1.0, float(P[x] / Q[x]))
            law += Q[x] * ((1 - acc) * residual + acc * F.one_hot(torch.tensor(x), 4))
    return law


def test_appendix_a_exact_distribution_shift_without_the_break():
    assert _lengths(torch.arange(4), True).tolist() == [0, 0, 0, 0]
    assert _lengths(torch.arange(4), False).tolist() == [0, 0, 2, 2]  # anticipating
    torch.testing.assert_close(_exact_first_token(True), P)
    shifted = _exact_first_token(False)
    torch.testing.assert_close(shifted, torch.tensor([0.42, 0.19, 0.26, 0.13]))
    assert 0.5 * (shifted - P).abs().sum() > 0.1  # total variation


@pytest.mark.parametrize("stop_at_first", [True, False])
def test_appendix_a_sampled_through_verification(stop_at_first):
    """Monte Carlo through the real `verify_sampled`: the chi-square test passes with the
    break and rejects the anticipating scheduler."""
    from scipy.stats import chisquare

    n = 6000
    g = torch.Generator().manual_seed(5)
    x1 = torch.multinomial(Q, n, replacement=True, generator=g)
    x2 = torch.multinomial(Q, n, replacement=True, generator=g)
    lengths = torch.tensor([0, 0, 0, 0]) if stop_at_first else None
    per_x = _lengths(torch.arange(4), stop_at_first)
    vlen = per_x[x1] if lengths is None else lengths[x1]
    p = P.expand(n, 3, 4).clone()
    q = Q.expand(n, 2, 4).clone()
    n_acc, nxt = verify_sampled(torch.stack([x1, x2], 1), q, p, vlen, g)
    first = torch.where(n_acc > 0, x1, nxt)
    counts = torch.bincount(first, minlength=4).float()
    pvalue = chisquare(counts.numpy(), (P * n).numpy()).pvalue
    if stop_at_first:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6
        shifted = chisquare(counts.numpy(), (_exact_first_token(False) * n).numpy()).pvalue
        assert shifted > 1e-3  # ... and it follows the computed shifted law


def _per_request(stop_at_first: bool, sps_one: torch.Tensor):
    """The scheduler run for each request on its own (R = 1, as in the counter-example)."""

    def one(survival, cap):
        return schedule_ragged(survival[None], sps_one, cap[None], stop_at_first=stop_at_first)

    def schedule(survival, sps, cap):
        return torch.func.vmap(one)(survival, cap).squeeze(-1)

    return schedule


def test_appendix_a_in_the_decoder(tiny_target, monkeypatch):
    """The anticipating variant, swapped into the decoder, fails the chi-square test that the
    published scheduler passes. Each request is scheduled alone against an SPS table where the
    first extra token does not pay and the second almost comes free."""
    model, _ = tiny_target("qwen3")
    prompt = prompts_for(model.config.vocab_size, (6,), 23)[0]
    temperature, top_k, n = 1.5, 3, 1000
    joint = exact_joint(model, prompt, 2, temperature, top_k)
    draft = _confident_draft(model, prompt, markov=True, seed=9, noise=2.0)
    draft.confidence_head = _FeatConfidence((4.0, -4.0, 4.0, -4.0))  # c_2 ~ 1 iff x_1 even
    sps_one = torch.tensor([1.0, 1.0, 1 / 2.05, 1 / 2.1, 1 / 2.15])
    pvalues, lengths = {}, {}
    for stop in (True, False):
        monkeypatch.setitem(policy_module.SCHEDULERS, "ragged", _per_request(stop, sps_one))
        dec = SpeculativeDecoder(
            model,
            draft,
            DecoderOptions(
                sampling=Sampling(temperature=temperature, top_k=top_k),
                policy=VerifyPolicy(
                    "scheduler", sps=_profile(1.0, 0.1, 3), scheduler_batch="ragged"
                ),
                time_rounds=False,
            ),
        )
        out = dec.generate([prompt] * n, 4, seed=77)
        lengths[stop] = {v[0] for v in out.verify_lengths}
        pvalues[stop] = chisquare([s[:2] for s in out.sequences], joint)
    assert lengths[True] == {0} and lengths[False] >= {0, 2}, lengths
    assert pvalues[True] > 1e-3
    assert pvalues[False] < 1e-4, pvalues


def test_measured_profile_is_cached_per_device_target_dtype(tiny_target, monkeypatch):
    from helpers import make_draft

    from dspark.decoding import sps as sps_module

    model, tok = tiny_target("qwen3")
    draft = make_draft(model, tok, block_size=3).eval().requires_grad_(False)
    kw = {"rows": [1, 2], "widths": [1, 4], "context_len": 8, "reps": 1}
    prof = sps_module.load_or_measure(model, draft, gamma=3, **kw)
    assert len(prof.times) == 2 and all(t > 0 for row in prof.times for t in row)
    assert len(prof.draft_times) == 2 and prof.meta["source"] == "measured"
    path = sps_module.cache_path(model.config._name_or_path, torch.device("cpu"), torch.float32, 3)
    assert path.exists() and SPSProfile.load(path).times == prof.times

    def fail(*a, **k):
        raise AssertionError("a cached profile must not be measured again")

    monkeypatch.setattr(sps_module, "measure", fail)
    assert sps_module.load_or_measure(model, draft, gamma=3, **kw).times == prof.times
    dec = SpeculativeDecoder(
        model, draft, DecoderOptions(policy=VerifyPolicy("scheduler"))
    )  # start-up: the cache
    assert dec.policy.sps.times == prof.times
    out = dec.generate([[1, 2, 3]], 6)
    assert out.sequences == [greedy_reference(model, [1, 2, 3], 6)]


def test_profile_of_another_version_is_refused_and_a_stale_cache_remeasured(
    tiny_target, tmp_path, monkeypatch
):
    import json

    from dspark.decoding import sps as sps_module

    grid = {"rows": [1], "widths": [1, 4], "times": [[0.01, 0.02]]}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(grid))  # written before versioning: read as version 1
    assert SPSProfile.load(old).times == [[0.01, 0.02]]
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**grid, "version": sps_module.PROFILE_VERSION + 1}))
    with pytest.raises(sps_module.StaleProfileError, match="re-run eval/profile_sps.py"):
        SPSProfile.load(newer)

    model, _ = tiny_target("qwen3")
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    path = sps_module.cache_path(model.config._name_or_path, torch.device("cpu"), torch.float32, 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(newer.read_text())
    kw = {"rows": [1], "widths": [1, 2], "context_len": 8, "reps": 1}
    prof = sps_module.load_or_measure(model, gamma=3, **kw)
    assert prof.meta["source"] == "measured" and prof.widths == [1, 2]
    assert json.loads(path.read_text())["version"] == sps_module.PROFILE_VERSION
