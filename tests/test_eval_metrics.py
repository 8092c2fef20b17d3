"""Benchmark metrics against hand-computed values from a hand-made GenerationOutput."""

import pytest

from dspark.decoding.output import GenerationOutput
from dspark.eval.metrics import acceptance_stats, ratio, throughput


def _output():
    # block 3; request A: (accepted, verified) = (3,3) (1,3) (0,3); request B: (2,3) (0,2)
    return GenerationOutput(
        sequences=[[1] * 8, [1] * 5],
        accept_lengths=[[3, 1, 0], [2, 0]],
        verify_lengths=[[3, 3, 3], [3, 2]],
        confidences=[
            [[0.9, 0.8, 0.7], [0.6, 0.5, 0.4], [0.2, 0.1, 0.1]],
            [[0.9, 0.9, 0.3], [0.5, 0.5]],
        ],
        num_rounds=[3, 2],
        new_tokens=[8, 5],
        wall_time_s=1.0,
    )


def test_tau_counts_conditional_and_survival_by_hand():
    out = _output()
    s = acceptance_stats(out.accept_lengths, out.verify_lengths, block_size=3)
    assert s["rounds"] == 5
    assert s["tau_no_bonus"] == pytest.approx(6 / 5)
    assert s["tau"] == pytest.approx(11 / 5)
    assert s["tau"] == pytest.approx(out.tau)  # the decoder's own definition agrees
    # k=1: 5 trials, 3 accepted; k=2: trials (3,3) (1,3) (2,3), 2 accepted; k=3: (3,3) (2,3), 1
    assert s["trials_per_position"] == [5, 3, 2]
    assert s["conditional_acceptance"] == pytest.approx([3 / 5, 2 / 3, 1 / 2])
    assert s["survival"] == pytest.approx([3 / 5, 2 / 5, 1 / 5])
    assert s["realised_survival"] == pytest.approx([3 / 5, 2 / 5, 1 / 5])
    assert s["verify_rate"] == pytest.approx(14 / 15)
    assert (s["drafted"], s["verified"], s["accepted"]) == (15, 14, 6)


def test_survival_under_shortened_verification():
    # block 2: (1,1) could not try k=2, so it is no trial there
    s = acceptance_stats([[1, 2, 0]], [[1, 2, 2]], block_size=2)
    assert s["conditional_acceptance"] == pytest.approx([2 / 3, 1.0])
    assert s["survival"] == pytest.approx([2 / 3, 2 / 3])
    assert s["realised_survival"] == pytest.approx([2 / 3, 1 / 3])
    assert s["verify_rate"] == pytest.approx(5 / 6)


def test_positions_without_trials_are_none():
    s = acceptance_stats([[0, 0]], [[2, 2]], block_size=2)
    assert s["conditional_acceptance"] == [0.0, None]
    assert s["survival"] == [0.0, None]


def test_impossible_rounds_rejected():
    with pytest.raises(ValueError, match="impossible"):
        acceptance_stats([[3]], [[2]], block_size=3)
    with pytest.raises(ValueError, match="accept lengths"):
        acceptance_stats([[1, 1]], [[2]], block_size=3)


def test_throughput_and_ratio():
    assert throughput(50, 2.0)["tokens_per_s"] == 25.0
    assert throughput(5, 0.0)["tokens_per_s"] is None
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(1.0, 0) is None
