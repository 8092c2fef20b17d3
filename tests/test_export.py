"""Export (deepspec / speculators layouts): round trips through our loader give the same
tensors and the same T=0 proposals from our decoder; engines' limits are refused with the
reason; README commands carry num_speculative_tokens = block size; bad input leaves nothing.
The independent check with the `speculators` package itself is the slow test at the end."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import make_draft

from dspark.decoding import DecoderOptions, SpeculativeDecoder
from dspark.decoding.draft_step import propose
from dspark.export import NotServableError, export_draft, layout_of, load_draft
from dspark.target.capture import OnlineTargetCapture

ROOT = Path(__file__).resolve().parents[1]


def random_draft(target, tok, arch, **kw):
    kw.setdefault("block_size", 4)
    draft = make_draft(target, tok, num_hidden_layers=2, target_name_or_path=f"tiny-{arch}", **kw)
    with torch.no_grad():  # move every trainable tensor off its init (ones / zeros hide swaps)
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return draft.eval()


@torch.no_grad()
def proposals(draft, target, ids):
    """T=0 proposals + confidences of our decoder's draft step at every anchor of `ids [1,S]`."""
    S = ids.shape[1]
    feats = OnlineTargetCapture(target, draft.config.target_layer_ids)(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    )
    pos = torch.arange(S)[None]
    kv = draft.context_kv(draft.encode_context(feats.tapped), pos)
    toks, confs = [], []
    for p in range(2, S):
        prop = propose(
            draft,
            ids[:, p],
            torch.tensor([p]),
            kv,
            torch.arange(S)[None] < p,
            gamma=int(draft.config.block_size),
            mask_token_id=int(draft.config.mask_token_id),
        )
        toks.append(prop.tokens)
        confs.append(prop.confidence)
    return torch.cat(toks), torch.cat(confs)


@pytest.mark.parametrize("fmt", ["deepspec", "speculators"])
def test_round_trip_same_tensors_and_proposals(tiny_target, tmp_path, arch, fmt):
    target, tok = tiny_target(arch)
    draft = random_draft(target, tok, arch)
    out = export_draft(draft, tmp_path / fmt, fmt, dtype="float32")
    assert layout_of(out) == ("speculators" if fmt == "speculators" else "dspark")
    back = load_draft(out)
    want, got = draft.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    ids = tok("def add(a, b):\n    return a + b", return_tensors="pt")["input_ids"][:, :16]
    t0, c0 = proposals(draft, target, ids)
    t1, c1 = proposals(back, target, ids)
    assert torch.equal(t0, t1) and torch.equal(c0, c1)
    assert len(set(t0.flatten().tolist())) > 3  # proposals that depend on the weights
    dec = [SpeculativeDecoder(target, d, DecoderOptions(max_length=256)) for d in (draft, back)]
    prompts = [ids[0, :9].tolist(), ids[0, :5].tolist()]
    o0, o1 = (d.generate(prompts, 12) for d in dec)
    assert o0.sequences == o1.sequences and o0.accept_lengths == o1.accept_lengths
    assert o0.confidences == o1.confidences


def test_bf16_default_equals_rounded_weights(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3")
    out = export_draft(draft, tmp_path / "bf16")  # deepspec, bfloat16 by default
    from safetensors.torch import load_file

    state = load_file(str(out / "model.safetensors"))
    assert {v.dtype for v in state.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    back = load_draft(out)
    for k, v in draft.state_dict().items():
        assert torch.equal(back.state_dict()[k], v.to(torch.bfloat16).float()), k


def test_deepspec_config_is_what_engines_read(tiny_target, tmp_path):
    target, tok = tiny_target("llama")
    draft = random_draft(target, tok, "llama", block_size=5)
    out = export_draft(draft, tmp_path / "ds", "deepspec", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["sample_from_anchor"] is True and cfg["tie_word_embeddings"] is False
    assert cfg["target_layer_ids"] == list(draft.config.target_layer_ids)
    assert cfg["block_size"] == 5 and "draft_vocab_size" not in cfg
    from transformers import AutoConfig

    assert type(AutoConfig.for_model(**cfg)).__name__ == "Qwen3Config"


def test_speculators_config_schema(tiny_target, tmp_path):
    target, tok = tiny_target("qwen2")
    draft = random_draft(target, tok, "qwen2", block_size=6)
    out = export_draft(draft, tmp_path / "sp", "speculators", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark"
    assert cfg["architectures"] == ["DSparkSpeculator"]
    ids = list(draft.config.target_layer_ids)
    assert cfg["aux_hidden_state_layer_ids"] == [i + 1 for i in ids]  # HF hidden_states index
    sc = cfg["speculators_config"]
    assert sc["algorithm"] == "dspark" and sc["default_proposal_method"] == "greedy"
    assert sc["proposal_methods"][0]["speculative_tokens"] == 6  # anchor slot predicts too
    assert sc["verifier"]["architectures"] == ["Qwen2ForCausalLM"]
    assert Path(sc["verifier"]["name_or_path"]).is_dir()
    assert cfg["sample_from_anchor"] is True and cfg["draft_vocab_size"] == draft.config.vocab_size
    assert cfg["markov_rank"] == draft.config.markov_rank
    layer = cfg["transformer_layer_config"]
    assert layer["model_type"] == "qwen3" and layer["num_hidden_layers"] == 2
    assert not {"block_size", "target_layer_ids", "markov_rank"} & set(layer)


def _command(readme: str, start: str) -> str:
    block = readme.split(start, 1)[1].split("```", 1)[0]
    return start + block.replace("\\\n", " ")


@pytest.mark.parametrize("fmt", ["deepspec", "speculators"])
def test_readme_commands(tiny_target, tmp_path, fmt):
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3", block_size=7)
    out = export_draft(draft, tmp_path / fmt, fmt)
    readme = (out / "README.md").read_text()
    argv = shlex.split(_command(readme, "vllm serve"))
    assert argv[2] == str(Path(os.environ["DSPARK_CACHE"]).resolve() / "targets" / "tiny-qwen3")
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "dspark", "model": str(out), "num_speculative_tokens": 7}
    if fmt == "deepspec":
        sg = shlex.split(_command(readme, "python -m sglang.launch_server"))
        assert sg[sg.index("--speculative-algorithm") + 1] == "DSPARK"
        assert sg[sg.index("--speculative-draft-model-path") + 1] == str(out)
        assert sg[sg.index("--speculative-dspark-block-size") + 1] == "7"


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_heads_vllm_cannot_serve_are_refused(tiny_target, tmp_path, head):
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3", markov_head_type=head)
    with pytest.raises(NotServableError, match=rf"markov_head_type='{head}'.*vanilla"):
        export_draft(draft, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temp dir left
    out = export_draft(draft, tmp_path / "any", "speculators", engine="any", dtype="float32")
    readme = (out / "README.md").read_text()
    assert "Not servable" in readme and "vllm serve" not in readme
    back = load_draft(out)  # our loader reads every head back
    for k, v in draft.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_pure_dflash_and_biased_layers_refused(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    dflash = random_draft(target, tok, "qwen3", markov_rank=0, confidence_head_with_markov=False)
    with pytest.raises(NotServableError, match="markov_rank=0"):
        export_draft(dflash, tmp_path / "a")
    from dspark.export import serving_problems

    vanilla = random_draft(target, tok, "qwen3")
    keys = set(vanilla.state_dict())
    assert serving_problems(vanilla.config, keys) == []
    no_qk = {k for k in keys if "q_norm" not in k}
    assert any("q/k norms" in p for p in serving_problems(vanilla.config, no_qk))
    qkv_only = keys | {f"layers.0.self_attn.{p}_proj.bias" for p in "qkv"}
    assert any("attention_bias" in p for p in serving_problems(vanilla.config, qkv_only))
    mlp_bias = keys | {"layers.1.mlp.up_proj.bias"}
    assert any("MLP has biases" in p for p in serving_problems(vanilla.config, mlp_bias))


def test_reduced_vocab_export(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3")
    V = draft.config.vocab_size
    kept = torch.tensor([300, 3, 17, 42, 5, 250])
    out = export_draft(draft, tmp_path / "r", "speculators", dtype="float32", draft_vocab=kept)
    from safetensors.torch import load_file

    s = load_file(str(out / "model.safetensors"))
    ids = torch.sort(kept).values
    assert torch.equal(s["d2t"] + torch.arange(6), ids)  # target id = draft id + d2t[draft id]
    assert s["t2d"].shape == (V,) and s["t2d"].sum() == 6 and s["t2d"][ids].all()
    assert torch.equal(s["lm_head.weight"], draft.lm_head.weight[ids])
    assert torch.equal(s["markov_head.markov_w2.weight"], draft.markov_head.markov_w2.weight[ids])
    assert s["markov_head.markov_w1.weight"].shape[0] == V  # reads target tokens: full
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 6
    back = load_draft(out)  # a reduced draft: the kept rows and the maps, as written
    assert torch.equal(back.kept_target_ids, ids) and torch.equal(back.t2d, s["t2d"])
    assert torch.equal(back.lm_head.weight, s["lm_head.weight"])
    # a d2t file works like the ids; a wrong-size one names the file and the problem
    f = tmp_path / "vocab.json"
    f.write_text(json.dumps({"d2t": s["d2t"].tolist()}))
    out2 = export_draft(draft, tmp_path / "r2", dtype="float32", draft_vocab=f)
    assert torch.equal(load_file(str(out2 / "model.safetensors"))["d2t"], s["d2t"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"d2t": [0] * (V + 1)}))
    with pytest.raises(ValueError, match=r"bad\.json: d2t has .* entries"):
        export_draft(draft, tmp_path / "r3", draft_vocab=bad)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        export_draft(draft, tmp_path / "r4", draft_vocab=[1, V])
    assert not (tmp_path / "r3").exists() and not (tmp_path / "r4").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_inputs(tiny_target, tmp_path):
    target, tok = tiny_target("llama")
    draft = random_draft(target, tok, "llama")
    weird = tmp_path / "weird"
    weird.mkdir()
    (weird / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ValueError, match=r"weird/config\.json is not a DSpark draft config"):
        load_draft(weird)
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        load_draft(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown export format"):
        export_draft(draft, tmp_path / "o", "onnx")
    out = export_draft(draft, tmp_path / "o")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_draft(draft, out)
    export_draft(draft, out, "speculators", overwrite=True)
    assert layout_of(out) == "speculators"


def test_export_script_and_init_from(tiny_target, tmp_path):
    """The CLI exports a saved draft dir; the exported dirs read back through `load_draft`,
    which `draft.init_from` uses."""
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3")
    draft.save_pretrained(tmp_path / "run_draft")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "data_scripts/export.py"),
            str(tmp_path / "run_draft"),
            str(tmp_path / "exp"),
            "--format",
            "speculators",
            "--dtype",
            "float32",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "num_speculative_tokens" in res.stdout
    rnn = random_draft(target, tok, "qwen3", markov_head_type="rnn")
    rnn.save_pretrained(tmp_path / "rnn")
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "data_scripts/export.py"),
            str(tmp_path / "rnn"),
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 2 and "markov_head_type='rnn'" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("export: error: ")
    from types import SimpleNamespace

    from dspark.training.build import build_draft

    cfg = SimpleNamespace(
        target=SimpleNamespace(name="tiny-qwen3", dtype="float32"),
        draft=SimpleNamespace(init_from=str(tmp_path / "exp"), lora=None),
        trainer=SimpleNamespace(attention="sdpa"),
    )
    _, _, loaded = build_draft(cfg, torch.device("cpu"))
    for k, v in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


@pytest.mark.slow
def test_speculators_package_loads_our_export(tmp_path):
    """Independent implementation: speculators 0.9 (separate venv, created when missing) holds
    the same tensors and gives the same draft logits (eval/check_speculators.py), for the full
    vocabulary and a reduced one (its d2t maps its top-1 to our target ids)."""
    res = subprocess.run(
        [sys.executable, str(ROOT / "eval/check_speculators.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "speculators_check.json").read_text())
    assert summary["ok"], summary
    arms = {(r["arch"], r["vocab"]): r for r in summary["results"]}
    assert set(arms) == {("qwen3", "full"), ("llama", "full"), ("qwen3", "reduced")}
    red = arms[("qwen3", "reduced")]
    assert red["draft_vocab_size"] < arms[("qwen3", "full")]["draft_vocab_size"]
    assert red["same_target_top1"] and red["max_abs_diff"]["logits_vs_full_at_d2t"] < 1e-3
