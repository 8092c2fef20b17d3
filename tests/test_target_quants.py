"""Targets in the quantizations users serve: the quant names and llama.cpp command lines, a
target given as a GGUF file dequantized to the weights the engine serves (against the HF model
it was converted from), and, where llama-quantize is built, a quantized target end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from helpers import CONVERT, FETCH, REFERENCE

from dspark.bench.target_quants import make_quants, parse_quants, quantize_command
from dspark.errors import BadInputError, MissingPathError

QUANTIZE = REFERENCE.parent / "build-native" / "bin" / "llama-quantize"


def _tiny_convert(tree: Path, model_dir: Path, out: Path) -> list[str]:
    """The converter as the GGUF export's tests run it (a tiny vocabulary has no known
    pre-tokenizer hash: helpers.CONVERT answers that one look-up)."""
    return [sys.executable, "-c", CONVERT, str(tree), str(model_dir), "--outfile", str(out),
            "--outtype", "f16"]  # fmt: skip


def test_quant_names_and_commands(tmp_path):
    assert parse_quants("Q4_0, q4_k_m,q4_0") == ["q4_0", "q4_k_m"]
    with pytest.raises(BadInputError, match="unknown quant.*q4_k_m"):
        parse_quants("q4_k")
    cmd = quantize_command(Path("/b/llama-quantize"), Path("a.gguf"), Path("b.gguf"), "q4_k_m", 2)
    assert cmd == ["/b/llama-quantize", "a.gguf", "b.gguf", "Q4_K_M", "2"]
    cmd = quantize_command(
        Path("/b/llama-quantize"), Path("a.gguf"), Path("b.gguf"), "q4_0_pure", 2
    )
    assert cmd == ["/b/llama-quantize", "--pure", "a.gguf", "b.gguf", "Q4_0", "2"]
    cmd = quantize_command(Path("q"), Path("a.gguf"), Path("b.gguf"), "iq4_nl_pure", 2)
    assert cmd == ["q", "--pure", "a.gguf", "b.gguf", "IQ4_NL", "2"]
    assert quantize_command(Path("q"), Path("a"), Path("b"), "iq4_nl", 2)[1:] == [
        "a", "b", "IQ4_NL", "2"]  # fmt: skip
    with pytest.raises(MissingPathError, match="make llama-server"):
        make_quants(tmp_path, tmp_path / "o", ["q4_0"], tree=REFERENCE, quantize_bin=None)


@pytest.fixture(scope="module")
def f16_target(tmp_path_factory, tiny_target_dir):
    if not (REFERENCE / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {REFERENCE}; fetch it with: {FETCH}")
    out = tmp_path_factory.mktemp("quants")
    made = make_quants(tiny_target_dir("llama"), out, ["f16"], tree=REFERENCE,
                       quantize_bin=None, name="tiny", convert=_tiny_convert)  # fmt: skip
    return made["f16"]


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def test_a_gguf_target_is_the_served_weights(f16_target, tiny_target, monkeypatch):
    from dspark.target import load_target
    from dspark.target import prepare as prepare_mod

    ref, _ = tiny_target("llama")
    model, tok = load_target(str(f16_target))
    ids = torch.randint(
        0, ref.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0)
    )
    want = _logits(ref, ids)
    # the F16 GGUF's weights are the HF ones rounded to fp16; the rest of the pass is fp32
    ref16 = type(ref)(ref.config)
    ref16.load_state_dict({k: v.half().float() for k, v in ref.state_dict().items()})
    assert torch.allclose(_logits(model, ids), _logits(ref16.eval(), ids), atol=1e-5)
    assert not torch.equal(_logits(model, ids), want)  # the served weights, not the HF ones
    assert tok.encode("hello world") == tiny_target("llama")[1].encode("hello world")
    # prepared once: a second load reads the cached directory
    monkeypatch.setattr(prepare_mod, "dequantize_gguf", lambda *a, **k: pytest.fail("again"))
    load_target(str(f16_target))
    # and the feature cache reads its dims as a target's (not as a config.json)
    from dspark.data.features.feature_layout import target_dims

    assert target_dims(str(f16_target)) == {
        "hidden_size": ref.config.hidden_size,
        "num_hidden_layers": ref.config.num_hidden_layers,
    }


@pytest.mark.skipif(not QUANTIZE.is_file(), reason=f"llama-quantize not built ({QUANTIZE})")
def test_a_quantized_target_end_to_end(f16_target, tiny_target):
    from dspark.target import load_target

    out = f16_target.parent
    made = make_quants(out.parent, out, ["f16", "q8_0"], tree=REFERENCE, quantize_bin=QUANTIZE,
                       name="tiny", convert=_tiny_convert)  # fmt: skip
    assert made["f16"] == f16_target  # kept, not converted again
    model, _ = load_target(str(made["q8_0"]))
    ref, _ = tiny_target("llama")
    ids = torch.arange(24).unsqueeze(0)
    got, want = _logits(model, ids), _logits(ref, ids)
    assert 0 < (got - want).abs().max() < 0.1 * want.abs().max()  # quantized, still the model


@pytest.mark.skipif(not QUANTIZE.is_file(), reason=f"llama-quantize not built ({QUANTIZE})")
@pytest.mark.parametrize("quant, gguf_type", [("q4_0", "Q4_0"), ("iq4_nl", "IQ4_NL")])
def test_a_pure_quant_holds_one_type(f16_target, quant, gguf_type):
    """`<quant>_pure`: every quantized weight in the one type, the tied output head too (the
    plain quant keeps it in a higher type: the file's mix tells them apart)."""
    from dspark.engines.llama_server import gguf_weight_types

    out = f16_target.parent
    made = make_quants(out.parent, out, [quant, f"{quant}_pure"], tree=REFERENCE,
                       quantize_bin=QUANTIZE, name="tiny", convert=_tiny_convert)  # fmt: skip
    assert made[f"{quant}_pure"].name == f"tiny.{quant}_pure.gguf"

    def quantized(path):  # the norms stay F32 in every quant
        return set(gguf_weight_types(str(path)) or {}) - {"F32"}

    assert quantized(made[f"{quant}_pure"]) == {gguf_type}
    assert gguf_type in quantized(made[quant]) and quantized(made[quant]) != {gguf_type}
