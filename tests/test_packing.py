"""Sequence packing: first-fit rows, packed collation, and that a packed conversation gets the
same target features, draft outputs and loss terms as the conversation run alone (document
masks leak nothing), on every tiny target."""

from types import SimpleNamespace

import pytest
import torch
from helpers import make_draft

from dspark.data.collate import PadCollator
from dspark.data.packing import PackedDataset, first_fit_pack, pack_features
from dspark.modeling.backbone import training_block_mask, training_mask_mod
from dspark.objectives import LocalReducer, build_objective
from dspark.target.capture import OnlineTargetCapture

G = 7


def conversations(n=4, seed=0, vocab=300):
    """Chat-like rows: a prompt (loss 0), an answer (loss 1), some with a gap, lengths 9..16."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        L = int(torch.randint(9, 17, (1,), generator=gen))
        ids = torch.randint(0, vocab, (L,), generator=gen).tolist()
        lm = [0] * 3 + [1] * (L - 3)
        if i % 3 == 1:  # loss on the first tokens too: only the document rule ends blocks here
            lm = [1] * L
        if i % 2:
            lm[L - 4] = 0  # a gap inside the answer
        rows.append({"input_ids": ids, "loss_mask": lm})
    return rows


def packed_batch(rows_of_convs, capacity=None):
    collate = PadCollator(pad_token_id=0)
    return collate([pack_features(r, capacity) for r in rows_of_convs])


def alone_batch(conv):
    return PadCollator(pad_token_id=0)([conv])


# ---------------------------------------------------------------------------- packing


def naive_first_fit(lengths, capacity, order):
    rows, room = [], []
    for i in order:
        need = min(lengths[i], capacity)
        for r, free in enumerate(room):
            if free >= need:
                rows[r].append(i)
                room[r] -= need
                break
        else:
            rows.append([i])
            room.append(capacity - need)
    return rows


def test_first_fit_pack_matches_naive_first_fit():
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 60, (300,), generator=gen).tolist() + [80, 100]  # 2 over capacity
    cap = 64
    rows = first_fit_pack(lengths, cap, seed=7)
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(7)).tolist()
    assert rows == naive_first_fit(lengths, cap, order)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(min(lengths[i], cap) for i in r) <= cap for r in rows)
    assert first_fit_pack(lengths, cap, seed=7) == rows  # deterministic given the seed
    assert first_fit_pack(lengths, cap, seed=8) != rows
    # first-fit packs far tighter than one conversation per row
    assert len(rows) < 0.6 * len(lengths)
    with pytest.raises(ValueError, match="max_length"):
        first_fit_pack(lengths, 0)


def test_packed_dataset_and_collator():
    convs = conversations(6)
    ds = PackedDataset(convs, max_length=32, seed=0)
    assert ds.num_documents == 6 and len(ds) < 6
    batch = PadCollator(pad_token_id=5)([ds[i] for i in range(len(ds))])
    B, S = batch["input_ids"].shape
    seen = []
    for b, row in enumerate(ds.rows):
        start = 0
        for d, j in enumerate(row):
            n = len(convs[j]["input_ids"])
            sl = slice(start, start + n)
            assert batch["input_ids"][b, sl].tolist() == convs[j]["input_ids"]
            assert batch["loss_mask"][b, sl].tolist() == convs[j]["loss_mask"]
            assert batch["document_ids"][b, sl].tolist() == [d] * n
            assert batch["position_ids"][b, sl].tolist() == list(range(n))
            seen.append(j)
            start += n
        assert batch["attention_mask"][b].tolist() == [1] * start + [0] * (S - start)
        assert batch["document_ids"][b, start:].tolist() == [-1] * (S - start)
        assert batch["position_ids"][b, start:].tolist() == [0] * (S - start)
        assert batch["input_ids"][b, start:].tolist() == [5] * (S - start)
    assert sorted(seen) == list(range(6))
    # unpacked rows keep the old batch keys
    assert set(PadCollator(0)(convs[:2])) == {"input_ids", "attention_mask", "loss_mask"}


# ---------------------------------------------------------------------------- masks


def reference_mask(anchors, valid, docs, S, g):
    """Loop version of the packed block mask: ctx key j < p in p's document, own block."""
    B, N = anchors.shape
    m = torch.zeros(B, 1, N * g, S + N * g, dtype=torch.bool)
    for b in range(B):
        for n in range(N):
            p = int(anchors[b, n])
            for q in range(n * g, n * g + g):
                m[b, 0, q, S + n * g : S + n * g + g] = True
                if valid[b, n]:
                    for j in range(p):
                        m[b, 0, q, j] = bool(docs[b, j] == docs[b, p])
    return m


def test_document_block_masks_sdpa_and_flex():
    from torch.nn.attention.flex_attention import create_mask

    S, g = 12, 3
    docs = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 7 + [1] * 3 + [-1] * 2])
    anchors = torch.tensor([[1, 5, 7, 10], [6, 8, 0, 0]])
    valid = torch.tensor([[True, True, True, True], [True, True, False, False]])
    dense = training_block_mask(anchors, valid, S, g, docs)
    assert torch.equal(dense, reference_mask(anchors, valid, docs, S, g))
    # no leak: block at p=5 (doc 1's first token) sees no context at all
    assert not dense[0, 0, 3:6, :S].any()
    mod = training_mask_mod(anchors, valid, S, g, docs)
    flex = create_mask(mod, 2, None, anchors.shape[1] * g, S + anchors.shape[1] * g, "cpu")
    assert torch.equal(flex.bool(), dense)
    # without documents: the old mask (context < p) on both paths
    plain = training_block_mask(anchors, valid, S, g)
    assert plain[0, 0, 3, :5].all() and not torch.equal(plain, dense)
    mod0 = training_mask_mod(anchors, valid, S, g)
    flex0 = create_mask(mod0, 2, None, anchors.shape[1] * g, S + anchors.shape[1] * g, "cpu")
    assert torch.equal(flex0.bool(), plain)


# ---------------------------------------------------------------------------- target side


def test_target_features_packed_equal_alone(tiny_target, arch):
    target, tok = tiny_target(arch)
    capture = OnlineTargetCapture(target, [0, 1])
    convs = conversations(5)
    rows = [convs[:3], convs[3:]]
    batch = packed_batch(rows)
    feats = capture(batch)
    for b, row in enumerate(rows):
        start = 0
        for conv in row:
            n = len(conv["input_ids"])
            alone = capture(alone_batch(conv))
            sl = slice(start, start + n)
            torch.testing.assert_close(feats.tapped[b, sl], alone.tapped[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                feats.final_hidden[b, sl], alone.final_hidden[0], rtol=1e-5, atol=1e-5
            )
            start += n
    # the check can fail: the same row without per-document positions leaks across documents
    leaky = {k: v for k, v in batch.items() if k != "position_ids"}
    n0 = len(rows[0][0]["input_ids"])
    assert not torch.allclose(
        capture(leaky).tapped[0, n0 : n0 + 3], feats.tapped[0, n0 : n0 + 3], atol=1e-3
    )


# ---------------------------------------------------------------------------- draft + loss


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_document_mask_leaks_nothing(tiny_target, arch, backend):
    """Changing document A's tokens leaves document B's features and draft outputs unchanged."""
    target, tok = tiny_target(arch)
    draft = make_draft(target, tok).eval()
    draft.attn_backend = backend
    capture = OnlineTargetCapture(target, draft.config.target_layer_ids)
    a, b = conversations(2, seed=4)
    batch = packed_batch([[a, b]])
    na, nb = len(a["input_ids"]), len(b["input_ids"])
    a2 = {**a, "input_ids": [(t + 11) % 300 for t in a["input_ids"]]}
    batch2 = packed_batch([[a2, b]])
    # every valid anchor of both documents (A's anchors change, B's must not)
    anchors = torch.arange(na + nb - 1)[None]
    with torch.no_grad():
        f1, f2 = capture(batch), capture(batch2)
        sl_b = slice(na, na + nb)
        torch.testing.assert_close(f2.tapped[0, sl_b], f1.tapped[0, sl_b], rtol=0, atol=1e-6)
        kw = {"document_ids": batch["document_ids"], "position_ids": batch["position_ids"]}
        h1 = draft.forward_blocks(f1.tapped, batch["input_ids"], anchors, None, **kw)
        h2 = draft.forward_blocks(f2.tapped, batch2["input_ids"], anchors, None, **kw)
    torch.testing.assert_close(h2[0, na:], h1[0, na:], rtol=0, atol=1e-6)
    assert not torch.allclose(h2[0, 1:na], h1[0, 1:na], atol=1e-3)  # A's own blocks do change


def _assert_metrics_equal(got, want):
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_packed_loss_terms_equal_alone(tiny_target, arch, backend):
    """Per-conversation CE / L1 / confidence sums and counts of a packed batch == alone.

    All valid anchors are used (num_anchors > sequence length: no sampling). A conversation's
    terms inside the packed batch are read by clearing the loss mask of the other documents
    (the features do not depend on the loss mask, so this isolates its terms in context).
    """
    target, tok = tiny_target(arch)
    draft = make_draft(target, tok)
    draft.attn_backend = backend
    obj = build_objective("dspark", target, draft.config, num_anchors=256)
    convs = conversations(5, seed=1)
    rows = [convs[:2], convs[2:]]
    batch = packed_batch(rows)
    run = obj.evaluate  # no grad: flex attention has no CPU backward
    # the whole packed batch == the same conversations unpacked (padded)
    _assert_metrics_equal(run(draft, batch), run(draft, PadCollator(0)(convs)))
    if backend == "sdpa":  # and the training loss with its gradient path
        loss_p, _ = obj.step(draft, batch, LocalReducer())
        loss_u, _ = obj.step(draft, PadCollator(0)(convs), LocalReducer())
        torch.testing.assert_close(loss_p, loss_u, rtol=1e-5, atol=1e-6)
    # each conversation in its packed row == the conversation alone
    for b, row in enumerate(rows):
        for d, conv in enumerate(row):
            only = dict(batch)
            only["loss_mask"] = batch["loss_mask"] * (batch["document_ids"] == d)
            only["loss_mask"][1 - b] = 0
            m_alone = run(draft, alone_batch(conv))
            assert m_alone["supervised_tokens"] > 0
            _assert_metrics_equal(run(draft, only), m_alone)


def test_document_anchor_budget():
    """num_anchors per conversation: each document gets min(budget, its valid anchors), drawn
    uniformly inside the document, never across a document end."""
    from dspark.losses import valid_anchor_mask
    from dspark.objectives.documents import document_starts, sample_document_anchors

    convs = conversations(5, seed=2)
    batch = packed_batch([convs[:3], convs[3:]])
    lm = batch["loss_mask"].bool() & ~document_starts(batch)
    docs = batch["document_ids"]
    ok = valid_anchor_mask(lm)
    hits = torch.zeros_like(ok, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        pos, valid = sample_document_anchors(lm, docs, 3, gen)
        for b in range(2):
            chosen = pos[b][valid[b]].tolist()
            assert chosen == sorted(set(chosen)) and all(ok[b, p] for p in chosen)
            assert pos[b][~valid[b]].eq(0).all()
            for d in range(int(docs[b].max()) + 1):
                n_valid = int((ok[b] & (docs[b] == d)).sum())
                assert sum(int(docs[b, p]) == d for p in chosen) == min(3, n_valid)
            hits[b, chosen] += 1
    # uniform inside a document: every valid position drawn with frequency 3 / n_valid
    for b in range(2):
        for d in range(int(docs[b].max()) + 1):
            sel = ok[b] & (docs[b] == d)
            n_valid = int(sel.sum())
            if n_valid > 3:
                freq = hits[b][sel].float() / 300
                assert (freq - 3 / n_valid).abs().max() < 0.12
    # a budget above every document's count takes all valid anchors, no randomness
    pos, valid = sample_document_anchors(lm, docs, 100, gen)
    for b in range(2):
        assert pos[b][valid[b]].tolist() == ok[b].nonzero().flatten().tolist()


def test_row_lengths_of_hf_dataset_views():
    import datasets

    from dspark.data.packing import row_lengths

    convs = conversations(8)
    ds = datasets.Dataset.from_list(convs)
    want = [len(c["input_ids"]) for c in convs]
    assert row_lengths(ds) == want == row_lengths(convs)
    split = ds.train_test_split(test_size=3, seed=0)
    for part in split.values():
        assert row_lengths(part) == [len(x) for x in part["input_ids"]]
    packed = PackedDataset(split["train"], max_length=40, seed=1)
    assert sorted(len(packed[i]["input_ids"]) for i in range(len(packed))) == sorted(
        sum(row_lengths(split["train"])[j] for j in r) for r in packed.rows
    )


def test_debug_run_trains_on_packed_rows(tmp_path):
    """`data.packing=true` end to end through the one loop: packed loaders, finite losses."""
    import datasets
    from helpers import debug_cfg

    from dspark.training.build import make_loader
    from dspark.training.loop import run

    data = tmp_path / "tokenized"
    datasets.Dataset.from_list(conversations(24, seed=5)).save_to_disk(str(data))
    cfg = debug_cfg(
        tmp_path / "run",
        data,
        "data.packing=true",
        "data.max_length=40",
        "data.batch_size=2",
        "data.eval_fraction=0.2",
        "trainer.max_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.save_every=0",
    )
    tok = SimpleNamespace(pad_token_id=0)
    loader = make_loader(datasets.load_from_disk(str(data)), tok, cfg, shuffle=False)
    batch = next(iter(loader))
    assert {"document_ids", "position_ids"} <= set(batch) and batch["input_ids"].shape[1] <= 40
    assert len(loader.dataset) < 24  # several conversations per row
    res = run(cfg)
    assert res["steps"] == 3 and res["conditions"]["packing"] is True
    assert torch.isfinite(torch.tensor(res["last_train"]["train/loss"]))
    assert res["final_eval"]["eval/supervised_tokens"] > 0
    assert "packed rows/device" in (tmp_path / "run" / "report.md").read_text()


def test_padding_stats_by_hand():
    from dspark.data.packing import padding_stats

    lengths = [3, 5, 2, 6, 12]  # the 12 is truncated to max_length 8
    s = padding_stats(lengths, batch_size=5, max_length=8, packing=False)
    assert (s["real_tokens"], s["batch_tokens"]) == (24, 40)  # one batch of 5 rows x 8
    assert s["pad_share"] == pytest.approx(16 / 40) and s["rows"] == 5
    p = padding_stats(lengths, batch_size=5, max_length=8, packing=True, seed=3)
    rows = [sum(min(lengths[i], 8) for i in r) for r in first_fit_pack(lengths, 8, seed=3)]
    assert p["rows"] == len(rows) < 5 and p["real_tokens"] == 24
    assert p["pad_share"] == pytest.approx(1 - 24 / (len(rows) * max(rows)))
    assert p["pad_share"] < s["pad_share"]
