"""Offline feature cache: same losses as online capture, byte-identical resume, refusals, sizes."""

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from helpers import make_draft, make_rows, save_rows

from dspark.data.collate import PadCollator
from dspark.data.features import feature_cache as fc
from dspark.data.features import q8_0
from dspark.data.features.feature_dataset import ROW_COLUMN, CachedFeatureDataset, FeatureCache
from dspark.objectives import DSparkObjective
from dspark.target.capture import BatchFeatures, OnlineTargetCapture

# The stated tolerance of a bf16 cache: bf16 keeps 8 significand bits (<= 2^-9 relative
# rounding per feature); on the tiny targets the losses move by at most ~6e-5 relative
# (measured over 24 rows x 3 archs), so 1e-3 leaves margin. fp32 caches match to 1e-5.
BF16_LOSS_RTOL = 1e-3
FP32_LOSS_RTOL = 1e-5
# A q8_0 cache keeps each value to 1/254 of its block's largest (32 values); on the tiny
# targets the losses move by at most ~3e-4 relative (measured over 9 batches x 3 archs).
Q8_0_LOSS_RTOL = 3e-3


def cached_batches(data_dir, cache_dir, pad_id, batch_size=4):
    from datasets import load_from_disk

    ds = load_from_disk(str(data_dir))
    ds = ds.add_column(ROW_COLUMN, list(range(len(ds))))
    wrapped = CachedFeatureDataset(ds, FeatureCache(cache_dir))
    collate = PadCollator(pad_id)
    return [
        collate([wrapped[i] for i in range(s, min(s + batch_size, len(wrapped)))])
        for s in range(0, len(wrapped), batch_size)
    ]


def test_cached_features_give_the_online_losses(arch, tiny_sets):
    target, tok, data, caches = tiny_sets(arch)
    draft = make_draft(target, tok, block_size=4, num_anchors=6)
    online = DSparkObjective(target, draft.config)
    offline = DSparkObjective(target, draft.config, feature_source=BatchFeatures())
    assert FeatureCache(caches["fp32"]).manifest["num_shards"] > 2  # resume test needs several
    by_name = {name: cached_batches(data, path, tok.pad_token_id) for name, path in caches.items()}
    capture = OnlineTargetCapture(target, draft.config.target_layer_ids)
    assert by_name["bf16"][0]["tapped"].dtype == torch.bfloat16  # stored and served as bf16
    assert by_name["q8_0"][0]["tapped"].dtype == torch.bfloat16  # int8 stored, bf16 served
    for b, batch in enumerate(by_name["fp32"]):
        # Writer batches (3 rows, other padding) differ from these (4 rows): features still agree.
        ref = capture(batch)
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(batch["tapped"][real], ref.tapped[real], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            batch["final_hidden"][real], ref.final_hidden[real], rtol=1e-5, atol=1e-5
        )
        want = online.evaluate(draft, batch)
        for name, tol in (("fp32", FP32_LOSS_RTOL), ("bf16", BF16_LOSS_RTOL)):
            got = offline.evaluate(draft, by_name[name][b])
            for key in ("loss", "ce", "l1", "tau_probabilistic"):
                assert got[key] == pytest.approx(want[key], rel=tol, abs=1e-6), (name, b, key)
        got = offline.evaluate(draft, by_name["q8_0"][b])
        for key in ("loss", "ce", "l1", "tau_probabilistic"):
            assert got[key] == pytest.approx(want[key], rel=Q8_0_LOSS_RTOL, abs=1e-6), (b, key)
        # what a q8_0 cache holds is the bf16 cache's vectors in ggml's Q8_0 blocks
        for key in ("tapped", "final_hidden"):
            bf16 = by_name["bf16"][b][key][real]
            torch.testing.assert_close(
                by_name["q8_0"][b][key][real], q8_0.dequantize(*q8_0.quantize(bf16)), rtol=0, atol=0
            )
        # positions=loss stores less but the objective reads nothing it dropped: same losses.
        all_pos = offline.evaluate(draft, by_name["bf16"][b])
        loss_pos = offline.evaluate(draft, by_name["bf16_loss"][b])
        for key in ("loss", "ce", "l1", "confidence_bce", "supervised_tokens"):
            assert loss_pos[key] == pytest.approx(all_pos[key], rel=1e-6, abs=1e-7), (b, key)
    # ... and it did drop something: fewer stored tokens than the bf16 all-positions cache.
    small, big = FeatureCache(caches["bf16_loss"]), FeatureCache(caches["bf16"])
    assert sum(s["tapped_tokens"] for s in small.shards) < sum(
        s["tapped_tokens"] for s in big.shards
    )
    assert sum(s["final_tokens"] for s in small.shards) < sum(s["final_tokens"] for s in big.shards)


def test_cached_features_give_the_online_gradients(tiny_sets):
    target, tok, data, caches = tiny_sets("qwen3")
    batch = cached_batches(data, caches["fp32"], tok.pad_token_id)[0]
    grads = []
    for source in (None, BatchFeatures()):
        draft = make_draft(target, tok, block_size=4, num_anchors=6)
        obj = DSparkObjective(target, draft.config, feature_source=source, seed=3)
        loss, _ = obj.step(draft, batch)
        loss.backward()
        grads.append(
            torch.cat([p.grad.flatten() for p in draft.parameters() if p.grad is not None])
        )
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_killed_writer_resumes_to_byte_identical_shards(tmp_path, tiny_sets, monkeypatch):
    target, tok, data, _ = tiny_sets("llama")
    kw = dict(
        layer_ids=[0, 2],
        target_name="tiny-llama",
        pad_token_id=tok.pad_token_id,
        batch_size=2,
        shard_mb=0.02,
        progress=False,
    )
    whole = fc.write_cache(target, data, tmp_path / "whole", **kw)
    assert whole["num_shards"] >= 3 and whole["complete"]
    first_shard_rows = whole["plan"][0][1] - whole["plan"][0][0]
    assert first_shard_rows >= 2  # the kill below lands inside shard 1, after its first batch

    real_call, calls = OnlineTargetCapture.__call__, [0]
    batches_in_shard0 = -(-first_shard_rows // 2)

    class Killed(RuntimeError):
        pass

    def dying(self, batch):
        calls[0] += 1
        if calls[0] == batches_in_shard0 + 2:  # the second batch of shard 1
            raise Killed
        return real_call(self, batch)

    monkeypatch.setattr(OnlineTargetCapture, "__call__", dying)
    with pytest.raises(Killed):
        fc.write_cache(target, data, tmp_path / "split", **kw)
    monkeypatch.setattr(OnlineTargetCapture, "__call__", real_call)
    partial = fc.read_manifest(tmp_path / "split")
    assert [s["file"] for s in partial["shards"]] == ["shard_00000.safetensors"]
    assert not partial["complete"]
    with pytest.raises(fc.FeatureCacheError, match="unfinished"):
        FeatureCache(tmp_path / "split")
    shard0 = tmp_path / "split" / "shard_00000.safetensors"
    before = (shard0.stat().st_ino, shard0.stat().st_mtime_ns)
    (tmp_path / "split" / ".shard_00001.safetensors.tmp").write_bytes(b"half a shard")

    split = fc.write_cache(target, data, tmp_path / "split", **kw)
    assert (shard0.stat().st_ino, shard0.stat().st_mtime_ns) == before  # never rewritten
    assert split["shards"] == whole["shards"]  # same sha256 per shard
    for s in whole["shards"]:
        a = (tmp_path / "whole" / s["file"]).read_bytes()
        assert a == (tmp_path / "split" / s["file"]).read_bytes(), s["file"]
    assert not list((tmp_path / "split").glob(".shard_*"))
    # Resuming with other settings is refused, naming what differs.
    with pytest.raises(fc.FeatureCacheError, match="dtype"):
        fc.write_cache(target, data, tmp_path / "split", **kw, dtype="fp32")


def test_a_grown_set_links_the_shards_of_its_first_rows(tmp_path, tiny_target, monkeypatch, capsys):
    target, tok = tiny_target("llama")
    rows = make_rows(target.config.vocab_size, n=16, seed=3)
    first = {k: v[:10] for k, v in rows.items()}
    small, big = save_rows(first, tmp_path / "small"), save_rows(rows, tmp_path / "big")
    kw = dict(layer_ids=[0, 2], target_name="tiny-llama", pad_token_id=tok.pad_token_id,
              batch_size=2, shard_mb=0.02, progress=False)  # fmt: skip
    fresh = fc.write_cache(target, big, tmp_path / "fresh", **kw)
    old = fc.write_cache(target, small, tmp_path / "old", **kw)
    shared = [s for s in old["shards"] if s["rows"] in fresh["plan"]]
    assert 2 <= len(shared) < old["num_shards"]  # the old last shard ends where the set did

    real_call, forwards = OnlineTargetCapture.__call__, [0]

    def counted(self, batch):
        forwards[0] += int(batch["input_ids"].shape[0])
        return real_call(self, batch)

    monkeypatch.setattr(OnlineTargetCapture, "__call__", counted)
    grown = fc.write_cache(target, big, tmp_path / "grown", **kw, reuse_from=[tmp_path / "old"])
    assert grown["shards"] == fresh["shards"]  # same bytes, same rows hashes
    linked_rows = sum(s["rows"][1] - s["rows"][0] for s in shared)
    assert forwards[0] == 16 - linked_rows  # only the rows past the shared shards ran
    for s in shared:  # a hard link: the two caches share the file
        a, b = tmp_path / "old" / s["file"], tmp_path / "grown" / s["file"]
        assert a.stat().st_ino == b.stat().st_ino
    assert f"{len(shared)} of {grown['num_shards']} shards linked" in capsys.readouterr().out

    # A row changed inside the first shard: that shard is computed, the others still linked.
    changed = {k: [list(r) for r in v] if k != "index" else list(v) for k, v in rows.items()}
    changed["input_ids"][0][-1] = (changed["input_ids"][0][-1] + 1) % target.config.vocab_size
    other = save_rows(changed, tmp_path / "changed")
    forwards[0] = 0
    m = fc.write_cache(target, other, tmp_path / "other", **kw, reuse_from=[tmp_path / "old"])
    first_rows = m["plan"][0][1]
    assert forwards[0] == 16 - linked_rows + first_rows
    assert m["shards"][0]["sha256"] != fresh["shards"][0]["sha256"]
    assert m["shards"][1:] == fresh["shards"][1:]

    # An altered file in the other cache is not linked; a cache made otherwise offers nothing.
    (tmp_path / "old" / shared[0]["file"]).unlink()
    (tmp_path / "old" / shared[0]["file"]).write_bytes(b"not the shard")
    fp32 = fc.write_cache(target, small, tmp_path / "fp32", **{**kw, "dtype": "fp32"})
    assert fp32["complete"]
    forwards[0] = 0
    again = fc.write_cache(
        target, big, tmp_path / "again", **kw, reuse_from=[tmp_path / "old", tmp_path / "fp32"]
    )
    assert again["shards"] == fresh["shards"]
    assert forwards[0] == 16 - linked_rows + shared[0]["rows"][1] - shared[0]["rows"][0]
    assert "made with other settings (dtype)" in capsys.readouterr().out


def test_a_cache_for_another_target_layer_set_or_data_is_refused(tmp_path, tiny_sets, tiny_target):
    target, tok, data, caches = tiny_sets("qwen3")
    cache = FeatureCache(caches["bf16"])
    ids = cache.layer_ids
    cache.validate(target_identity=fc.target_identity(target), layer_ids=ids, data_dir=data)
    other, _ = tiny_target("qwen2")
    with pytest.raises(fc.FeatureCacheError, match="made for target 'tiny-qwen3'"):
        cache.validate(target_identity=fc.target_identity(other))
    # Same architecture, other weights: the probe tells them apart; fp16/bf16 loads match.
    ident = fc.target_identity(target)
    bf16 = {**ident, "probe": [float(torch.tensor(v).bfloat16()) for v in ident["probe"]]}
    cache.validate(target_identity=bf16)
    moved = {**ident, "probe": [v * 1.1 + 0.01 for v in ident["probe"]]}
    with pytest.raises(fc.FeatureCacheError, match="config or weights differ"):
        cache.validate(target_identity=moved)
    with pytest.raises(fc.FeatureCacheError, match="draft taps"):
        cache.validate(layer_ids=ids[:-1])
    rows = make_rows(target.config.vocab_size, seed=1)
    other_data = save_rows(rows, tmp_path / "other")
    with pytest.raises(fc.FeatureCacheError, match="another tokenized set"):
        cache.validate(data_dir=other_data)
    with pytest.raises(fc.FeatureCacheError, match="not a feature cache"):
        FeatureCache(tmp_path)


def test_estimator_matches_the_bytes_written_and_checks_the_disk(tmp_path, tiny_sets, monkeypatch):
    target, tok, data, caches = tiny_sets("qwen2")
    H, L = target.config.hidden_size, len(fc.resolve_layer_ids(target.config.num_hidden_layers))
    for name, itemsize in (("fp32", 4), ("bf16", 2), ("bf16_loss", 2), ("q8_0", 34 / 32)):
        m = fc.read_manifest(caches[name])
        est = m["estimate"]
        assert est["bytes_per_token_all_positions"] == (L + 1) * H * itemsize + 4  # by hand
        payload = 0
        for s in m["shards"]:  # safetensors: 8-byte header length, header, then the tensors
            raw = (caches[name] / s["file"]).read_bytes()
            payload += len(raw) - 8 - struct.unpack("<Q", raw[:8])[0]
        # + one extra int64 in each of the two offset arrays per shard
        assert payload == est["total_bytes"] + 16 * m["num_shards"], name
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: type("U", (), {"free": 1000})())
    with pytest.raises(fc.FeatureCacheError, match="not enough disk"):
        fc.write_cache(
            target,
            data,
            tmp_path / "full",
            layer_ids=[0],
            target_name="t",
            pad_token_id=tok.pad_token_id,
            progress=False,
        )
    assert not (tmp_path / "full").exists()  # refused before anything was written


def test_estimate_from_a_config_alone_qwen3_8b(capsys):
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "data_scripts" / "cache_features.py"
    spec = importlib.util.spec_from_file_location("cache_features", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = json.dumps({"hidden_size": 4096, "num_hidden_layers": 36})
    assert mod.main(["--target-config", cfg, "--json"]) == 0
    out = capsys.readouterr().out
    est = json.loads(out[out.index("{") :])
    assert est["layer_ids"] == [1, 9, 17, 25, 33]
    assert est["bytes_per_token_all_positions"] == 6 * 4096 * 2 + 4  # 49,156 B/token in bf16


def run_cfg(out, data_dir, *overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dspark.training.schema import check, register_configs

    GlobalHydra.instance().clear()
    register_configs()
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(str(conf), version_base=None):
        cfg = compose(
            "config",
            overrides=[
                "recipe=debug",
                f"trainer.output_dir={out}",
                f"data.train={data_dir}",
                *overrides,
            ],
        )
    check(cfg)
    return cfg


def test_training_on_a_cache_runs_no_target_forward_and_matches_online(
    tmp_path, tiny_sets, monkeypatch
):
    from dspark.training import loop

    target, tok, data, caches = tiny_sets("qwen3")  # the debug recipe's target
    _, _, llama_data, llama_caches = tiny_sets("llama")
    common = (
        "trainer.max_steps=4",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "data.eval_fraction=0.2",
    )
    online = loop.run(run_cfg(tmp_path / "online", data, *common))

    def no_forward(self, batch):
        raise AssertionError("the target ran although data.features is set")

    monkeypatch.setattr(OnlineTargetCapture, "__call__", no_forward)
    cached = loop.run(
        run_cfg(tmp_path / "cached", data, *common, f"data.features={caches['fp32']}")
    )
    assert cached["conditions"]["features"] == str(caches["fp32"])

    def losses(out):
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}

    want, got = losses(tmp_path / "online"), losses(tmp_path / "cached")
    assert sorted(got) == [1, 2, 3, 4]
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-4), (s, got, want)
    assert cached["final_eval"]["eval/loss"] == pytest.approx(
        online["final_eval"]["eval/loss"], rel=1e-4
    )

    # A cache of another target's features is refused before any training.
    with pytest.raises(fc.FeatureCacheError, match="made for target 'tiny-llama'"):
        loop.run(run_cfg(tmp_path / "wrong", llama_data, f"data.features={llama_caches['bf16']}"))


def test_run_config_checks_the_feature_keys(tmp_path):
    with pytest.raises(ValueError, match="data.eval_features to a cache of data.eval"):
        run_cfg(tmp_path, "d", "data.features=f", "data.eval=e")
    with pytest.raises(ValueError, match="data.eval_features is the feature cache of data.eval"):
        run_cfg(tmp_path, "d", "data.eval_features=f")
    run_cfg(tmp_path, "d", "data.features=f", "data.eval=e", "data.eval_features=g")
