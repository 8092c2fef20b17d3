"""The pure verification / sampling functions: exact distributions on tiny vocabularies."""

from __future__ import annotations

import pytest
import torch

from dspark.decoding.output import GenerationOutput
from dspark.decoding.sampling import NUCLEUS_FIRST_K, sample, warp
from dspark.decoding.verify import verify_greedy, verify_sampled


def test_verify_greedy_prefix_bonus_and_verify_len():
    drafts = torch.tensor([[5, 6, 7], [5, 9, 7], [1, 6, 7], [5, 6, 7]])
    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    n, nxt = verify_greedy(drafts, target, torch.tensor([3, 3, 3, 1]))
    assert n.tolist() == [3, 1, 0, 1]
    assert nxt.tolist() == [8, 6, 5, 6]  # bonus, correction, correction, bonus after L=1
    n, nxt = verify_greedy(drafts[:, :0], target[:, :1], torch.zeros(4, dtype=torch.long))
    assert n.tolist() == [0] * 4 and nxt.tolist() == [5] * 4


def chisquare(obs, exp):
    """scipy's chi-square with the expectation rescaled to the observed total (fp32 sums)."""
    from scipy.stats import chisquare as _chisquare

    exp = torch.as_tensor(exp, dtype=torch.float64)
    obs = torch.as_tensor(obs, dtype=torch.float64)
    return _chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy())


def test_sample_is_exact():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    g = torch.Generator().manual_seed(0)
    draws = sample(probs.expand(40000, 5).contiguous(), g)
    counts = torch.bincount(draws, minlength=5)
    assert counts[4] == 0
    assert chisquare(counts[:4].numpy(), (probs[:4] * 40000).numpy()).pvalue > 1e-3


def test_warp_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert (warp(logits, 1.0, top_k=2)[0, 2:] == 0).all()
    full = logits.softmax(-1)[0]
    p = warp(logits, 1.0, top_p=float(full[0] + 0.01))[0]  # needs the top two tokens
    assert (p[:2] > 0).all() and (p[2:] == 0).all()
    torch.testing.assert_close(p[:2], full[:2] / full[:2].sum())
    assert (warp(logits, 1.0, top_p=0.01)[0, 1:] == 0).all()  # always keeps one
    torch.testing.assert_close(warp(logits, 2.0)[0], (logits / 2).softmax(-1)[0])


def _nucleus_by_sort(logits, top_p):
    """The top-p cut as usually written (a full sort), the reference for `warp`'s."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
    drop = torch.zeros_like(drop).scatter(-1, order, drop)
    return logits.masked_fill(drop, float("-inf")).softmax(-1)


@pytest.mark.parametrize("top_p", [0.5, 0.95, 0.999])
def test_warp_top_p_equals_a_full_sort(top_p):
    g = torch.Generator().manual_seed(3)
    vocab = 3000  # > NUCLEUS_FIRST_K, so the flat rows' nucleus needs the widened search
    logits = torch.randn(6, vocab, generator=g) * torch.tensor(
        [[4.0], [2.0], [1.0], [0.3], [0.05], [0.01]]
    )
    logits[0, :5] += 10.0  # one peaked row: the nucleus is a few tokens
    got, want = warp(logits, 1.0, top_p=top_p), _nucleus_by_sort(logits, top_p)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want)
    assert (got[5] > 0).sum() > NUCLEUS_FIRST_K  # a near-flat row: the search was widened
    cut = warp(logits, 1.0, top_k=40, top_p=top_p)  # top-k first, then the nucleus of what is left
    assert ((cut > 0).sum(-1)[:5] <= 40).all()
    torch.testing.assert_close(
        cut[:5], _nucleus_by_sort(warp(logits, 1.0, top_k=40).log()[:5], top_p)
    )


def _random_dist(g, *shape, sparsity=0.3):
    logits = torch.randn(*shape, generator=g) * 2
    logits[torch.rand(*shape, generator=g) < sparsity] = float("-inf")
    logits[..., 0] = 0.0  # never all -inf
    return logits.softmax(-1)


@pytest.mark.parametrize("n_draft,vlen", [(1, 1), (2, 2), (3, 2), (2, 0)])
def test_verify_sampled_commits_exactly_p(n_draft, vlen):
    """Tokens committed in one round, with p and q of step 2 depending on token 1, follow the
    target: t1 ~ p1 and t2 | t1 ~ P2[t1] (when the round commits two tokens)."""

    vocab, rows = 5, 60000
    g = torch.Generator().manual_seed(n_draft * 10 + vlen)
    p_tab = [_random_dist(g, vocab)] + [_random_dist(g, vocab, vocab) for _ in range(n_draft)]
    q_tab = [_random_dist(g, vocab)] + [_random_dist(g, vocab, vocab) for _ in range(n_draft)]
    # drafts x_k ~ q_k(. | x_{k-1}); p_k(. | x_{k-1}) is the target's for that prefix
    drafts, q, p = [], [], [p_tab[0].expand(rows, vocab)]
    q_k = q_tab[0].expand(rows, vocab)
    for k in range(n_draft):
        x = sample(q_k.contiguous(), g)
        drafts.append(x)
        q.append(q_k)
        p.append(p_tab[k + 1][x])
        if k + 1 < n_draft:
            q_k = q_tab[k + 1][x]
    drafts = torch.stack(drafts, 1)
    q, p = torch.stack(q, 1), torch.stack(p, 1)
    n, nxt = verify_sampled(drafts, q, p, torch.full((rows,), vlen), g)
    assert (n <= vlen).all()
    first = torch.where(n > 0, drafts[:, 0], nxt)
    counts = torch.bincount(first, minlength=vocab)
    support = p_tab[0] > 0
    assert counts[~support].sum() == 0
    assert chisquare(counts[support].numpy(), (p_tab[0][support] * rows).numpy()).pvalue > 1e-3
    if vlen >= 1:
        two = n >= 1
        second = torch.where(n[two] > 1, drafts[two, 1 % n_draft], nxt[two])
        pair = torch.stack([first[two], second], 1)
        for t1 in range(vocab):
            sel = pair[pair[:, 0] == t1, 1]
            if len(sel) < 2000:
                continue
            exp = p_tab[1][t1]
            counts = torch.bincount(sel, minlength=vocab)
            assert counts[exp == 0].sum() == 0
            pv = chisquare(counts[exp > 0].numpy(), (exp[exp > 0] * len(sel)).numpy()).pvalue
            assert pv > 1e-3, (t1, counts, exp * len(sel))
    assert 0 < (n > 0).float().mean() < 1 or vlen == 0


def test_verify_sampled_identical_p_q_accepts_everything():
    g = torch.Generator().manual_seed(3)
    p = _random_dist(g, 100, 4, 7)
    drafts = sample(p[:, :3].contiguous(), g)
    n, _ = verify_sampled(drafts, p[:, :3], p, torch.full((100,), 3), g)
    assert (n == 3).all()


def test_generation_output_stats():
    out = GenerationOutput(
        sequences=[[1, 2, 3, 4], [5]],
        accept_lengths=[[2, 0], []],
        verify_lengths=[[3, 3], []],
        confidences=[[[], []], []],
    )
    assert out.tau == pytest.approx((2 + 0 + 2) / 2)
    assert out.acceptance_by_position() == [0.5, 1.0, 0.0]
