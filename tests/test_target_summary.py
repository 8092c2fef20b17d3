"""A reduced-vocabulary step from the target's logits at the kept ids: the per-position
logsumexp / argmax of its logits over all V (`capture.target_summary`), computed once beside a
feature cache, give the same loss terms, metrics and gradients as the `[M, V]` logits."""

import copy
import json

import pytest
import torch
from helpers import reduced_draft
from test_feature_cache import cached_batches, run_cfg

from dspark import losses as L
from dspark.data.collate import PadCollator
from dspark.data.features.cache_progress import cache_cost
from dspark.data.features.feature_dataset import (
    ROW_COLUMN,
    CachedFeatureDataset,
    FeatureCache,
    summarize_rows,
)
from dspark.data.features.feature_layout import stored_positions
from dspark.objectives import DSparkObjective
from dspark.objectives import dspark as dspark_objective
from dspark.target.capture import BatchFeatures, target_summary


def test_normalised_l1_and_argmax_match_equal_the_full_vocabulary_terms():
    g = torch.Generator().manual_seed(0)
    V, K, M = 300, 40, 25
    kept = torch.randperm(V, generator=g)[:K].sort().values
    z = torch.randn(M, V, generator=g) * 3
    z[:5, kept[:5]] += 10  # some slots whose target argmax the draft vocabulary holds
    draft = torch.randn(M, K, generator=g)
    draft[:10] += z[:10, kept]  # drafts near the target: some argmax matches, some not
    draft.requires_grad_(True)
    want = L.slot_l1(draft, z, kept)
    got = L.slot_l1_normalised(draft, z[:, kept], torch.logsumexp(z, -1))
    # both against float64 by hand; the full path subtracts two sums near 1 (p_t over V and
    # over the kept ids), this one computes the outside mass as 1 - sum_kept p_t
    p_t64 = torch.softmax(z.double(), -1)
    p_d64 = torch.softmax(draft.detach().double(), -1)
    ref = (p_d64 - p_t64[:, kept]).abs().sum(-1) + (1 - p_t64[:, kept].sum(-1))
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=3e-6)  # fp32 sums near 1
    torch.testing.assert_close(want.double(), ref, rtol=0, atol=3e-6)
    (gw,) = torch.autograd.grad(want.sum(), draft)
    (gg,) = torch.autograd.grad(got.sum(), draft)
    torch.testing.assert_close(gg, gw, rtol=1e-5, atol=1e-6)
    match = L.greedy_match_argmax(draft, z.argmax(-1), kept)
    assert torch.equal(match, L.greedy_match(draft, z, kept))
    assert 0 < match.sum() < M  # both outcomes compared
    assert torch.equal(match, (kept[draft.argmax(-1)] == z.argmax(-1)).float())  # by hand
    assert torch.equal(L.greedy_match_argmax(z, z.argmax(-1)), torch.ones(M))


def summarized_batches(data, cache_dir, target, pad_id, batch_size=4):
    from datasets import load_from_disk

    ds = load_from_disk(str(data))
    ds = ds.add_column(ROW_COLUMN, list(range(len(ds))))
    cache = FeatureCache(cache_dir)
    head = target.get_output_embeddings()
    sums = summarize_rows(
        ds, cache, lambda h: target_summary(head, h), batch_positions=7, progress=False
    )
    wrapped = CachedFeatureDataset(ds, cache, sums)
    collate = PadCollator(pad_id)
    batches = [
        collate([wrapped[i] for i in range(s, min(s + batch_size, len(wrapped)))])
        for s in range(0, len(wrapped), batch_size)
    ]
    return ds, cache, sums, batches


def test_summaries_are_the_heads_logsumexp_and_argmax_at_the_readable_positions(tiny_sets):
    target, tok, data, caches = tiny_sets("llama")
    ds, cache, sums, batches = summarized_batches(data, caches["bf16"], target, tok.pad_token_id)
    head = target.get_output_embeddings().weight.float()
    assert sorted(sums) == list(range(len(ds)))
    for row in range(len(ds)):
        lse, top = sums[row]
        mask = ds[row]["loss_mask"]
        pos = stored_positions(mask, "loss")[1]
        assert len(lse) == len(mask) and lse.dtype == torch.float32 and top.dtype == torch.long
        z = cache.final_row(row).float()[pos] @ head.T  # by hand, from the stored vectors
        torch.testing.assert_close(lse[pos], torch.logsumexp(z, -1), rtol=1e-5, atol=1e-5)
        assert torch.equal(top[pos], z.argmax(-1))
        rest = torch.ones(len(mask), dtype=torch.bool)
        rest[pos] = False
        assert rest.any() and not lse[rest].any() and not top[rest].any()
    b = batches[0]
    assert b["final_logsumexp"].shape == b["input_ids"].shape
    assert b["final_argmax"].dtype == torch.long


@pytest.mark.parametrize("cache", ["fp32", "bf16_loss"])
def test_a_summarized_step_equals_the_full_vocabulary_step(tiny_sets, monkeypatch, cache):
    target, tok, data, caches = tiny_sets("qwen3")
    _, _, _, with_sums = summarized_batches(data, caches[cache], target, tok.pad_token_id)
    plain = cached_batches(data, caches[cache], tok.pad_token_id)
    kept = torch.arange(0, target.config.vocab_size, 2)  # half the ids, so some lie outside
    keys = ("loss", "ce", "l1", "confidence_bce", "tau_probabilistic", "tau_greedy")
    for b, (batch, ref_batch) in enumerate(zip(with_sums, plain, strict=True)):
        assert "final_logsumexp" not in ref_batch
        grads, metrics = [], []
        for inp in (ref_batch, batch):
            draft = reduced_draft(target, tok, kept, block_size=4, num_anchors=6)
            obj = DSparkObjective(target, draft.config, feature_source=BatchFeatures(), seed=3)
            loss, m = obj.step(draft, inp)
            loss.backward()
            grads.append(
                torch.cat([p.grad.flatten() for p in draft.parameters() if p.grad is not None])
            )
            metrics.append(m)
        for key in keys:
            assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-6), (b, key)
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)

    # the summarized step never forms the [M, V] target logits
    def no_full_head(*a, **k):
        raise AssertionError("the full target head ran")

    monkeypatch.setattr(dspark_objective, "target_logits", no_full_head)
    draft = reduced_draft(target, tok, kept, block_size=4, num_anchors=6)
    obj = DSparkObjective(target, draft.config, feature_source=BatchFeatures())
    obj.evaluate(draft, with_sums[0])
    with pytest.raises(AssertionError, match="full target head"):
        obj.evaluate(draft, plain[0])


def test_a_reduced_run_on_a_cache_trains_on_summaries_as_on_full_logits(
    tmp_path, tiny_sets, monkeypatch
):
    from dspark.training import build, loop

    target, tok, data, caches = tiny_sets("qwen3")  # the debug recipe's target
    common = (
        "trainer.max_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "data.eval_fraction=0.2",
        "draft.vocab_size=40",
        f"data.features={caches['fp32']}",
    )
    made = []
    real = build.cache_summaries

    def counting(*a, **k):
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(build, "cache_summaries", counting)
    summarized = loop.run(run_cfg(tmp_path / "sums", data, *common))
    assert len(made) == 1 and all(len(s) > 0 for s in made[0])  # train and held-out rows
    # what the cache and the head's pass over it took (figures by hand: test_run_status.py)
    rows = json.loads((caches["fp32"] / "manifest.json").read_text())["settings"]["data_rows"]
    assert summarized["feature_cache"] == cache_cost(caches["fp32"]) and rows > 0
    assert summarized["feature_cache"]["rows"] == rows
    assert (
        f"the feature cache ({rows:,} rows) written in"
        in (tmp_path / "sums" / "report.md").read_text()
    )
    monkeypatch.setattr(build, "cache_summaries", lambda target, *splits: [None] * len(splits))
    full = loop.run(run_cfg(tmp_path / "full", data, *common))

    def losses(out):
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}

    want, got = losses(tmp_path / "full"), losses(tmp_path / "sums")
    assert sorted(got) == [1, 2, 3]
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-4), (s, got, want)
    for key in ("eval/loss", "eval/tau_greedy"):
        assert summarized["final_eval"][key] == pytest.approx(full["final_eval"][key], rel=1e-4)


def test_summaries_are_read_back_per_cache_and_head_and_only_missing_rows_computed(
    tiny_sets, tmp_path
):
    from datasets import load_from_disk

    from dspark.data.features.summary_cache import (
        head_fingerprint,
        load_or_summarize,
        shard_summary_key,
        summary_key,
        summary_path,
    )

    target, _, data, caches = tiny_sets("llama")
    ds = load_from_disk(str(data))
    ds = ds.add_column(ROW_COLUMN, list(range(len(ds))))
    cache = FeatureCache(caches["bf16"])
    head = target.get_output_embeddings()
    seen: list[int] = []  # positions each call of the head summarized

    def summarize(h):
        seen.append(h.shape[0])
        return target_summary(head, h)

    def run(rows):
        seen.clear()
        return load_or_summarize(ds.select(rows), cache, head, summarize, root=tmp_path)

    def positions(rows):
        return sum(len(stored_positions(ds[r]["loss_mask"], "loss")[1]) for r in rows)

    want = summarize_rows(ds, cache, lambda h: target_summary(head, h), progress=False)
    half = list(range(0, len(ds), 2))
    first = run(half)
    assert sum(seen) == positions(half) and sorted(first) == half
    again = run(half)
    assert seen == []  # every row read back
    more = run(list(range(len(ds))))
    assert sum(seen) == positions([r for r in range(len(ds)) if r not in half])
    for r in range(len(ds)):
        for got in (more, again) if r in half else (more,):
            assert torch.equal(got[r][0], want[r][0]) and torch.equal(got[r][1], want[r][1])
            assert got[r][1].dtype == torch.long
    paths = [
        summary_path(shard_summary_key(s, head_fingerprint(head)), tmp_path) for s in cache.shards
    ]
    assert len(paths) >= 2 and all(p.exists() for p in paths)  # one file per shard
    for p in paths:
        p.write_bytes(b"torn")  # a file that does not read back is summarized again
    run(half)
    assert sum(seen) == positions(half)
    other = copy.deepcopy(head)  # another head: other keys
    with torch.no_grad():
        other.weight[0, 0] += 1.0
    seen.clear()
    load_or_summarize(ds.select(half), cache, other, summarize, root=tmp_path)
    assert sum(seen) == positions(half)

    # The earlier layout (one file per cache, by its manifest) is read where a shard's file
    # lacks rows, and its rows are written into the shard files.
    for p in paths:
        p.unlink()
    legacy = summary_key(cache, head_fingerprint(head))
    packed = {r: (lse, top.to(torch.int32)) for r, (lse, top) in want.items() if r in half}
    torch.save({"key": legacy, "rows": packed}, summary_path(legacy, tmp_path))
    got = run(list(range(len(ds))))
    assert sum(seen) == positions([r for r in range(len(ds)) if r not in half])
    assert all(torch.equal(got[r][0], want[r][0]) for r in range(len(ds)))
    summary_path(legacy, tmp_path).unlink()
    run(list(range(len(ds))))
    assert seen == []


def test_a_grown_cache_reads_back_the_summaries_of_the_shards_it_linked(tiny_target, tmp_path):
    from helpers import make_rows, save_rows

    from dspark.data.features import feature_cache as fc
    from dspark.data.features.summary_cache import load_or_summarize

    target, tok = tiny_target("llama")
    rows = make_rows(target.config.vocab_size, n=16, seed=3)
    small = save_rows({k: v[:10] for k, v in rows.items()}, tmp_path / "small")
    big = save_rows(rows, tmp_path / "big")
    kw = dict(layer_ids=[0, 2], target_name="tiny-llama", pad_token_id=tok.pad_token_id,
              batch_size=2, shard_mb=0.02, progress=False)  # fmt: skip
    fc.write_cache(target, small, tmp_path / "old", **kw)
    m = fc.write_cache(target, big, tmp_path / "new", **kw, reuse_from=[tmp_path / "old"])
    head, seen = target.get_output_embeddings(), []

    def summarize(h):
        seen.append(h.shape[0])
        return target_summary(head, h)

    def summaries(data, cache_dir):
        from datasets import load_from_disk

        ds = load_from_disk(str(data))
        ds = ds.add_column(ROW_COLUMN, list(range(len(ds))))
        seen.clear()
        got = load_or_summarize(ds, FeatureCache(cache_dir), head, summarize, root=tmp_path)
        return got, ds

    summaries(small, tmp_path / "old")
    got, ds = summaries(big, tmp_path / "new")
    old_shards = {s["sha256"] for s in fc.read_manifest(tmp_path / "old")["shards"]}
    fresh = [s for s in m["shards"] if s["sha256"] not in old_shards]
    new_rows = [r for s in fresh for r in range(*s["rows"])]
    assert 0 < len(new_rows) < len(ds)
    assert sum(seen) == sum(len(stored_positions(ds[r]["loss_mask"], "loss")[1]) for r in new_rows)
    want = summarize_rows(ds, FeatureCache(tmp_path / "new"), summarize, progress=False)
    assert all(
        torch.equal(got[r][0], want[r][0]) and torch.equal(got[r][1], want[r][1]) for r in got
    )
