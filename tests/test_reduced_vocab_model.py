"""A reduced draft vocabulary in the model itself (`config.draft_vocab_size` K): the config
travels with the weights, `from_target` keeps the target head's rows at the kept ids, the
`d2t` / `t2d` buffers round-trip, every export layout loads back into the same reduced draft,
and a training run with `draft.vocab_size=K` counts its vocabulary and trains a reduced draft.
References are by hand: the target's own head rows, the full draft's logits at the kept
columns, supervised-token counts taken with `collections.Counter`."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from safetensors.torch import load_file, save_file

from dspark.config import DSparkConfig, choose_mask_token_id
from dspark.errors import BadInputError
from dspark.export import export_draft, load_draft
from dspark.export.reference import all_anchor_outputs
from dspark.modeling import DSparkDraftModel

ROOT = Path(__file__).resolve().parents[1]
KEPT = [300, 3, 17, 42, 5, 250]  # any order: draft ids follow increasing target ids
SORTED = sorted(KEPT)


def config_for(target, tok, **kw) -> DSparkConfig:
    return DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=1,
        markov_rank=8,
        block_size=4,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
        target_name_or_path="tiny-qwen3",
        **kw,
    )


def trained_looking(draft):
    with torch.no_grad():  # move every trainable tensor off its init (zeros would hide swaps)
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return draft.eval()


def reduced_draft(target, tok):
    cfg = config_for(target, tok, draft_vocab_size=len(KEPT))
    torch.manual_seed(0)
    return trained_looking(DSparkDraftModel.from_target(target, cfg, kept_ids=KEPT))


def sequence(tok):
    return tok("def add(a, b):\n    return a + b. The answer is 42.", return_tensors="pt")[
        "input_ids"
    ][:, :20]


# ------------------------------------------------------------------------------ config
def test_config_field_round_trips_and_is_checked(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    V = target.config.vocab_size
    cfg = config_for(target, tok, draft_vocab_size=6)
    assert cfg.draft_vocab_size == 6 and cfg.to_dict()["draft_vocab_size"] == 6
    cfg.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["draft_vocab_size"] == 6
    assert DSparkConfig.from_pretrained(tmp_path).draft_vocab_size == 6
    # K == V is the full vocabulary, spelt one way: None, and not written
    full = config_for(target, tok, draft_vocab_size=V)
    assert full.draft_vocab_size is None and "draft_vocab_size" not in full.to_dict()
    assert "draft_vocab_size" not in config_for(target, tok).to_dict()
    for bad in (0, -3, V + 1, "6", 2.5):
        with pytest.raises(ValueError, match=r"draft_vocab_size=.* must be an integer in \[1,"):
            config_for(target, tok, draft_vocab_size=bad)


# ------------------------------------------------------------------------------ model
def test_from_target_keeps_the_target_heads_rows(tiny_target):
    target, tok = tiny_target("qwen3")
    V, H = target.config.vocab_size, target.config.hidden_size
    draft = DSparkDraftModel.from_target(
        target, config_for(target, tok, draft_vocab_size=6), kept_ids=KEPT
    )
    head = target.get_output_embeddings().weight.detach()
    # by hand: draft id i scores target id SORTED[i]
    for i, t in enumerate(SORTED):
        assert torch.equal(draft.lm_head.weight[i], head[t].float()), (i, t)
    assert draft.lm_head.weight.shape == (6, H) and not draft.lm_head.weight.requires_grad
    assert draft.markov_head.markov_w2.weight.shape == (6, 8)
    assert draft.markov_head.markov_w1.weight.shape == (V, 8)  # reads target ids
    assert torch.equal(draft.embed_tokens.weight, target.get_input_embeddings().weight.float())
    assert draft.d2t.dtype == torch.long and draft.d2t.tolist() == [
        t - i for i, t in enumerate(SORTED)
    ]
    assert draft.t2d.dtype == torch.bool and draft.t2d.shape == (V,)
    assert draft.t2d.nonzero().flatten().tolist() == SORTED
    assert draft.kept_target_ids.tolist() == SORTED
    assert draft.to_target_ids(torch.tensor([[0, 5], [2, 2]])).tolist() == [[3, 300], [17, 17]]
    # the draft's head logits are the target's own at the kept columns
    h = torch.randn(3, H)
    torch.testing.assert_close(draft.lm_head(h), (h @ head.float().T)[:, SORTED])
    # a full draft: no maps, the identity
    full = DSparkDraftModel.from_target(target, config_for(target, tok))
    assert full.kept_target_ids is None and not hasattr(full, "d2t")
    assert full.to_target_ids(torch.tensor([7])).tolist() == [7]


def test_from_target_refuses_mismatched_ids(tiny_target):
    target, tok = tiny_target("qwen3")
    with pytest.raises(ValueError, match="pass kept_ids"):
        DSparkDraftModel.from_target(target, config_for(target, tok, draft_vocab_size=6))
    with pytest.raises(ValueError, match="holds 5 target ids but config.draft_vocab_size is 6"):
        DSparkDraftModel.from_target(
            target, config_for(target, tok, draft_vocab_size=6), kept_ids=KEPT[:5]
        )
    with pytest.raises(ValueError, match="repeats token ids"):
        DSparkDraftModel.from_target(
            target, config_for(target, tok, draft_vocab_size=6), kept_ids=[1, 1, 2, 3, 4, 5]
        )


def test_save_and_load_round_trip(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    draft = reduced_draft(target, tok)
    draft.save_pretrained(tmp_path / "d")
    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert saved["d2t"].dtype == torch.long and saved["t2d"].dtype == torch.bool
    back = DSparkDraftModel.from_pretrained(tmp_path / "d")
    assert back.config.draft_vocab_size == 6
    want, got = draft.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    assert not back.lm_head.weight.requires_grad
    ids = sequence(tok)
    a, b = all_anchor_outputs(draft, target, ids), all_anchor_outputs(back, target, ids)
    assert a["logits"].shape[-1] == 6 and torch.equal(a["logits"], b["logits"])
    # weights without their maps, or maps that disagree, are refused (not placeholders)
    no_maps = {k: v for k, v in saved.items() if k not in ("d2t", "t2d")}
    save_file(no_maps, str(tmp_path / "d" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(BadInputError, match="hold no d2t / t2d"):
        DSparkDraftModel.from_pretrained(tmp_path / "d")
    t2d = saved["t2d"].clone()
    t2d[1] = True
    save_file({**saved, "t2d": t2d}, str(tmp_path / "d" / "model.safetensors"))
    with pytest.raises(BadInputError, match="t2d does not mark the target ids"):
        load_draft(tmp_path / "d")


# ------------------------------------------------------------------------------ exports
@pytest.mark.parametrize("fmt", ["deepspec", "speculators"])
def test_every_layout_loads_back_the_same_reduced_draft(tiny_target, tmp_path, fmt):
    target, tok = tiny_target("qwen3")
    draft = reduced_draft(target, tok)
    out = export_draft(draft, tmp_path / fmt, fmt, dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 6
    assert json.loads((out / "export.json").read_text())["draft_vocab_size"] == 6
    s = load_file(str(out / "model.safetensors"))
    assert torch.equal(s["d2t"], draft.d2t) and torch.equal(s["t2d"], draft.t2d)
    back = load_draft(out)
    want, got = draft.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    ids = sequence(tok)
    a, b = all_anchor_outputs(draft, target, ids), all_anchor_outputs(back, target, ids)
    assert torch.equal(a["logits"], b["logits"])
    assert torch.equal(a["confidence_logits"], b["confidence_logits"])
    # --draft-vocab on a reduced draft: the same ids (any order) pass, others are refused
    again = export_draft(draft, tmp_path / "again", fmt, dtype="float32", draft_vocab=KEPT[::-1])
    assert torch.equal(load_file(str(again / "model.safetensors"))["d2t"], draft.d2t)
    with pytest.raises(BadInputError, match="already has a reduced vocabulary of 6 tokens"):
        export_draft(draft, tmp_path / "other", fmt, draft_vocab=[1, 2, 3, 4, 5, 6])
    with pytest.raises(BadInputError, match="already has a reduced vocabulary"):
        export_draft(out, tmp_path / "other2", fmt, draft_vocab=[1, 2])  # from its directory
    assert not (tmp_path / "other").exists() and not (tmp_path / "other2").exists()


def test_reduced_logits_are_the_full_drafts_at_the_kept_columns(tiny_target, tmp_path):
    """An export with draft_vocab of a full draft loads as a reduced draft whose logits are
    the full draft's own, read at the kept target ids (lm_head and Markov W2 rows both)."""
    target, tok = tiny_target("qwen3")
    torch.manual_seed(0)
    full = trained_looking(DSparkDraftModel.from_target(target, config_for(target, tok)))
    out = export_draft(full, tmp_path / "r", "deepspec", dtype="float32", draft_vocab=KEPT)
    back = load_draft(out)
    assert back.kept_target_ids.tolist() == SORTED
    ids = sequence(tok)
    want = all_anchor_outputs(full, target, ids)["logits"][:, SORTED]
    got = all_anchor_outputs(back, target, ids)["logits"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ training
CONF = ROOT / "conf"


def run_cfg(out, train, *overrides):
    from dspark.training.schema import check, register_configs

    GlobalHydra.instance().clear()
    register_configs(ROOT / "recipes")
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose(
            "config",
            overrides=[
                "recipe=debug",
                f"trainer.output_dir={out}",
                f"data.train={train}",
                "trainer.max_steps=2",
                "trainer.log_every=1",
                "trainer.eval_every=0",
                "trainer.save_every=0",
                "data.eval_fraction=0.25",
                "data.batch_size=2",
                *overrides,
            ],
        )
    check(cfg)
    return cfg


def tokenized_set(path: Path, seed: int, rows: int = 8) -> Path:
    """Rows of target ids skewed towards a few tokens, the second half of each supervised."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, 385).float()  # Zipf over the tiny target's 384 ids
    data = []
    for _ in range(rows):
        ids = torch.multinomial(weights, 32, replacement=True, generator=g).tolist()
        data.append({"input_ids": ids, "loss_mask": [0] * 16 + [1] * 16})
    Dataset.from_list(data).save_to_disk(str(path))
    return path


def top_k_by_hand(sets, k):
    counts: Counter = Counter()
    for path in sets:
        from datasets import load_from_disk

        for row in load_from_disk(str(path)):
            counts.update(t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    order = sorted(counts, key=lambda t: (-counts[t], t))[:k]  # ties: the lower id
    return sorted(order), sum(counts[t] for t in order) / sum(counts.values())


def test_training_run_writes_the_vocab_and_a_reduced_draft(tiny_target, tmp_path):
    from dspark.training.loop import run

    data = tokenized_set(tmp_path / "tok", seed=1)
    res = run(run_cfg(tmp_path / "run", data, "draft.vocab_size=12"))
    file = data / "draft_vocab_12.json"
    doc = json.loads(file.read_text())
    want_ids, want_cov = top_k_by_hand([data], 12)
    assert doc["ids"] == want_ids and doc["coverage"] == pytest.approx(want_cov)
    draft = load_draft(res["draft"])
    assert draft.config.draft_vocab_size == 12 and draft.kept_target_ids.tolist() == want_ids
    head = tiny_target("qwen3")[0].get_output_embeddings().weight.float()
    assert torch.equal(draft.lm_head.weight, head[want_ids])  # frozen through training
    rc = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert rc["draft"]["vocab_size"] == 12
    assert rc["draft_vocab"] == {"file": str(file), "size": 12, "coverage": doc["coverage"]}
    assert (
        json.loads((tmp_path / "run" / "results.json").read_text())["conditions"]["draft_vocab"]
        == rc["draft_vocab"]
    )
    assert "Draft vocabulary: the 12 most frequent" in (tmp_path / "run" / "report.md").read_text()
    # resuming with another K is refused before anything loads
    with pytest.raises(BadInputError, match=r"draft.vocab_size: 12 -> 10"):
        run(run_cfg(tmp_path / "run", data, "draft.vocab_size=10"))


def test_several_sets_are_counted_together_into_the_run_dir(tiny_target, tmp_path):
    from dspark.training.build import build_draft

    a, b = tokenized_set(tmp_path / "a", seed=2), tokenized_set(tmp_path / "b", seed=3)
    cfg = run_cfg(tmp_path / "run", f"'{a},{b}'", "draft.vocab_size=9")
    _, _, draft = build_draft(cfg, torch.device("cpu"))
    want_ids, want_cov = top_k_by_hand([a, b], 9)
    assert draft.kept_target_ids.tolist() == want_ids
    doc = json.loads((tmp_path / "run" / "draft_vocab_9.json").read_text())
    assert doc["ids"] == want_ids and doc["coverage"] == pytest.approx(want_cov)
    assert not list(a.glob("draft_vocab_*")) and not list(b.glob("draft_vocab_*"))
    # the same data gives the same file; the file is not trusted once the data changes
    before = (tmp_path / "run" / "draft_vocab_9.json").read_text()
    build_draft(cfg, torch.device("cpu"))
    assert (tmp_path / "run" / "draft_vocab_9.json").read_text() == before
    import shutil

    shutil.rmtree(b)
    tokenized_set(b, seed=5, rows=30)
    _, _, draft = build_draft(cfg, torch.device("cpu"))
    want_ids, _ = top_k_by_hand([a, b], 9)
    assert draft.kept_target_ids.tolist() == want_ids
    assert json.loads((tmp_path / "run" / "draft_vocab_9.json").read_text())["ids"] == want_ids


def test_bad_vocab_size_is_one_error_line(tiny_target, tmp_path):
    from dspark.training.build import build_draft

    data = tokenized_set(tmp_path / "tok", seed=4, rows=4)
    with pytest.raises(BadInputError, match=r"draft.vocab_size=385 is out of range.*1 <= K <= 384"):
        build_draft(run_cfg(tmp_path / "r1", data, "draft.vocab_size=385"), torch.device("cpu"))
    with pytest.raises(BadInputError, match=r"draft.vocab_size=0 is out of range"):
        run_cfg(tmp_path / "r2", data, "draft.vocab_size=0")
    res = subprocess.run(
        [sys.executable, str(ROOT / "train/distill.py"), "recipe=debug", f"data.train={data}",
         f"trainer.output_dir={tmp_path / 'r3'}", "draft.vocab_size=0"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: draft.vocab_size=0 is out of range" in lines[0], lines
