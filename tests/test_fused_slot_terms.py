"""The fused CE + L1 node (`dspark.fused_slot_terms`) against the composed functions of
`dspark.losses` (values and gradients) and against finite differences (`gradcheck`)."""

import pytest
import torch

from dspark import losses as L
from dspark.fused_slot_terms import slot_ce_l1

V, M = 13, 7
LABELS = torch.tensor([3, 0, 8, 5, 1, 12, 4])


def _case(reduced: bool, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    kept = torch.tensor([1, 3, 4, 8, 11]) if reduced else None
    K = 5 if reduced else V
    z = (torch.randn(M, K, generator=gen, dtype=torch.float64) * 2).to(dtype)
    t = torch.randn(M, V, generator=gen, dtype=torch.float64) * 2
    return kept, z, t


def _fused(z, t, kept):
    draft_ids, inside = L.in_vocab_labels(LABELS, kept)
    ce, l1, top = slot_ce_l1(z, L.target_probs(t, kept), draft_ids, inside)
    assert torch.equal(top, z.argmax(-1))
    return ce, l1


def _composed(z, t, kept):
    return L.slot_cross_entropy(z, LABELS, kept), L.slot_l1(z, t.float(), kept)


@pytest.mark.parametrize("reduced", [False, True])
def test_values_and_gradients_equal_the_composed_terms(reduced):
    kept, z, t = _case(reduced)
    # upstream weights differ per slot and per term, so each term's gradient is checked
    gen = torch.Generator().manual_seed(1)
    a, b = torch.rand(M, generator=gen), torch.rand(M, generator=gen)
    grads = []
    for fn in (_fused, _composed):
        zz = z.clone().requires_grad_()
        ce, l1 = fn(zz, t.float(), kept)
        (a * ce + b * l1).sum().backward()
        grads.append((ce.detach(), l1.detach(), zz.grad))
    (ce_f, l1_f, g_f), (ce_c, l1_c, g_c) = grads
    assert torch.allclose(ce_f, ce_c, atol=1e-5) and torch.allclose(l1_f, l1_c, atol=1e-5)
    assert torch.allclose(g_f, g_c, atol=1e-6)
    if reduced:  # labels 0, 5, 12 are outside: no CE, no CE gradient
        assert (ce_f[[1, 3, 5]] == 0).all()
        assert (l1_f > 0).all()


@pytest.mark.parametrize("reduced", [False, True])
def test_the_written_out_backward_passes_gradcheck(reduced):
    kept, z, t = _case(reduced, dtype=torch.float64, seed=2)
    draft_ids, inside = L.in_vocab_labels(LABELS, kept)
    # fp64 probabilities, so finite differences see the node's own rounding only
    q = torch.softmax(t, -1) if kept is None else torch.softmax(t, -1).index_select(-1, kept)
    z.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: slot_ce_l1(x, q, draft_ids, inside)[:2], (z,), eps=1e-6, atol=1e-5
    )


def test_bf16_logits_get_a_bf16_gradient_close_to_the_composed_one():
    kept, z, t = _case(True)
    zb = z.bfloat16().requires_grad_()
    ce, l1 = _fused(zb, t.float(), kept)
    (ce + l1).sum().backward()
    zr = zb.detach().float().requires_grad_()
    ce_r, l1_r = _composed(zr, t.float(), kept)
    (ce_r + l1_r).sum().backward()
    assert ce.dtype == l1.dtype == torch.float32 and zb.grad.dtype == torch.bfloat16
    assert torch.allclose(ce, ce_r, atol=1e-5) and torch.allclose(l1, l1_r, atol=1e-5)
    assert torch.allclose(zb.grad.float(), zr.grad, atol=1e-2)


def test_the_target_logits_must_be_constants():
    kept, z, t = _case(False)
    draft_ids, inside = L.in_vocab_labels(LABELS, kept)
    with pytest.raises(ValueError, match="detach"):
        slot_ce_l1(z, torch.softmax(t, -1).requires_grad_(), draft_ids, inside)


def test_a_label_far_below_the_top_gets_its_exact_ce():
    """p[y] underflows in fp32 (z[y] 200 below the top): CE is logsumexp(z) - z[y], not inf."""
    z = torch.tensor([[0.0, -200.0, 1.0], [0.0, 2.0, 1.0]], requires_grad=True)
    ids, inside = torch.tensor([1, 1]), torch.tensor([True, True])
    ce, l1, _ = slot_ce_l1(z, torch.full((2, 3), 1 / 3), ids, inside)
    want = torch.logsumexp(z.detach().double(), -1) - z.detach().double()[:, 1]
    assert torch.allclose(ce.double(), want, rtol=1e-6)
    ce.sum().backward()
    assert torch.isfinite(z.grad).all()
