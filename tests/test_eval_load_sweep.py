"""The load sweep (tiny target) and the trace-replay simulator (numbers worked out by hand)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import OracleDraft, greedy_reference, prompts_for

from dspark.bench import load_sweep as ls
from dspark.bench import simulate as sim
from dspark.bench.sps_plot import plot_profile, profile_markdown
from dspark.decoding.output import GenerationOutput
from dspark.decoding.sps import Roofline, SPSProfile

REPO = Path(__file__).resolve().parents[1]
GAMMA = 3


def _profile(draft_s=0.0):
    rows, widths = [1, 2, 4], [1, 2, 4]
    times = [[0.1 * (1 + 0.25 * (r * w - 1)) for w in widths] for r in rows]  # affine in tokens
    return SPSProfile(rows, widths, times, [draft_s] * 3, {"source": "test"})


def test_sweep_cells_traces_and_resume(tiny_target, tmp_path):
    model, _ = tiny_target("qwen3")
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, (5, 7, 4, 6), 3)
    refs = [greedy_reference(model, p, 10) for p in prompts]
    draft = OracleDraft([p + r for p, r in zip(prompts, refs)], vocab, gamma=GAMMA, seed=1)
    decs = ls.decoders(
        model, draft, list(ls.POLICIES), threshold=0.5, sps=_profile(), temperature=0.0,
        max_length=128,
    )  # fmt: skip
    # the oracle maps batch rows to requests through the decoders' observer hook
    for dec in decs.values():
        dec.options.observer = draft.recorder
    cond = {"test": 1}
    res = ls.run_sweep(decs, prompts, [1, 4], max_new_tokens=10, eos=None, seed=0,
                       out_dir=tmp_path, conditions=cond, progress=lambda m: None)  # fmt: skip
    assert set(res["cells"]) == {f"{n}/{p}" for n in (1, 4) for p in ls.POLICIES}
    for key, cell in res["cells"].items():
        assert cell["new_tokens"] == 10 * cell["load"]  # EOS ignored: the load stays constant
        if cell["policy"] != "ar":
            assert cell["matches_ar"] == 1.0, key  # lossless at every load
            assert cell["tau"] > 1.0
    ar4 = res["cells"]["4/ar"]
    assert ar4["verify_tokens_per_request_round"] == 1.0 and ar4["draft_ms_per_round"] == 0
    traces = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert {(t["load"], t["policy"]) for t in traces} == {
        (n, p) for n in (1, 4) for p in ls.POLICIES if p != "ar"
    }
    assert (
        "4/scheduler" in res["table"]["gains"]["scheduler"]
        or 4 in res["table"]["gains"]["scheduler"]
    )
    # a rerun with the same conditions measures nothing again
    for dec in decs.values():
        dec.generate = dec.generate_autoregressive = None
    again = ls.run_sweep({}, prompts, [1, 4], max_new_tokens=10, eos=None, seed=0,
                         out_dir=tmp_path, conditions=cond, progress=lambda m: None)  # fmt: skip
    assert again["cells"] == json.loads(json.dumps(res["cells"]))
    plots = ls.plot(res, tmp_path)
    assert all((tmp_path / f).read_bytes()[:4] == b"\x89PNG" for f in plots.values())
    assert "| 4 | scheduler |" in ls.render_markdown(res, plots)


def _stream(accepted, conf=0.9, rounds=50):
    surv = [conf ** (k + 1) for k in range(GAMMA)]
    return [sim.TraceRound(surv, accepted) for _ in range(rounds)]


def test_simulator_matches_hand_computed_rates():
    prof = _profile(draft_s=0.05)
    t = prof.step_time
    streams = [_stream(GAMMA)]  # every draft accepted
    # AR, 2 requests, 9 new tokens each: 8 decode steps of t(2, 1)
    ar = sim.simulate(streams, 2, "ar", prof, max_new_tokens=9)
    assert ar["total_tokens_per_s"] == pytest.approx(16 / (8 * t(2, 1)))
    assert ar["per_user_tokens_per_s"] == pytest.approx(8 / (8 * t(2, 1)))
    # full: rounds commit 4, 4, then the budget caps the last round at 0 drafts (1 token)
    full = sim.simulate(streams, 2, "full", prof, max_new_tokens=10)
    expect = 2 * (prof.draft_time(2) + t(2, 4)) + prof.draft_time(2) + t(2, 1)
    assert full["decode_s"] == pytest.approx(expect)
    assert full["total_tokens_per_s"] == pytest.approx(18 / expect)
    assert full["tau"] == pytest.approx((3 + 3 + 0) / 3 + 1)
    # rejections: a trace that accepts 1 of 3; a policy verifying 1 draft keeps that 1
    short = [_stream(1, conf=0.6)]
    thr = sim.simulate(short, 1, "threshold", prof, max_new_tokens=7, threshold=0.5)
    assert thr["mean_width"] == 2 and thr["tau"] == pytest.approx(2.0)
    ragged = sim.simulate(short, 1, "full", prof, max_new_tokens=7, engine="ragged")
    assert ragged["mean_width"] == pytest.approx((4 + 4 + 2) / 3)  # last round: budget cap 1


def test_simulator_scheduler_uses_the_decoder_scheduler():
    prof = _profile()
    streams = [_stream(GAMMA, conf=0.99)]
    cheap = sim.simulate(streams, 4, "scheduler", prof, max_new_tokens=13)
    assert cheap["mean_width"] > 1  # confident drafts at a cost affine in tokens: verify
    steep = SPSProfile([1, 4], [1, 4], [[0.1, 10.0], [0.1, 10.0]], [0.0, 0.0])
    none = sim.simulate(streams, 4, "scheduler", steep, max_new_tokens=13)
    assert none["mean_width"] == 1 and none["tau"] == pytest.approx(1.0)
    skip = SPSProfile([1, 4], [1, 4], [[0.1, 0.11], [0.1, 0.11]], [5.0, 5.0])
    skipped = sim.simulate(streams, 4, "scheduler", skip, max_new_tokens=13, probe_interval=4)
    assert skipped["rounds"] > 5  # after the first round the draft is skipped (AR steps)


def test_simulator_replays_a_sweep_and_compares(tmp_path):
    traces = tmp_path / "traces.jsonl"
    rows = [
        {"load": 2, "policy": "full", "request": i, "confidences": [[0.9, 0.8, 0.7]] * 6,
         "accept_lengths": [2, 3, 0, 1, 3, 2], "verify_lengths": [3] * 6, "new_tokens": 12}
        for i in range(2)
    ]  # fmt: skip
    traces.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = sim.load_traces(traces)
    assert [t.accepted for t in loaded[2][0]] == [2, 3, 0, 1, 3, 2]
    assert loaded[2][0][0].survival == pytest.approx([0.9, 0.72, 0.504])
    pred = sim.predict(loaded, _profile(0.01), [2], ["ar", "full"], max_new_tokens=12)
    measured = {"cells": {"2/ar": {"total_tokens_per_s": pred[0]["total_tokens_per_s"] * 2,
                                   "per_user_tokens_per_s": pred[0]["per_user_tokens_per_s"]}}}  # fmt: skip
    cmp = sim.compare(pred, measured)
    assert cmp["rows"][0]["total_error"] == pytest.approx(-0.5)
    assert cmp["mean_abs_error_per_user"] == pytest.approx(0.0)
    profile = tmp_path / "p.json"
    _profile(0.01).save(profile)
    (tmp_path / "results.json").write_text(
        json.dumps({"conditions": {"loads": [2], "max_new_tokens": 12}, **measured})
    )
    cmd = [sys.executable, "eval/simulate.py", "--traces", str(traces), "--profile", str(profile),
           "--measured", str(tmp_path / "results.json"), "--policies", "ar", "full"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "simulate.json").read_text())
    assert out["comparison"]["rows"][0]["total_error"] == pytest.approx(-0.5)
    roof = [sys.executable, "eval/simulate.py", "--traces", str(traces), "--roofline",
            "weight_bytes=16e9", "hbm_bytes_per_s=4.8e12", "flops_per_s=990e12",
            "overhead_s=0.001", "--loads", "1", "64", "--max-new-tokens", "32",
            "--out", str(tmp_path / "roof")]  # fmt: skip
    proc = subprocess.run(roof, cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    pred = json.loads((tmp_path / "roof" / "simulate.json").read_text())["predicted"]
    ar1 = next(p for p in pred if p["load"] == 1 and p["policy"] == "ar")
    assert ar1["total_tokens_per_s"] == pytest.approx(1 / (0.001 + 16e9 / 4.8e12), rel=1e-6)


def test_profile_report_and_plot(tmp_path):
    prof = Roofline(16e9, 4.8e12, 990e12, 1e-3, draft_weight_bytes=1e9).profile([1, 64], [1, 8])
    assert prof.times[0][1] == prof.times[0][0]  # 8 tokens: still weight-bandwidth bound
    assert prof.times[1][1] == pytest.approx(1e-3 + 2 * 8e9 * 512 / 990e12)  # 512: compute bound
    assert prof.draft_times[0] == pytest.approx(1e9 / 4.8e12)
    md = profile_markdown(prof, "qwen3-8b")
    assert "| 64 |" in md and "draft round" in md
    assert plot_profile(prof, tmp_path / "sps.png", 3).read_bytes()[:4] == b"\x89PNG"


def test_sweep_repeats_keep_the_median_repeat(tiny_target, tmp_path):
    cells = [
        {"total_tokens_per_s": 30.0, "tau": 3.0, "matches_ar": 1.0},
        {"total_tokens_per_s": 10.0, "tau": 1.0, "matches_ar": 0.5},
        {"total_tokens_per_s": 20.0, "tau": 2.0, "matches_ar": 1.0},
    ]
    med = ls.median_cell(cells)
    assert med["tau"] == 2.0 and med["total_tokens_per_s_reps"] == [30.0, 10.0, 20.0]
    assert med["matches_ar"] == 0.5  # the worst repeat's: a mismatch is never hidden
    assert ls.median_cell(cells[:2])["tau"] == 1.0  # even count: the lower middle
    model, _ = tiny_target("qwen3")
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, (5, 7), 3)
    refs = [greedy_reference(model, p, 8) for p in prompts]
    draft = OracleDraft([p + r for p, r in zip(prompts, refs)], vocab, gamma=GAMMA, seed=1)
    decs = ls.decoders(
        model, draft, ["ar", "scheduler"], threshold=0.5, sps=_profile(), temperature=0.0,
        max_length=128,
    )  # fmt: skip
    for dec in decs.values():
        dec.options.observer = draft.recorder
    res = ls.run_sweep(decs, prompts, [2], max_new_tokens=8, eos=None, seed=0, repeats=3,
                       out_dir=tmp_path, conditions={}, progress=lambda m: None)  # fmt: skip
    for cell in res["cells"].values():
        reps = cell["total_tokens_per_s_reps"]
        assert len(reps) == 3 and cell["total_tokens_per_s"] == sorted(reps)[1]
    assert res["cells"]["2/scheduler"]["matches_ar"] == 1.0
    traces = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert len(traces) == 2  # the first repeat's traces only: one row per request


def test_full_load_throughput_leaves_out_the_closed_batchs_tail():
    out = GenerationOutput.empty(2)
    out.new_tokens, out.finish_s = [9, 9], [1.0, 1.5]
    out.wall_time_s, out.prefill_s = 1.5, 0.1
    out.accept_lengths, out.verify_lengths, out.confidences = [[], []], [[], []], [[], []]
    out.record_round([0, 1], 0.1, 0.3, [2, 2], [2, 1], [[0.9, 0.8], [0.9, 0.5]])  # 5 tokens
    out.record_round([0, 1], 0.0, 0.2)  # an AR step: 2 tokens
    out.record_round([1], 0.0, 0.15)  # request 0 finished: load 1, the tail
    assert out.round_committed == [5, 2, 1]
    cell = ls.cell_metrics(out, load=2)
    assert cell["full_load_tokens_per_s"] == pytest.approx((5 + 2) / (0.4 + 0.2))
    cells = [
        dict(cell, full_load_tokens_per_s=x, total_tokens_per_s=t)
        for x, t in ((5.0, 1.0), (9.0, 2.0), (7.0, 3.0))
    ]
    med = ls.median_cell(cells)
    assert med["full_load_tokens_per_s"] == 7.0 and med["total_tokens_per_s"] == 2.0
