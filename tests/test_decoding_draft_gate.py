"""The draft gate (draft_gate.py): its pricing by hand, its back-off and survival prior, and
its state across `generate` calls in the decoder (still lossless)."""

from __future__ import annotations

import pytest
from helpers import oracle_case

from dspark.decoding import DecoderOptions, SpeculativeDecoder, VerifyPolicy
from dspark.decoding.draft_gate import DraftGate, expected_tokens_per_s
from dspark.decoding.sps import SPSProfile


def _profile(draft_times=(0.1, 1.0)) -> SPSProfile:
    # rows 1: verify width 1/2/3 costs 1.0/1.1/1.2 s; rows 8: 1/2/3 s (compute-bound)
    return SPSProfile([1, 8], [1, 2, 3], [[1.0, 1.1, 1.2], [1.0, 2.0, 3.0]], list(draft_times))


def test_expected_tokens_per_s_by_hand():
    prof = _profile()
    surv, lengths = [[0.9, 0.8], [0.5, 0.25]], [2, 1]
    tau = 2 + (0.9 + 0.8) + 0.5
    t_draft = 0.1 + 0.9 / 7  # rows 2 lies 1/7 of the way from rows 1 to rows 8
    padded = tau / (t_draft + 1.2 + (3.0 - 1.2) / 7)  # width 1 + max l = 3
    ragged = tau / (t_draft + 1.15 + (2.5 - 1.15) / 7)  # width (2 + 3) / 2 = 2.5
    assert expected_tokens_per_s(surv, lengths, prof) == pytest.approx((padded, 2 / 1.0))
    assert expected_tokens_per_s(surv, lengths, prof, ragged=True)[0] == pytest.approx(ragged)


def test_gate_backs_off_doubles_and_prices_a_new_load_from_its_prior():
    gate = DraftGate(_profile(), gamma=2, interval=2, max_interval=8, probe_budget=0.0)
    surv = [0.9, 0.8]
    # load 1: verify both drafts, 2.7 tokens / 1.3 s beats 1 token / 1.0 s
    assert gate.lengths([surv], [2]) == [2] and gate.pays([surv], [2])
    # load 8: a verify pass is compute-bound, no depth pays, the draft round is a loss
    assert gate.lengths([surv] * 8, [2] * 8) == [0] * 8 and not gate.pays([surv] * 8, [0] * 8)

    def run(live: int, rounds: int) -> list[int]:
        pattern = []
        for _ in range(rounds):
            drafted = gate.should_draft(live)
            pattern.append(int(drafted))
            if drafted:
                gate.observe([surv] * live)
        return pattern

    assert gate.prior_pays(8) is None  # no history: the first round drafts
    # fails, skip 2, probe fails, skip 4, probe fails, skip 8 (capped), probe ...
    assert run(8, 18) == [1, 0, 0, 1, 0, 0, 0, 0, 1] + [0] * 8 + [1]
    assert gate.prior == pytest.approx(surv) and gate.backoff(8) == gate.backoff(5) == 8
    # the load drops to 1: the prior says drafting pays there, so it drafts at once
    assert run(1, 3) == [1, 1, 1] and gate.backoff(1) == 2
    # back to 8: the prior says it does not pay, so no probe is spent to learn that again,
    # and load 8 keeps its own (long) back-off
    assert run(8, 10) == [0] * 8 + [1, 0]
    assert [DraftGate.load_band(n) for n in (1, 2, 3, 4, 5, 8, 9, 64)] == [1, 2, 4, 4, 8, 8, 16, 64]
    # a load never backed off inherits the longest back-off below it (drafting lost there)
    assert gate.backoff(64) == 8 and gate.backoff(2) == 2 and gate.backoff(4) == 2
    assert not gate.should_draft(1, max_cap=0)  # only bonus tokens left: nothing to draft
    gate.reset()
    assert gate.prior is None and run(8, 1) == [1]


def test_gate_prior_is_an_exponential_average_of_mean_survival():
    gate = DraftGate(_profile(), gamma=2, prior_weight=0.25)
    gate.observe([[0.8, 0.4], [0.6, 0.2]])
    assert gate.prior == pytest.approx([0.7, 0.3])
    gate.observe([[0.2, 0.1]])
    assert gate.prior == pytest.approx([0.75 * 0.7 + 0.25 * 0.2, 0.75 * 0.3 + 0.25 * 0.1])
    with pytest.raises(ValueError, match="draft_probe_interval"):
        DraftGate(_profile(), gamma=2, interval=0)


def _sched_profile(draft_times, gamma=4):
    rows, widths = [1, 2, 4, 8], list(range(1, gamma + 2))
    times = [[1.0 + 0.02 * r * w for w in widths] for r in rows]
    return SPSProfile(rows, widths, times, list(draft_times))


def test_decoder_gate_state_outlives_a_call_and_stays_lossless(tiny_target):
    model, _ = tiny_target("qwen2")
    prompts, refs, draft = oracle_case(model, seed=43, max_new=30)
    # drafting costs 50 s at 2+ rows (never pays), nothing at 1 row (pays whenever drafts do)
    dec = SpeculativeDecoder(
        model,
        draft,
        DecoderOptions(
            policy=VerifyPolicy(
                "scheduler",
                sps=_sched_profile([0.0, 50.0, 50.0, 50.0]),
                draft_probe_interval=3,
                draft_probe_budget=0.0,
            ),
            observer=draft.recorder,
        ),
    )

    def skipped(out) -> list[int]:
        return [int(d == 0.0 and w == 1) for d, w in zip(out.round_draft_s, out.round_width)]

    first = dec.generate(prompts, 30)
    assert first.sequences == refs and skipped(first)[:5] == [0, 1, 1, 1, 0]
    again = dec.generate(prompts, 30)  # same load: the back-off carries over, no first probe
    assert again.sequences == refs and skipped(again)[0] == 1
    one = dec.generate(prompts[:1], 30)  # load 1: the prior says drafting pays there
    assert one.sequences == refs[:1] and skipped(one)[0] == 0
    dec.policy.gate.reset()  # a fresh decoder's state: the first round probes
    fresh = dec.generate(prompts, 30)
    assert fresh.sequences == refs and skipped(fresh)[0] == 0


def test_gate_prices_with_the_realized_acceptance_rate():
    gate = DraftGate(_profile(), gamma=2, realized_decay=0.5)
    surv = [0.9, 0.8]
    assert gate.priced([surv])  # as the draft claims: it pays at load 1
    # verification keeps contradicting it: depth 1 accepted once in 4, depth 2 never
    for accepted in (0, 1, 0, 0):
        gate.observe([surv], verified=[2], accepted=[accepted])
    # decayed sums: predicted 0.9 * (1 + .5 + .25 + .125), realized 1 * .25 (the 2nd round)
    k1 = 0.25 / (0.9 * 1.875)
    assert gate.realism() == pytest.approx([k1, 0.0])
    assert gate.corrected([surv])[0] == pytest.approx([0.9 * k1, 0.0])
    # 1.13 expected tokens over 1.2 s (draft + width 2) against 1 token per 1.0 s: no longer
    assert not gate.priced([surv]) and not gate.prior_pays(1)
    # under one slot's worth of verified survival a depth keeps the draft's own figure
    fresh = DraftGate(_profile(), gamma=2)
    fresh.observe([[0.5, 0.1]], verified=[1], accepted=[0])
    assert fresh.realism() == [1.0, 1.0]
    # corrected survivals never rise with depth (an underconfident deep slot stays capped)
    fresh.realized_sum, fresh.predicted_sum = [1.0, 4.0], [2.0, 1.0]
    assert fresh.corrected([[0.8, 0.6]])[0] == pytest.approx([0.4, 0.4])


def test_probe_floor_keeps_probes_under_their_budget():
    # a probe (draft round) costs 1.0 s at 8 rows against a 1.0 s AR step: at 5% of the AR
    # time, at most one probe per 20 rounds; at 1 row 0.1 s / (5% of 1.0 s) = 2 rounds
    gate = DraftGate(_profile(), gamma=2, interval=2, max_interval=64, probe_budget=0.05)
    assert gate.probe_floor(8) == 20 and gate.probe_floor(1) == 2
    assert gate.backoff(8) == 20 and gate.backoff(1) == 2  # floor over the interval
    gate.observe([[0.9, 0.8]] * 8)  # a failed round at 8: back off 20, next time 40
    assert gate.skip_left == 20 and gate.backoff(8) == 40
    assert DraftGate(_profile(), gamma=2, max_interval=16).backoff(8) == 16  # capped
    assert DraftGate(_profile(), gamma=2, probe_budget=0.0).probe_floor(8) == 1


def test_a_probe_replaces_the_prior_and_a_plain_round_averages_into_it():
    gate = DraftGate(_profile(), gamma=2, interval=1, probe_budget=0.0, prior_weight=0.5)
    assert gate.should_draft(8)
    gate.observe([[0.9, 0.8]] * 8)  # loses at load 8: back off one round
    assert not gate.should_draft(8) and gate.should_draft(8)  # ... then probe
    gate.observe([[0.2, 0.1]] * 8)
    assert gate.prior == pytest.approx([0.2, 0.1])  # the probe's survivals, not an average
    gate.skip_left = 0
    assert gate.should_draft(8)  # a plain (non-probe) drafted round
    gate.observe([[0.4, 0.3]] * 8)
    assert gate.prior == pytest.approx([0.3, 0.2])


def test_realized_gain_vetoes_what_the_survivals_promise():
    gate = DraftGate(_profile(), gamma=2, interval=2, probe_budget=0.0)
    surv = [[0.9, 0.8]]
    assert gate.lengths(surv, [2]) == [2] and gate.priced(surv)  # 2.7 tok / 1.3 s vs 1 / 1.0
    assert gate.realized_gain(1) is None
    # AR rounds at load 8 take 3.0 s against 1.0 s priced: the AR scale of every band that
    # has not run AR rounds of its own (the nearest band's stands in), bounded at 2
    gate.observe_round([0] * 8, [0] * 8, False, 3.0)
    assert gate.ar_scale(1) == gate.ar_scale(8) == 2.0
    gate.observe_round([0], [0], False, 1.5)  # load 1's own: 1.5 s against 1.0
    assert gate.ar_scale(1) == pytest.approx(1.5) and gate.ar_scale(8) == pytest.approx(2.0)
    # drafted rounds at load 1 that take 4.5 s and commit 2 tokens: AR steps (1.5 s each)
    # would have committed 3 in that time, a realized gain of 2/3 once 3 rounds were seen
    for n in range(3):
        assert gate.realized_gain(1) is None
        assert gate.should_draft(1)
        gate.observe_round([2], [1], True, 4.5)
        gate.observe(surv)
        assert gate.skip_left == (0 if n < 2 else 2)  # the third round vetoes: back off
    assert gate.realized_gain(1) == pytest.approx(2.0 / 3.0)
    assert gate.priced(surv) and gate.realized_loss(1)  # the survivals alone still pay
    # a new load band prices its prior, but the realized loss at load 1 keeps it from drafting
    gate.should_draft(8)
    gate.skip_left = 0
    assert gate.should_draft(1) is False and gate.skip_left > 0
    # rounds that pay lift the decayed gain (decay 0.9) back over 1
    for _ in range(6):
        gate.observe_round([2], [2], True, 1.5)  # 3 tokens in one AR step's time
    w = [0.9**k for k in range(9)]  # newest first
    tokens = 3 * sum(w[:6]) + 2 * sum(w[6:])
    ar_tokens = 1 * sum(w[:6]) + 3 * sum(w[6:])
    assert gate.realized_gain(1) == pytest.approx(tokens / ar_tokens) and not gate.realized_loss(1)
    assert gate.realized_gain(8) is None  # load bands keep their own
    gate.reset()
    assert gate.realized_gain(1) is None and gate.ar_scale(1) == 1.0


def test_the_decoder_times_every_round_for_the_gate(tiny_target):
    model, _ = tiny_target("qwen2")
    prompts, refs, draft = oracle_case(model, seed=44, max_new=20)
    # drafting never pays at 2+ rows: a drafted first round, then back-offs and probes
    policy = VerifyPolicy(
        "scheduler",
        sps=_sched_profile([0.0, 50.0, 50.0, 50.0]),
        draft_probe_interval=2,
        draft_probe_budget=0.0,
    )
    dec = SpeculativeDecoder(model, draft, DecoderOptions(policy=policy))
    timed: list[tuple[list[int], bool, float]] = []
    gate = policy.gate
    assert gate is not None
    observe_round = gate.observe_round

    def record(v, a, d, s):
        timed.append((list(v), d, s))
        observe_round(v, a, d, s)

    gate.observe_round = record  # type: ignore[method-assign]
    out = dec.generate(prompts, 20)
    assert out.sequences == refs
    assert len(timed) == len(out.round_rows)  # every round, drafted or not
    assert all(s > 0 for _, _, s in timed)
    drafted = [d for _, d, _ in timed]
    assert drafted == [w > 1 or d > 0 for d, w in zip(out.round_draft_s, out.round_width)]
    assert True in drafted and False in drafted
    assert [len(v) for v, _, _ in timed] == out.round_rows
    assert {gate.load_band(len(v)) for v, d, _ in timed if d} <= set(gate.drafted_sums)
    assert {gate.load_band(len(v)) for v, d, _ in timed if not d} <= set(gate.ar_time)
