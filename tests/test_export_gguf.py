"""GGUF export for llama.cpp (`write_gguf`): on tiny drafts our file equals what llama.cpp's
own converter (convert_hf_to_gguf.py, run as a subprocess on the exported draft) writes, key
for key and tensor for tensor; drafts llama.cpp would serve wrong are refused; a reduced
vocabulary carries d2t as absolute target ids; a target GGUF's tokenizer metadata is copied.

The converter comes from `$DSPARK_LLAMA_CPP_DIR` (a llama.cpp tree) or the default place
`python data_scripts/fetch_llama_cpp.py` unpacks it to; without it those tests skip."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CONVERT, FETCH, REFERENCE, random_draft

from dspark.errors import BadInputError
from dspark.export import export_draft
from dspark.export.gguf import write_gguf

gguf = pytest.importorskip("gguf")
ROOT = Path(__file__).resolve().parents[1]
# Keys allowed to differ: general.name is provenance (the converter derives it from the
# directory name, or leaves it out); the GGUF.* entries are the reader's header counts,
# compared through the tensor and key sets themselves.
IGNORED = {"general.name", "GGUF.kv_count", "GGUF.tensor_count"}


def reference_gguf(export_dir: Path, target_dir: Path, out: Path, outtype: str) -> Path:
    if not (REFERENCE / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {REFERENCE}; fetch it with: {FETCH}")
    env = {**os.environ, "PYTHONPATH": str(REFERENCE / "gguf-py"), "NO_LOCAL_GGUF": ""}
    argv = [str(export_dir), "--target-model-dir", str(target_dir), "--outtype", outtype]
    res = subprocess.run(
        [sys.executable, "-c", CONVERT, str(REFERENCE), *argv, "--outfile", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def read(path: Path):
    r = gguf.GGUFReader(str(path))
    keys = {k: (tuple(f.types), f.contents()) for k, f in r.fields.items() if k not in IGNORED}
    tensors = {t.name: t for t in r.tensors}
    return keys, tensors


def values(t) -> np.ndarray:
    """A tensor's values as numbers (integer tensors such as d2t as they are)."""
    if np.issubdtype(t.data.dtype, np.integer) and t.data.dtype != np.uint8:
        return np.asarray(t.data)
    return gguf.quants.dequantize(t.data, t.tensor_type)


def assert_same(ours: Path, ref: Path, *, only_ours=()):
    """Same keys (types and values) and tensors (types, shapes, values); `only_ours`: tensors
    our file holds beyond the reference's (the size label then counts them too)."""
    ok, ot = read(ours)
    rk, rt = read(ref)
    for name in only_ours:
        ot.pop(name)
        ok.pop("general.size_label"), rk.pop("general.size_label")
    assert ok.keys() == rk.keys()
    for k in rk:
        assert ok[k][0] == rk[k][0], k  # value types
        if isinstance(rk[k][1], float):  # stored as FLOAT32 on both sides
            assert np.float32(ok[k][1]) == np.float32(rk[k][1]), k
        else:
            assert ok[k][1] == rk[k][1], k
    assert ot.keys() == rt.keys()
    for name, r in rt.items():
        o = ot[name]
        assert o.tensor_type == r.tensor_type and list(o.shape) == list(r.shape), name
        a, b = values(o), values(r)
        # both sides round the same float32 values; allow one unit of the narrow dtype
        np.testing.assert_allclose(a, b, rtol=2**-8, atol=1e-6, err_msg=name)
    return ok, ot


@pytest.mark.parametrize("arch,tied", [("qwen3", True), ("qwen3", False), ("llama", True)])
def test_equals_llama_cpp_converter(tiny_target, tiny_target_dir, tmp_path, arch, tied):
    target, tok = tiny_target(arch)
    draft = random_draft(target, tok, arch)
    if tied:  # as a tied-embedding target (SmolLM2, small Qwen3) gives
        with torch.no_grad():
            draft.lm_head.weight.copy_(draft.embed_tokens.weight)
    exp = export_draft(draft, tmp_path / "exp", dtype="float32")
    ours = write_gguf(exp, tmp_path / "ours.gguf", target=f"tiny-{arch}")
    ref = reference_gguf(exp, tiny_target_dir(arch), tmp_path / "ref.gguf", "f16")
    if tied:
        keys, tensors = assert_same(ours, ref)
    else:
        # The converter drops every full-vocabulary lm_head, and llama.cpp then takes the
        # output head from the draft's token_embd: right for a tied target only. Ours keeps
        # the head as output.weight [V, hidden]; the rest is identical (the size label counts
        # the extra tensor).
        head = read(ours)[1]["output.weight"]
        assert list(head.shape) == [64, draft.config.vocab_size]
        np.testing.assert_allclose(
            gguf.quants.dequantize(head.data, head.tensor_type),
            draft.lm_head.weight.numpy(),
            rtol=2**-8,
            atol=1e-6,
        )
        assert "output.weight" not in read(ref)[1]
        keys, tensors = assert_same(ours, ref, only_ours=["output.weight"])
    assert keys["general.architecture"][1] == "dflash"
    assert keys["dflash.target_layers"][1] == [i + 1 for i in draft.config.target_layer_ids]
    assert keys["dflash.block_size"][1] == 4 and keys["dflash.sample_from_anchor"][1] is True
    assert keys["tokenizer.ggml.mask_token_id"][1] == draft.config.mask_token_id
    assert "token_embd.weight" in tensors and "d2t" not in tensors


def test_reduced_vocab_writes_absolute_d2t(tiny_target, tiny_target_dir, tmp_path):
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3")
    kept = [300, 3, 17, 42, 5, 250]
    exp = export_draft(draft, tmp_path / "exp", "speculators", dtype="float32", draft_vocab=kept)
    ours = write_gguf(exp, tmp_path / "ours.gguf", target="tiny-qwen3", outtype="f32")
    _, tensors = read(ours)
    assert tensors["d2t"].data.tolist() == sorted(kept)  # absolute target ids, int64
    assert tensors["d2t"].tensor_type == gguf.GGMLQuantizationType.I64
    assert list(tensors["output.weight"].shape) == [64, 6]  # the kept lm_head rows
    assert list(tensors["markov_w2.weight"].shape) == [8, 6]
    assert list(tensors["markov_w1.weight"].shape) == [8, 384]  # reads target tokens: full
    rows = torch.tensor(sorted(kept))
    np.testing.assert_array_equal(tensors["output.weight"].data, draft.lm_head.weight[rows])
    # the same draft in memory with draft_vocab= gives the same file
    mem = write_gguf(
        draft, tmp_path / "mem.gguf", target="tiny-qwen3", outtype="f32", draft_vocab=kept
    )
    assert_same(mem, ours)
    ref = reference_gguf(exp, tiny_target_dir("qwen3"), tmp_path / "ref.gguf", "f32")
    assert_same(ours, ref)


def test_refuses_what_llama_cpp_serves_wrong(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    gated = random_draft(target, tok, "qwen3", markov_head_type="gated")
    with pytest.raises(BadInputError, match=r"markov_head_type='gated'.*vanilla"):
        write_gguf(gated, tmp_path / "g.gguf", target="tiny-qwen3")
    draft = random_draft(target, tok, "qwen3")
    draft.config.target_model_type = "qwen2"
    with pytest.raises(BadInputError, match="'qwen2' target.*layer inputs"):
        write_gguf(draft, tmp_path / "q.gguf", target="tiny-qwen3")
    draft.config.target_model_type = "qwen3"
    draft.config.target_layer_ids = [0, 3]  # 3 = the last of 4 layers: its output is no input
    with pytest.raises(BadInputError, match=r"target_layer_ids \[0, 3\]"):
        write_gguf(draft, tmp_path / "l.gguf", target="tiny-qwen3")
    with pytest.raises(BadInputError, match="outtype"):
        write_gguf(draft, tmp_path / "o.gguf", target="tiny-qwen3", outtype="q2_k")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left


def test_target_gguf_tokenizer_copied(tmp_path):
    """target='embedded': the SmolLM2 GGUF's tokenizer metadata, copied key for key."""
    from dspark.config import DSparkConfig
    from dspark.errors import UserError
    from dspark.modeling import DSparkDraftModel
    from dspark.target.prepare import GGUF_FILE, gguf_location

    try:
        gguf_location()
    except UserError as e:  # the embedded target's package is an optional install
        pytest.skip(str(e))

    cfg = DSparkConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        block_size=4,
        mask_token_id=2,
        target_layer_ids=[1, 15, 28],
        num_target_layers=30,
        target_model_type="llama",
        target_name_or_path="embedded",
        markov_rank=8,
    )
    torch.manual_seed(0)
    draft = DSparkDraftModel(cfg).eval()
    out = write_gguf(draft, tmp_path / "d.gguf", target="embedded", outtype="q8_0")
    keys, tensors = read(out)
    src, _ = read(gguf_location() / GGUF_FILE)
    want = {k: v for k, v in src.items() if k.startswith("tokenizer.")}
    got = {k: v for k, v in keys.items() if k.startswith("tokenizer.")}
    assert got.pop("tokenizer.ggml.mask_token_id")[1] == 2
    assert got == want
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def test_export_cli_format_gguf(tiny_target, tmp_path, capsys):
    """`export.py DRAFT OUT --format gguf`: draft.gguf (the same file write_gguf writes),
    export.json, and a README with the llama-server command; a rerun replaces it only with
    --overwrite."""
    import json

    import dspark.cli

    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3")
    src = tmp_path / "draft"
    draft.save_pretrained(src)
    out = tmp_path / "exports" / "g"
    with pytest.raises(SystemExit) as e:
        dspark.cli.export([str(src), str(out), "--format", "gguf", "--outtype", "f32"])
    assert e.value.code == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "draft.gguf", "export.json"]
    direct = write_gguf(src, tmp_path / "direct.gguf", target="tiny-qwen3", outtype="f32")
    assert_same(out / "draft.gguf", direct)
    readme = (out / "README.md").read_text()
    assert f"-md {out / 'draft.gguf'} --spec-type draft-dspark" in readme
    assert "--spec-draft-n-max 3" in readme and "eval/llama_cpp_bench.py" in readme
    assert json.loads((out / "export.json").read_text())["format"] == "gguf"
    with pytest.raises(SystemExit) as e:
        dspark.cli.export([str(src), str(out), "--format", "gguf"])
    assert e.value.code == 2 and "--overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        dspark.cli.export([str(src), str(out), "--format", "gguf", "--overwrite"])
    assert e.value.code == 0


def test_reduced_model_exports_and_loads_back(tiny_target, tiny_target_dir, tmp_path):
    """A draft reduced in the model itself (config.draft_vocab_size): its GGUF holds its own
    rows and d2t, equals llama.cpp's converter on the same draft's speculators export, and
    loads back through load_draft with identical weights, buffers and logits."""
    from dspark.config import DSparkConfig, choose_mask_token_id
    from dspark.export import load_draft
    from dspark.export.reference import all_anchor_outputs
    from dspark.modeling import DSparkDraftModel

    target, tok = tiny_target("qwen3")
    kept = [300, 3, 17, 42, 5, 250]
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=2,
        markov_rank=8,
        block_size=4,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
        target_name_or_path="tiny-qwen3",
        draft_vocab_size=len(kept),
    )
    torch.manual_seed(0)
    draft = DSparkDraftModel.from_target(target, cfg, kept_ids=kept)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    draft.eval()
    out = export_draft(draft, tmp_path / "g", "gguf", gguf_outtype="f32")
    _, tensors = read(out / "draft.gguf")
    assert tensors["d2t"].data.tolist() == sorted(kept)
    assert list(tensors["output.weight"].shape) == [64, 6]
    back = load_draft(out)
    assert back.config.draft_vocab_size == 6
    want, got = draft.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    ids = tok("def add(a, b):\n    return a + b", return_tensors="pt")["input_ids"][:, :16]
    a, b = all_anchor_outputs(draft, target, ids), all_anchor_outputs(back, target, ids)
    assert torch.equal(a["logits"], b["logits"])
    assert torch.equal(a["confidence_logits"], b["confidence_logits"])
    with pytest.raises(BadInputError, match="already has a reduced vocabulary"):
        write_gguf(draft, tmp_path / "x.gguf", target="tiny-qwen3", draft_vocab=[1, 2])
    spec = export_draft(draft, tmp_path / "spec", "speculators", dtype="float32")
    assert_same(out / "draft.gguf", write_gguf(spec, tmp_path / "s.gguf", outtype="f32"))
    ref = reference_gguf(spec, tiny_target_dir("qwen3"), tmp_path / "ref.gguf", "f32")
    assert_same(out / "draft.gguf", ref)


@pytest.mark.parametrize("tied", [True, False])
def test_full_gguf_loads_back(tiny_target, tmp_path, tied):
    from dspark.export import load_draft

    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3")
    if tied:
        with torch.no_grad():
            draft.lm_head.weight.copy_(draft.embed_tokens.weight)
    path = write_gguf(draft, tmp_path / "d.gguf", target="tiny-qwen3", outtype="f32")
    _, tensors = read(path)
    assert ("output.weight" in tensors) is not tied
    back = load_draft(path)
    assert back.kept_target_ids is None
    for k, v in draft.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_q4_0_tensors_dequantize_by_hand_to_the_draft_weights(tmp_path):
    """Q4_0 (llama.cpp's ggml layout, decoded here by hand: per 32 values an f16 scale d, then
    16 bytes whose low nibbles are values 0..15 and high nibbles 16..31, value = (q - 8) * d)
    holds each weight within one quantization step (half a step by rounding, a whole one where
    the value opposite the block's extreme clamps at 15); 1-D tensors stay F32."""
    import gguf

    from dspark.config import DSparkConfig
    from dspark.export.gguf import write_gguf
    from dspark.modeling import DSparkDraftModel

    cfg = DSparkConfig(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, block_size=4,
                       mask_token_id=2, target_layer_ids=[1, 2], num_target_layers=4,
                       target_model_type="llama", markov_rank=32)  # fmt: skip
    torch.manual_seed(0)
    draft = DSparkDraftModel(cfg).eval()
    out = write_gguf(draft, tmp_path / "d.gguf", target="tiny-llama", outtype="q4_0")
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    t = tensors["blk.0.attn_q.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_0
    raw = np.asarray(t.data, dtype=np.uint8).reshape(-1, 18)
    d = raw[:, :2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
    q = np.concatenate([raw[:, 2:] & 0x0F, raw[:, 2:] >> 4], axis=1).astype(np.float32)
    deq = ((q - 8.0) * d).reshape(-1)
    w = draft.layers[0].self_attn.q_proj.weight.detach().numpy().reshape(-1)
    step = np.repeat(np.abs(d[:, 0]), 32)
    err = np.abs(deq - w)
    assert np.all(err <= step + 1e-6)
    assert np.mean(err <= 0.5 * step + 1e-6) > 0.95  # rounding, bar the clamped few
    assert np.abs(deq - w).max() > 0  # quantized, not copied
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
