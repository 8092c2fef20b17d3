"""`VerifyPolicy` (verify_policy.py) on its own: each policy's verify lengths worked out by
hand on a tiny example, its defaults and checks, and the decoder's keyword arguments that
build it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import OracleDraft, greedy_reference, prompts_for

from dspark.decoding import DecoderOptions, SpeculativeDecoder
from dspark.decoding.sampling import Sampling
from dspark.decoding.sps import SPSProfile
from dspark.decoding.verify_policy import VerifyPolicy, threshold_lengths

# Two requests, gamma = 3. Survivals a_{r,j} = prod_{i<=j} c_{r,i}:
#   row 0: c = (0.9, 0.8, 0.5) -> a = (0.9, 0.72, 0.36)
#   row 1: c = (0.4, 0.9, 0.9) -> a = (0.4, 0.36, 0.324)
CONF = torch.tensor([[0.9, 0.8, 0.5], [0.4, 0.9, 0.9]])


def _draft(confidence_head=True, temperatures=None):
    cfg = SimpleNamespace(block_size=3, confidence_temperatures=temperatures)
    return SimpleNamespace(config=cfg, confidence_head=object() if confidence_head else None)


def _attached(*args, **kw) -> VerifyPolicy:
    policy = VerifyPolicy(*args, **kw)
    policy.attach(None, _draft(), torch.device("cpu"))
    return policy


def _sps(step_time) -> SPSProfile:
    """A profile whose verify step takes `step_time(tokens)` at 2 rows (any width)."""
    widths = [1, 2, 3, 4]
    return SPSProfile([2], widths, [[step_time(2 * w) for w in widths]])


def test_full_verifies_every_cap():
    policy = _attached("full")
    lengths, host = policy.lengths(CONF, [3, 1])
    assert host == [3, 1] and lengths.tolist() == [3, 1]
    assert policy.lengths(None, [2, 0])[1] == [2, 0]  # no confidences: the caps too


def test_threshold_is_the_longest_surviving_prefix_at_least_one():
    # threshold 0.5: row 0 keeps a = 0.9, 0.72 (2 drafts); row 1's first survival 0.4 fails,
    # but a round verifies at least one draft
    assert threshold_lengths(CONF, 0.5).tolist() == [2, 1]
    assert threshold_lengths(CONF, 0.3).tolist() == [3, 3]
    assert threshold_lengths(CONF, 0.95).tolist() == [1, 1]
    policy = _attached("threshold", confidence_threshold=0.5)
    assert policy.lengths(CONF, [3, 3])[1] == [2, 1]
    assert policy.lengths(CONF, [1, 0])[1] == [1, 0]  # within the caps (budget)


def test_scheduler_padded_admits_a_depth_while_theta_improves():
    # R = 2, B = 2 (1 + L): step time 1 + 0.1 B, SPS = 1 / time.
    # Theta(L) = (2 + sum_r sum_{j<=L} a_{r,j}) * SPS(2 (1 + L)):
    #   L=0: 2.00 / 1.2 = 1.667; L=1: 3.30 / 1.4 = 2.357; L=2: 4.38 / 1.6 = 2.7375;
    #   L=3: 5.064 / 1.8 = 2.813 -> every depth improves: L = 3
    policy = _attached("scheduler", sps=_sps(lambda b: 1 + 0.1 * b))
    assert policy.lengths(CONF, [3, 3])[1] == [3, 3]
    # row 1 capped at 1 adds nothing past depth 1: L=2: 4.02 / 1.6 = 2.5125;
    #   L=3: 4.38 / 1.8 = 2.433 < 2.5125 -> stop at L = 2, row 1 at its cap
    assert policy.lengths(CONF, [3, 1])[1] == [2, 1]
    # step time 1 + 0.3 B: L=0: 2 / 1.6 = 1.25; L=1: 3.3 / 2.2 = 1.5; L=2: 4.38 / 2.8 = 1.564;
    #   L=3: 5.064 / 3.4 = 1.489 < 1.564 -> stop at L = 2
    policy = _attached("scheduler", sps=_sps(lambda b: 1 + 0.3 * b))
    assert policy.lengths(CONF, [3, 3])[1] == [2, 2]


def test_scheduler_ragged_admits_slots_by_survival_while_theta_improves():
    # slots by a, descending: (0, 1) 0.9, (0, 2) 0.72, (1, 1) 0.4, (0, 3) 0.36, (1, 2) 0.36, ...
    # Theta(k slots) = (2 + sum of the k best a) * SPS(2 + k), step time 1 + 0.2 B:
    #   k=0: 2 / 1.4 = 1.429; k=1: 2.9 / 1.6 = 1.8125; k=2: 3.62 / 1.8 = 2.011;
    #   k=3: 4.02 / 2.0 = 2.01 < 2.011 -> stop: row 0 verifies 2 drafts, row 1 none
    policy = _attached("scheduler", sps=_sps(lambda b: 1 + 0.2 * b), scheduler_batch="ragged")
    assert policy.lengths(CONF, [3, 3])[1] == [2, 0]
    assert policy.lengths(CONF, [1, 3])[1] == [1, 1]  # a cap moves row 1's slot up


def test_default_kind_checks_and_calibration():
    assert _attached().kind == "full"
    assert _attached(confidence_threshold=0.5).kind == "threshold"
    no_head = VerifyPolicy(confidence_threshold=0.5)
    no_head.attach(None, _draft(confidence_head=False), torch.device("cpu"))
    assert no_head.kind == "full"  # a threshold without a confidence head verifies the block
    with pytest.raises(ValueError, match="no confidence head"):
        VerifyPolicy("scheduler", sps=_sps(lambda b: 1.0)).attach(
            None, _draft(confidence_head=False), torch.device("cpu")
        )
    with pytest.raises(ValueError, match="needs confidence_threshold"):
        VerifyPolicy("threshold")
    with pytest.raises(ValueError, match="verify_policy='nope'"):
        VerifyPolicy("nope")
    with pytest.raises(ValueError, match="scheduler_batch"):
        VerifyPolicy("scheduler", scheduler_batch="nope")
    sts = VerifyPolicy()
    sts.attach(None, _draft(temperatures=[2.0, 1.0, 0.5]), torch.device("cpu"))
    assert sts.confidence_temperatures.tolist() == [2.0, 1.0, 0.5]
    raw = VerifyPolicy(calibrate=False)
    raw.attach(None, _draft(temperatures=[2.0, 1.0, 0.5]), torch.device("cpu"))
    assert raw.confidence_temperatures is None
    # the draft gate needs draft times in the profile
    assert _attached("scheduler", sps=_sps(lambda b: 1.0)).gate is None


def test_decoder_options_carry_the_policy_and_the_sampling(tiny_target):
    model, _ = tiny_target("qwen3")
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, (5, 8), 3)
    refs = [greedy_reference(model, p, 10) for p in prompts]
    # one oracle each: an oracle's corruptions come from its own generator
    draft, twin = (
        OracleDraft([p + r for p, r in zip(prompts, refs)], vocab, gamma=4, seed=2)
        for _ in range(2)
    )
    policy = VerifyPolicy(confidence_threshold=0.5)
    by_name = SpeculativeDecoder(
        model, draft, DecoderOptions(policy=policy, observer=draft.recorder)
    )
    assert by_name.policy.kind == "threshold" and by_name.options.sampling == Sampling()
    by_order = SpeculativeDecoder(
        model,
        twin,
        DecoderOptions(
            Sampling(0.0), VerifyPolicy(confidence_threshold=0.5), observer=twin.recorder
        ),
    )
    a, b = by_name.generate(prompts, 10), by_order.generate(prompts, 10)
    assert a.sequences == b.sequences == refs and a.verify_lengths == b.verify_lengths
    with pytest.raises(TypeError):  # settings travel in the options object only
        SpeculativeDecoder(model, draft, temperature=1.0)
    by_name.options.sampling = Sampling(0.7, 5)  # as dspark/data/decoder_backend.py
    assert by_name.options.sampling == Sampling(0.7, 5, 1.0)
    assert not by_name.options.sampling.greedy
