"""Pure loss functions: anchors, supervision masks, decay, L1 / c*, tau, and the terms of a
reduced draft vocabulary against numpy references."""

import math

import numpy as np
import pytest
import torch

from dspark import losses as L


def test_valid_anchor_mask():
    lm = torch.tensor([[0, 1, 1, 1, 0, 1, 1], [1, 1, 0, 1, 0, 0, 0]])
    assert L.valid_anchor_mask(lm).int().tolist() == [
        [0, 1, 1, 0, 0, 1, 0],
        [1, 0, 0, 0, 0, 0, 0],
    ]


def test_sample_anchors_takes_all_in_order_when_few():
    lm = torch.tensor([[0, 1, 1, 1, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0]])
    pos, ok = L.sample_anchors(lm, num_anchors=8, generator=torch.Generator().manual_seed(3))
    assert pos.tolist() == [[1, 2, 5], [0, 0, 0]]
    assert ok.tolist() == [[True, True, True], [True, False, False]]
    # independent of the generator
    pos2, ok2 = L.sample_anchors(lm, num_anchors=8, generator=torch.Generator().manual_seed(9))
    assert torch.equal(pos, pos2) and torch.equal(ok, ok2)


def test_sample_anchors_subsamples_without_replacement():
    lm = torch.ones(3, 40, dtype=torch.long)
    lm[2, 5:] = 0  # 4 valid anchors (0..3; 4 has no supervised next token): all taken
    a, ok = L.sample_anchors(lm, 6, torch.Generator().manual_seed(0))
    b, _ = L.sample_anchors(lm, 6, torch.Generator().manual_seed(0))
    c, _ = L.sample_anchors(lm, 6, torch.Generator().manual_seed(1))
    assert a.shape == (3, 6) and torch.equal(a, b) and not torch.equal(a[:2], c[:2])
    for row in range(2):
        r = a[row].tolist()
        assert r == sorted(set(r)) and all(0 <= p <= 38 for p in r) and ok[row].all()
    assert a[2].tolist() == [0, 1, 2, 3, 0, 0] and ok[2].tolist() == [True] * 4 + [False] * 2


def test_slot_supervision_truncates():
    S = 10
    lm = torch.ones(1, S, dtype=torch.long)
    lm[0, 5] = 0
    anchors = torch.tensor([[0, 1, 6, 0]])
    ok = torch.tensor([[True, True, True, False]])
    m = L.slot_supervision_mask(lm, anchors, ok, block_size=4).int().tolist()[0]
    assert m[0] == [1, 1, 1, 1]  # predicts 1..4
    assert m[1] == [1, 1, 1, 0]  # 2,3,4 ok, 5 is a gap -> truncated
    assert m[2] == [1, 1, 1, 0]  # 7,8,9 then the sequence ends
    assert m[3] == [0, 0, 0, 0]  # dummy block
    lm[0, 8] = 0  # a gap after p+1 truncates everything after it, even if 9 is set
    m = L.slot_supervision_mask(lm, anchors, ok, block_size=4).int().tolist()[0]
    assert m[2] == [1, 0, 0, 0]


def test_decay_l1_confidence_target():
    w = L.decay_weights(7, 4.0)
    assert torch.allclose(w, torch.tensor([math.exp(-k / 4) for k in range(7)]))
    logits = torch.randn(5, 11)
    assert torch.allclose(L.slot_l1(logits, logits), torch.zeros(5), atol=1e-6)
    far = torch.full((1, 3), -1e4)
    far[0, 0] = 1e4
    near = torch.full((1, 3), -1e4)
    near[0, 1] = 1e4
    assert torch.allclose(L.slot_l1(far, near), torch.tensor([2.0]))
    l1 = torch.tensor([0.0, 0.5, 2.0, 2.5])
    assert L.confidence_target(l1).tolist() == [1.0, 0.75, 0.0, 0.0]
    p_d, p_t = torch.softmax(logits[0], -1), torch.softmax(logits[1], -1)
    assert torch.allclose(L.slot_l1(logits[:1], logits[1:2]), (p_d - p_t).abs().sum())


def test_tau_per_block():
    c = torch.tensor([[[0.5, 0.5, 0.5], [1.0, 0.9, 0.2]]])
    m = torch.tensor([[[True, True, True], [True, True, False]]])
    tau = L.tau_per_block(c, m)
    assert torch.allclose(tau, torch.tensor([[1 + 0.5 + 0.25 + 0.125, 1 + 1.0 + 0.9]]))


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("reduced", [False, True])
def test_vocab_terms_match_numpy(reduced):
    """L1, c*, CE, in-vocab labels and greedy match against explicit numpy loops: a reduced
    draft's p_d is 0 outside the kept ids and the target keeps its mass there."""
    V, M = 11, 6
    kept = torch.tensor([1, 3, 4, 8]) if reduced else None
    ids = kept.tolist() if reduced else list(range(V))
    gen = torch.Generator().manual_seed(0)
    d_logits = torch.randn(M, len(ids), generator=gen, dtype=torch.float64).float() * 2
    t_logits = torch.randn(M, V, generator=gen, dtype=torch.float64).float() * 2
    t_logits[0, 3] = 9.0  # slot 0: the target's argmax (3) is kept ...
    d_logits[0, ids.index(3)] = 9.0  # ... and is the draft's argmax: a greedy match
    labels = torch.tensor([3, 0, 8, 5, 1, 10])  # 0, 5, 10 are outside the reduced vocabulary

    l1 = L.slot_l1(d_logits, t_logits, kept).numpy()
    c = L.confidence_target(torch.from_numpy(l1)).numpy()
    ce = L.slot_cross_entropy(d_logits, labels, kept).numpy()
    _, inside = L.in_vocab_labels(labels, kept)
    match = L.greedy_match(d_logits, t_logits, kept).numpy()
    dl, tl = d_logits.double().numpy(), t_logits.double().numpy()
    for m in range(M):
        p_d_small, p_t = _np_softmax(dl[m]), _np_softmax(tl[m])
        p_d = np.zeros(V)
        for j, tid in enumerate(ids):
            p_d[tid] = p_d_small[j]
        assert l1[m] == pytest.approx(np.abs(p_d - p_t).sum(), abs=1e-6)
        # 1 - L1/2 is the acceptance probability sum_v min(p_d, p_t)
        assert c[m] == pytest.approx(np.minimum(p_d, p_t).sum(), abs=1e-6)
        lab = int(labels[m])
        assert bool(inside[m]) == (lab in ids)
        want_ce = -np.log(p_d_small[ids.index(lab)]) if lab in ids else 0.0
        assert ce[m] == pytest.approx(want_ce, abs=1e-5)
        assert match[m] == float(ids[int(np.argmax(dl[m]))] == int(np.argmax(tl[m])))
    assert match[0] == 1.0
    if reduced:
        assert inside.tolist() == [True, False, True, False, True, False]
        # the target's mass outside the kept ids is never renormalised away
        assert (l1 >= 1 - _np_softmax(tl)[:, ids].sum(-1) - 1e-6).all()
    else:
        assert inside.all()


def test_out_of_vocab_labels_get_no_ce_gradient():
    kept = torch.tensor([2, 5, 7])
    logits = torch.randn(3, 3, requires_grad=True)
    ce = L.slot_cross_entropy(logits, torch.tensor([5, 6, 2]), kept)
    ce.sum().backward()
    assert ce[1] == 0 and logits.grad[1].abs().sum() == 0 and logits.grad[0].abs().sum() > 0
