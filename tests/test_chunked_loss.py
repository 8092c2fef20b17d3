"""The loss computed over chunks of slots with recomputation in backward: the same loss,
metrics and gradients as all slots at once and as the logits path (`forward` returning the
`[M, K]` logits, the loss terms applied to them whole), for full and reduced draft
vocabularies, vanilla and rnn Markov heads, with and without the confidence head; and no
vocabulary-sized tensor over all slots is kept for backward."""

import math

import pytest
import torch
from helpers import kept_ids_for, make_batch, make_draft, reduced_draft

from dspark import losses as L
from dspark.modeling.slot_chunks import chunk_bounds
from dspark.objectives import LocalReducer, build_objective
from dspark.objectives.documents import document_starts
from dspark.target.capture import OnlineTargetCapture, target_logits

G = 7
CHUNKS = [0, 1, 7, 10_000]  # 0: one chunk, no recomputation; 10_000 > M: one recomputed chunk


def test_chunk_bounds():
    assert chunk_bounds(10, 4) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert chunk_bounds(10, 0) == chunk_bounds(10, None) == [slice(0, 10)]
    assert chunk_bounds(3, 8) == [slice(0, 3)]
    assert chunk_bounds(0, 4) == chunk_bounds(0, 0) == [slice(0, 0)]
    with pytest.raises(ValueError, match=">= 0"):
        chunk_bounds(5, -1)


def logits_path(draft, target, batch, kept, ce_w=0.1, l1_w=0.9, conf_w=1.0, decay=4.0):
    """The loss from the whole `[M, K]` logits (`forward(slot_mask=)`, return_logits), the terms
    applied to all slots at once: what the objective computed before chunking."""
    ids = batch["input_ids"]
    lm = batch["loss_mask"].bool() & batch["attention_mask"].bool() & ~document_starts(batch)
    anchors, valid = L.sample_anchors(lm, 64, torch.Generator().manual_seed(0))
    mask = L.slot_supervision_mask(lm, anchors, valid, G)
    feats = OnlineTargetCapture(target, draft.config.target_layer_ids)(batch)
    out = draft(feats.tapped, ids, anchors, valid, slot_mask=mask)
    b, n, k = mask.nonzero(as_tuple=True)
    pos = anchors[b, n] + k
    labels = ids[b, pos + 1]
    t = target_logits(target.lm_head, feats.final_hidden[b, pos])
    w = L.decay_weights(G, decay)[k]
    inside = L.in_vocab_labels(labels, kept)[1]
    ce = L.slot_cross_entropy(out.logits, labels, kept)
    l1 = L.slot_l1(out.logits, t, kept)
    c = L.confidence_target(l1)
    loss = ce_w * (w * ce).sum() / (w * inside).sum() + l1_w * (w * l1).sum() / w.sum()
    if out.confidence_logits is not None:
        loss = loss + conf_w * (w * L.slot_confidence_bce(out.confidence_logits, c)).sum() / w.sum()
    match = L.greedy_match(out.logits, t, kept)
    first = mask[..., 0]
    tau = L.tau_per_block(L.scatter_slots(c, mask), mask)[first].mean()
    tau_greedy = L.tau_per_block(L.scatter_slots(match, mask), mask)[first].mean()
    metrics = {"tau_probabilistic": float(tau), "tau_greedy": float(tau_greedy)}
    metrics["out_of_vocab_labels"] = float((~inside).float().mean())
    return loss, metrics


CASES = [
    pytest.param(vocab, head, conf, id=f"{vocab}-{head}-conf{int(conf)}")
    for vocab in ("full", "reduced")
    for head in ("vanilla", "rnn")
    for conf in (True, False)
]


@pytest.mark.parametrize("vocab, head, conf", CASES)
def test_chunked_equals_unchunked_and_logits_path(tiny_target, vocab, head, conf):
    target, tok = tiny_target("qwen3")
    over = {"markov_head_type": head, "enable_confidence_head": conf}
    batch = make_batch()
    kept = kept_ids_for(target, batch) if vocab == "reduced" else None
    draft = (
        make_draft(target, tok, **over)
        if kept is None
        else reduced_draft(target, tok, kept, **over)
    )
    params = [p for p in draft.parameters() if p.requires_grad]
    ref_loss, ref_metrics = logits_path(draft, target, batch, kept)
    ref_grads = torch.autograd.grad(ref_loss, params)
    runs = {}
    for chunk in CHUNKS:
        obj = build_objective("dspark", target, draft.config, num_anchors=64, chunk_slots=chunk)
        loss, metrics = obj.step(draft, batch, LocalReducer())
        runs[chunk] = (loss, metrics, torch.autograd.grad(loss, params))
    M = runs[0][1]["supervised_tokens"]
    assert M > 7 * 2  # several chunks of 7
    for chunk, (loss, metrics, grads) in runs.items():
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6, msg=f"chunk {chunk}")
        for g, rg in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, rg, rtol=1e-5, atol=1e-6, msg=f"chunk {chunk}")
        for key, value in ref_metrics.items():
            assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-6), (chunk, key)
        assert metrics.keys() == runs[0][1].keys()
        for key, value in runs[0][1].items():  # every metric, chunked vs unchunked
            assert math.isclose(metrics[key], value, rel_tol=1e-6, abs_tol=1e-6), (chunk, key)
    assert ("confidence_bce" in runs[0][1]) == conf
    assert (runs[0][1]["out_of_vocab_labels"] > 0) == (kept is not None)


def _saved_vocab_rows(draft, target, batch, chunk):
    """Rows of every tensor with a vocabulary-sized last dim that autograd keeps for backward."""
    K = draft.lm_head.weight.shape[0]
    rows = []

    def pack(t):
        if t.dim() >= 2 and t.shape[-1] == K:
            rows.append(t.numel() // K)
        return t

    obj = build_objective("dspark", target, draft.config, num_anchors=64, chunk_slots=chunk)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, metrics = obj.step(draft, batch)
    loss.backward()
    return rows, int(metrics["supervised_tokens"])


@pytest.mark.parametrize("head", ["vanilla", "rnn"])
def test_no_vocab_sized_tensor_over_all_slots_is_kept(tiny_target, head):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok, markov_head_type=head)
    batch = make_batch()
    whole, M = _saved_vocab_rows(draft, target, batch, 0)
    assert max(whole) >= M  # unchunked: autograd keeps [M, V] softmaxes for backward
    chunked, _ = _saved_vocab_rows(draft, target, batch, 8)
    assert chunked == []  # chunked: only the chunks' [m, H] / [m, r] inputs are kept


def test_forward_keeps_the_logits_path(tiny_target):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok).eval()
    batch = make_batch()
    feats = OnlineTargetCapture(target, draft.config.target_layer_ids)(batch)
    ids = batch["input_ids"]
    anchors = torch.tensor([[1, 4], [2, 5]])
    mask = torch.ones(2, 2, G, dtype=torch.bool)
    with torch.no_grad():
        out = draft(feats.tapped, ids, anchors, slot_mask=mask)
        bare = draft(feats.tapped, ids, anchors, return_logits=False)
        seen = []

        def slot_loss(logits, rows, kept_ids):
            seen.append((rows, kept_ids))
            return {"logits": logits}

        terms = draft(feats.tapped, ids, anchors, slot_mask=mask, slot_loss=slot_loss, chunk_size=5)
    assert out.logits.shape == (2 * 2 * G, draft.config.vocab_size) and bare.logits is None
    torch.testing.assert_close(bare.hidden, out.hidden)
    assert terms.logits is None and [r for r, _ in seen] == chunk_bounds(2 * 2 * G, 5)
    assert all(k is None for _, k in seen)
    torch.testing.assert_close(terms.slot_terms["logits"], out.logits)
    torch.testing.assert_close(terms.confidence_logits, out.confidence_logits)
    with pytest.raises(ValueError, match="slot_mask"):
        draft(feats.tapped, ids, anchors, slot_loss=slot_loss)


def test_memory_estimate_counts_one_loss_chunk():
    """The estimator's loss term by hand: 6 fp32 [C, V] tensors, C = one chunk of slots (all M
    slots with chunk_slots=0); at Qwen3-8B's shape chunking removes most of it."""
    from dspark.bench.train_memory import RunShape, estimate

    V, M = 151936, 512 * 7  # Qwen3-8B's vocabulary; 512 anchors of 7 slots, batch 1
    whole = estimate("Qwen/Qwen3-8B", RunShape(chunk_slots=0))
    chunked = estimate("Qwen/Qwen3-8B", RunShape(chunk_slots=256))
    assert whole["supervised_slots"] == M and whole["loss_chunk_slots"] == M
    assert whole["activation_parts"]["loss"] == 6 * M * V * 4
    assert chunked["activation_parts"]["loss"] == 6 * 256 * V * 4
    drop = whole["activation_parts"]["loss"] - chunked["activation_parts"]["loss"]
    assert whole["bytes"]["replicated"]["total"] - chunked["bytes"]["replicated"]["total"] == drop
    small = estimate("Qwen/Qwen3-8B", RunShape(chunk_slots=10 * M))  # a chunk larger than M
    assert small["activation_parts"]["loss"] == whole["activation_parts"]["loss"]
