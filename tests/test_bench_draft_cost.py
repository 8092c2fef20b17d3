"""The draft's work per round in llama.cpp: parts read from a real draft GGUF and counted by
hand, the round split fitted back from modes synthesised with a known cost, and the choice of
the cheapest export at equal tau."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import random_draft

from dspark.bench import draft_cost as dc
from dspark.bench.llama_cpp import Completion, Mode, ModeRun
from dspark.export.gguf import write_gguf

REPO = Path(__file__).resolve().parents[1]


def test_parts_of_a_reduced_draft_counted_by_hand(tiny_target, tmp_path):
    target, tok = tiny_target("qwen3")
    draft = random_draft(target, tok, "qwen3")
    kept = [300, 3, 17, 42, 5, 250]
    path = write_gguf(draft, tmp_path / "d.gguf", target="tiny-qwen3", outtype="f32",
                      draft_vocab=kept)  # fmt: skip
    parts = dc.tensor_parts(path)
    c = draft.config
    h, v, r = c.hidden_size, c.vocab_size, c.markov_rank
    assert parts["lm_head"]["params"] == h * len(kept)
    assert parts["markov"]["params"] == r * v + r * len(kept)  # w1 over target ids, w2 kept
    assert parts["embedding"]["params"] == v * h
    layer_mats = sum(p.numel() for n, p in draft.layers.named_parameters() if p.dim() > 1)
    head_mats = (
        h * len(kept)
        + r * len(kept)
        + sum(p.numel() for p in draft.confidence_head.parameters() if p.dim() > 1)
    )
    total = layer_mats + head_mats  # a slot multiplies through these; lookups and fc excluded
    assert parts["backbone"]["slot_matmul_params"] == layer_mats
    assert parts["markov"]["slot_matmul_params"] == r * len(kept)  # markov_w1 is a lookup
    assert parts["features in"]["slot_matmul_params"] == 0
    assert parts["embedding"]["slot_matmul_params"] == 0
    assert sum(p["slot_share"] for p in parts.values()) == pytest.approx(1.0)
    assert parts["lm_head"]["slot_share"] == pytest.approx(h * len(kept) / total)
    assert all(p["types"] == ["F32"] for p in parts.values() if p["params"])


def _runs(step_ms, base, per_slot, per_draft, tau_by_nmax, probes, requests=4, tokens=60):
    """Per mode, completions whose decode time a known round cost gives (a p_min cut keeps
    half the slots: what tells the per-slot work from the verify work per draft)."""
    runs = {"plain": ModeRun(Mode("none"), [Completion("x", tokens, tokens * step_ms)] * requests)}
    for m in probes:
        tau = tau_by_nmax[m.n_max]
        rounds = tokens / tau
        drafted = rounds * m.n_max * (0.5 if m.p_min > 0 else 1.0)
        ms = rounds * (step_ms + base + per_slot * m.n_max) + per_draft * drafted
        done = Completion("x", tokens, ms, draft_n=round(drafted),
                          draft_accepted=round(tokens - rounds))  # fmt: skip
        runs[m.name] = ModeRun(m, [done] * requests)
    return {"set": runs}


def test_the_round_split_is_fitted_back_and_the_cheaper_export_at_equal_tau_chosen():
    probes = [Mode("draft-dspark", 1, 0.0), Mode("draft-dspark", 2, 0.0),
              Mode("draft-dspark", 4, 0.0), Mode("draft-dspark", 4, 0.5)]  # fmt: skip
    tau = {1: 1.5, 2: 1.8, 4: 2.0}
    parts = {p: {"params": 0, "bytes": 1000, "slot_share": 0.0, "types": []} for p in dc.PARTS}
    q4 = dc.measured_row("q4_0", parts, _runs(10.0, 2.0, 1.0, 4.0, tau, probes), probes)
    f16 = dc.measured_row("f16", parts, _runs(10.0, 6.0, 3.0, 4.0, tau, probes), probes)
    assert q4["cost"]["base_ms"] == pytest.approx(2.0, abs=0.05)
    assert q4["cost"]["per_slot_ms"] == pytest.approx(1.0, abs=0.05)
    assert q4["cost"]["per_draft_ms"] == pytest.approx(4.0, abs=0.05)
    one = q4["n_max_1"]
    assert one["draft_ms"] == pytest.approx(3.0, abs=0.1)
    # a round at n_max 1 with one draft: 10 + 3 + 4 = 17 ms, the draft's share 3/17
    assert one["round_ms"] == pytest.approx(17.0, abs=0.2)
    assert one["draft_share"] == pytest.approx(3 / 17, abs=0.01)
    assert one["break_even_tau"] == pytest.approx(1.7, abs=0.02)
    assert dc.choose([f16, q4])["export"] == "q4_0"
    # a cheaper export that accepts less is not the same draft: f16 wins on tau
    worse = dc.measured_row("q4_0", parts, _runs(10.0, 2.0, 1.0, 4.0, {1: 1.3, 2: 1.5, 4: 1.6},
                                                 probes), probes)  # fmt: skip
    assert dc.choose([f16, worse])["export"] == "f16"
    md = dc.render([f16, q4], q4, {"cpu": "x"})
    assert "Choice: **q4_0**" in md and "| q4_0 |" in md


def test_llama_cpp_s_own_block_timer_is_summed_over_passes_and_set_against_the_round():
    probes = [Mode("draft-dspark", 1, 0.0), Mode("draft-dspark", 4, 0.0)]
    runs = _runs(10.0, 2.0, 1.0, 4.0, {1: 1.5, 4: 2.0}, probes)  # 4 requests x 60 tokens
    timers: dict = {}
    dc.add_timers(timers, {probes[1].name: {"draft_calls": 70, "draft_ms": 210.0}})
    dc.add_timers(timers, {probes[1].name: {"draft_calls": 50, "draft_ms": 150.0}})
    assert timers == {probes[1].name: {"draft_calls": 120, "draft_ms": 360.0}}
    parts = {p: {"params": 0, "bytes": 1000, "slot_share": 0.0, "types": []} for p in dc.PARTS}
    row = dc.measured_row("q8_0", parts, runs, probes, timers)
    untimed, four = row["grid"]
    assert untimed["timed_block_ms"] is None and untimed["timed_block_share"] is None
    # 360 ms over 120 block drafts: 3 ms each; a round at n_max 4, tau 2: 10 + 2 + 4 + 4 x 4 = 32 ms
    assert four["timed_block_ms"] == pytest.approx(3.0)
    assert four["round_ms"] == pytest.approx(32.0, rel=0.01)
    assert four["timed_block_share"] == pytest.approx(3 / 32, rel=0.01)
    md = dc.render([row], row, {"cpu": "x"})
    assert "| q8_0 | 4 | 0 | 2.00 | 32.00 | 3.00 | 9% |" in md


def test_the_script_without_a_server_is_one_error_line(tiny_target, tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("draft_cost", REPO / "eval" / "draft_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "native_server_bin", lambda: None)
    draft = tmp_path / "d"
    random_draft(*tiny_target("qwen3"), "qwen3").save_pretrained(draft)
    with pytest.raises(SystemExit) as e:
        mod.main(["--draft", str(draft), "--output-dir", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "make llama-server" in capsys.readouterr().err
