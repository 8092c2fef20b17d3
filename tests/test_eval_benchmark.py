"""eval/benchmark.py end to end on a tiny target + a random tiny draft, and its config schema."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from dspark.eval import runner
from dspark.eval.benchmark_config import BenchmarkConfig, register

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf" / "benchmark"


def _draft(tiny_target, path, **overrides):
    from dspark.config import DSparkConfig, choose_mask_token_id
    from dspark.modeling import DSparkDraftModel

    target, tok = tiny_target("qwen3")
    kw = dict(num_hidden_layers=1, block_size=3, markov_rank=8, target_name_or_path="tiny-qwen3")
    kw.update(overrides)
    cfg = DSparkConfig.from_target_config(
        target.config, mask_token_id=choose_mask_token_id(tok, target.config.vocab_size), **kw
    )
    torch.manual_seed(0)
    DSparkDraftModel.from_target(target, cfg).save_pretrained(path)
    return path


@pytest.fixture
def bench_dir(tmp_path):
    d = tmp_path / "bench"
    d.mkdir()
    rows = [{"turns": ["What is 2 + 3?", "And times 4?"]}, {"turns": ["Say hi."]}]
    (d / "tiny.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _compose(overrides):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="benchmark", overrides=overrides)


def test_script_end_to_end(tiny_target, tmp_path, bench_dir):
    draft = _draft(tiny_target, tmp_path / "draft")
    out = tmp_path / "out"
    cmd = [
        sys.executable, "eval/benchmark.py", f"draft={draft}", "datasets=[tiny,embedded]",
        f"bench_dir={bench_dir}", "num_prompts=2", "max_new_tokens=6", "all_turns=true",
        "baselines.assistant_layers=1", "num_threads=1", f"output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## Speed" in proc.stdout  # the report is printed
    res = json.loads((out / "results.json").read_text())
    c = res["conditions"]
    assert c["target"] == "tiny-qwen3"  # from the draft's config
    for key in ("draft", "draft_config", "temperature", "top_p", "top_k", "block_size",
                "batch_size", "max_new_tokens", "device", "dtype", "torch", "transformers",
                "seed", "num_prompts", "cpu_threads"):  # fmt: skip
        assert key in c, key
    assert c["block_size"] == 3 and c["draft_config"]["markov_rank"] == 8
    tiny = res["datasets"]["tiny"]
    assert tiny["requests"] == 3  # two first turns + one second turn
    acc = tiny["acceptance"]
    assert acc["tau"] == pytest.approx(acc["tau_no_bonus"] + 1)
    assert len(acc["conditional_acceptance"]) == len(acc["survival"]) == 3
    assert 0 < acc["verify_rate"] <= 1 and acc["drafted"] == 3 * acc["rounds"]
    s = tiny["speed"]
    assert s["speedup"] == pytest.approx(
        s["speculative"]["tokens_per_s"] / s["autoregressive"]["tokens_per_s"]
    )
    assert s["decoder_efficiency"] == pytest.approx(s["speedup"] / acc["tau"])
    assert s["greedy_match"] == 1.0  # lossless at T=0
    assert set(tiny["baselines"]) == {"hf_generate", "hf_assisted", "hf_prompt_lookup"}
    assert tiny["hf_generate_matches_autoregressive"] == 1.0
    assert tiny["calibration"]["conditional"]["ece"] is not None
    assert res["datasets"]["embedded"]["requests"] == 2
    assert res["sts"]["temperatures"] and len(res["sts"]["temperatures"]) == 3
    mon = tiny["monitoring"]
    assert mon["speculative"]["rounds"] == acc["rounds"]  # one timed draft/verify pair a round
    assert (
        mon["speculative"]["draft_ms_per_round"] > 0
        and mon["speculative"]["verify_ms_per_round"] > 0
    )
    assert mon["speculative"]["draft_over_verify"] == pytest.approx(
        mon["speculative"]["draft_ms_per_round"] / mon["speculative"]["verify_ms_per_round"]
    )
    assert mon["autoregressive"]["draft_ms_per_round"] == 0
    for png in ("acceptance_per_position.png", "speedup.png", "reliability.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == 5 and sum(r["dataset"] == "tiny" for r in rounds) == 3
    assert sum(len(r["accept_lengths"]) for r in rounds[:3]) == acc["rounds"]
    report = (out / "report.md").read_text()
    for heading in ("## Acceptance", "## Conditional acceptance", "## Survival", "## Speed",
                    "## Versus transformers", "## Confidence calibration",
                    "## Draft vs verify"):  # fmt: skip
        assert heading in report
    # the break-even line is the formula by hand on the monitored times, with the verdict
    be = (
        mon["speculative"]["draft_ms_per_round"] + mon["speculative"]["verify_ms_per_round"]
    ) / mon["autoregressive"]["verify_ms_per_round"]
    verdict = "pays off" if acc["tau"] > be else "does not pay off"
    assert f"tiny: a round costs {be:.2f} plain AR steps, so break-even tau = {be:.2f}" in report
    assert f"this draft's tau {acc['tau']:.2f} {verdict} here" in report
    # every table states its conditions
    tables = report.split("\n## ")[1:]
    assert all("Conditions" in t or "| key | value |" in t for t in tables if "|---" in t)


def test_no_confidence_head_sampled_batched(tiny_target, tmp_path, bench_dir):
    from dspark.eval.runner import run

    draft = _draft(tiny_target, tmp_path / "draft", enable_confidence_head=False)
    cfg = _compose([f"draft={draft}", "datasets=[tiny]", f"bench_dir={bench_dir}",
                    "max_new_tokens=5", "temperature=0.8", "top_k=20", "batch_size=2",
                    "baselines.run=[]", "plots=false", "warmup=0"])  # fmt: skip
    res, report = run(cfg, tmp_path / "out")
    d = res["datasets"]["tiny"]
    assert d["requests"] == 2 and d["speed"]["greedy_match"] is None
    assert "calibration" not in res and "baselines" not in d
    assert res["conditions"]["temperature"] == 0.8 and "T=0.8" in report


def test_results_json_is_written_last_so_it_means_the_run_finished(
    tiny_target, tmp_path, bench_dir, monkeypatch
):
    """make's targets read an output's results.json as done: a run that fails while writing
    its report leaves none, and a finished one leaves a whole file beside its rounds."""
    draft = _draft(tiny_target, tmp_path / "draft")
    cfg = _compose([f"draft={draft}", "datasets=[tiny]", f"bench_dir={bench_dir}",
                    "max_new_tokens=4", "baselines.run=[]", "plots=false", "warmup=0"])  # fmt: skip

    def broken(*a, **k):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(runner, "render_report", broken)
        with pytest.raises(OSError):
            runner.run(cfg, tmp_path / "out")
    assert not (tmp_path / "out" / "results.json").exists()
    res, _ = runner.run(cfg, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "results.json").read_text())["datasets"].keys() == {
        "tiny"
    }
    rounds = (tmp_path / "out" / "rounds.jsonl").read_text().splitlines()
    assert len(rounds) == res["datasets"]["tiny"]["requests"] == 2


def test_schema_defaults_live_in_the_dataclass():
    from omegaconf import OmegaConf

    cfg = _compose(["draft=x"])
    # the composed config is the schema itself, every key (nested ones too), nothing restated
    want = OmegaConf.structured(BenchmarkConfig)
    want.draft = "x"
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(want)
    for path in CONF.glob("*.yaml"):  # the only file here selects the schema and sets Hydra's
        assert set(OmegaConf.load(path)) <= {"defaults", "hydra"}, path


def test_misspelt_key_fails_clearly():
    with pytest.raises(ConfigCompositionException, match="num_promts"):
        _compose(["draft=x", "num_promts=3"])
    proc = subprocess.run(
        [sys.executable, "eval/benchmark.py", "draft=x", "num_promts=3"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "unknown config key 'num_promts'" in proc.stderr
    assert "Did you mean 'num_prompts'?" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "eval/benchmark.py", "draft=x", "+calibration.binz=3"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "Did you mean 'calibration.bins'?" in proc.stderr


def test_missing_draft_fails_clearly(tmp_path):
    proc = subprocess.run(
        [sys.executable, "eval/benchmark.py", f"hydra.run.dir={tmp_path}"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "pass draft=PATH" in proc.stderr


def test_auto_dtype_verify_length_and_fastest_plain(tiny_target, tmp_path, bench_dir):
    from dspark.dtype_choice import best_verify_length, choose_dtype
    from dspark.eval.runner import run

    draft = _draft(tiny_target, tmp_path / "run" / "draft")
    accept = [0.6, 0.3, 0.2]  # the training run's held-out eval, beside its draft
    final = {f"eval/greedy_accept@{k + 1}": a for k, a in enumerate(accept)}
    (tmp_path / "run" / "results.json").write_text(json.dumps({"final_eval": final}))
    cfg = _compose([f"draft={draft}", "datasets=[tiny]", f"bench_dir={bench_dir}",
                    "max_new_tokens=8", "baselines.run=[]", "plots=false", "warmup=0",
                    "dtype=auto", "verify_length=auto", "baseline_dtypes=[float32,bfloat16]",
                    "probe_repeats=1", "num_threads=1"])  # fmt: skip
    res, report = run(cfg, tmp_path / "out")
    auto = res["auto_settings"]
    assert auto["acceptance"]["accept"] == accept
    d = auto["dtype"]
    measured = d["measured"]
    assert set(measured) == {"float32", "bfloat16"}
    # the decision is the pure function of what was measured, and the run used it
    assert d["dtype"] == choose_dtype(measured, "speculative", accept, 3)["dtype"]
    assert res["conditions"]["dtype"] == d["dtype"] == res["conditions"]["draft_dtype"]
    assert res["conditions"]["dtype_requested"] == "auto"
    L = best_verify_length(measured[d["dtype"]], accept)["L"]
    assert auto["verify_length"]["chosen"] == res["conditions"]["verify_length"] == L
    assert len(auto["verify_length"]["curve"]) == 3
    rounds = [json.loads(line) for line in (tmp_path / "out" / "rounds.jsonl").open()]
    assert max(v for r in rounds for v in r["verify_lengths"]) <= L
    tiny = res["datasets"]["tiny"]
    assert tiny["speed"]["greedy_match"] == 1.0  # the shorter verify length is lossless
    f = tiny["speed"]["fastest_plain"]
    plain = f["plain_by_dtype"]
    assert set(plain) == {"float32", "bfloat16"}
    assert f["fastest_plain_dtype"] == max(plain, key=plain.get)
    spec = tiny["speed"]["speculative"]["tokens_per_s"]
    assert f["speedup_vs_fastest_plain"] == pytest.approx(spec / max(plain.values()))
    assert f["speedup_vs_same_dtype_plain"] == pytest.approx(tiny["speed"]["speedup"])
    assert res["overall"]["fastest_plain"]["fastest_plain_dtype"] in plain
    for text in ("## Against the fastest plain decoding", "## Measured choices",
                 f"**Chosen dtype: {d['dtype']}**", f"**Verify length: {L}**"):  # fmt: skip
        assert text in report


def test_explicit_dtype_one_plain_dtype_and_full_block(tiny_target, tmp_path, bench_dir):
    from dspark.eval.runner import run

    draft = _draft(tiny_target, tmp_path / "draft")  # no training run beside it
    cfg = _compose([f"draft={draft}", "datasets=[tiny]", f"bench_dir={bench_dir}",
                    "max_new_tokens=5", "baselines.run=[]", "plots=false", "warmup=0",
                    "num_prompts=1"])  # fmt: skip
    res, report = run(cfg, tmp_path / "out")
    auto = res["auto_settings"]
    assert "dtype" not in auto and res["conditions"]["dtype"] == "float32"
    assert auto["verify_length"]["chosen"] == 3 and "full block" in auto["verify_length"]["from"]
    f = res["datasets"]["tiny"]["speed"]["fastest_plain"]
    assert list(f["plain_by_dtype"]) == ["float32"] and f["fastest_plain_dtype"] == "float32"
    assert f["speedup_vs_fastest_plain"] == f["speedup_vs_same_dtype_plain"]


# The dtype probe's plain AR steps (batch 1, SmolLM2-135M, 2 threads) on two CPU kinds, as in
# tests/test_dtype_choice.py: an AVX-512-BF16 AMD EPYC without AMX (bf16 18.9 ms, fp32 37.1)
# and an AMX Xeon (fp32 36.6 ms, bf16 58.6).
EPYC_AVX512 = {"bfloat16": {"t_ar": 0.0189}, "float32": {"t_ar": 0.0371}}
XEON_AMX = {"bfloat16": {"t_ar": 0.0586}, "float32": {"t_ar": 0.0366}}


@pytest.mark.parametrize(
    "measured, own, margin, skipped",
    [(EPYC_AVX512, "bfloat16", 1.25, {"float32"}),  # 1.96x: cannot be the fastest plain
     (EPYC_AVX512, "bfloat16", 0.0, set()),  # no margin: every baseline dtype is decoded
     (EPYC_AVX512, "bfloat16", 2.0, set()),  # 1.96x is within 2x
     (EPYC_AVX512, "float32", 1.25, set()),  # the decoding dtype is always decoded
     (XEON_AMX, "float32", 1.25, {"bfloat16"}),  # 1.60x
     (XEON_AMX, "float32", 1.7, set()),
     (XEON_AMX, "bfloat16", 1.25, set())],  # decoding in bf16: fp32 is the fastest, timed
)  # fmt: skip
def test_probe_skips_only_dtypes_slower_than_the_margin(measured, own, margin, skipped):
    from types import SimpleNamespace

    from dspark.eval.fastest_plain import probe_skipped

    cfg = SimpleNamespace(baseline_dtypes=["float32", "bfloat16"], baseline_probe_margin=margin)
    out = probe_skipped(cfg, {"dtype": {"measured": measured}}, own)
    assert set(out) == skipped
    best = min(p["t_ar"] for p in measured.values())
    for d, s in out.items():
        assert s["ratio"] == pytest.approx(measured[d]["t_ar"] / best) and s["ratio"] > margin
    assert probe_skipped(cfg, {}, own) == {}  # an explicit dtype: no probe, nothing skipped


def test_probe_margin_skips_the_slower_baseline_end_to_end(tiny_target, tmp_path, bench_dir):
    from dspark.eval.runner import run

    draft = _draft(tiny_target, tmp_path / "draft")
    cfg = _compose([f"draft={draft}", "datasets=[tiny]", f"bench_dir={bench_dir}",
                    "max_new_tokens=5", "baselines.run=[]", "plots=false", "warmup=0",
                    "num_prompts=1", "dtype=auto", "baseline_dtypes=[float32,bfloat16]",
                    "baseline_probe_margin=1", "probe_repeats=1", "num_threads=1"])  # fmt: skip
    res, report = run(cfg, tmp_path / "out")
    auto = res["auto_settings"]
    own = res["conditions"]["dtype"]
    steps = {d: p["t_ar"] for d, p in auto["dtype"]["measured"].items()}
    # margin 1: every dtype but the decoding one that the probe measured slower than the
    # fastest is left out, and only those
    want = {d for d, t in steps.items() if d != own and t > min(steps.values())}
    assert set(auto["baseline_skipped"]) == want
    plain = res["datasets"]["tiny"]["speed"]["fastest_plain"]["plain_by_dtype"]
    assert set(plain) == {"float32", "bfloat16"} - want and own in plain
    assert res["conditions"]["baseline_dtypes"] == [own, *sorted(set(plain) - {own})]
    for d in want:
        assert f"Not decoded end to end: {d}" in report


@pytest.mark.parametrize(
    "override, fix",
    [("verify_length=abc", "verify_length='abc' must be auto, full or an integer"),
     ("baseline_dtypes=[fp8]", "baseline_dtypes=['fp8']"),
     ("probe_repeats=0", "probe_repeats=0 must be >= 1"),
     ("baseline_probe_margin=0.5", "baseline_probe_margin=0.5 must be 0")],
)  # fmt: skip
def test_bad_auto_settings_fail_clearly(override, fix):
    from dspark.errors import BadInputError
    from dspark.eval.benchmark_config import check

    with pytest.raises(BadInputError) as e:
        check(_compose(["draft=x", "datasets=[embedded]", override]))
    assert fix in str(e.value)


def test_the_report_names_the_verify_length_it_ran(tiny_target, tmp_path, bench_dir):
    """verify_length below the block: the conditions say how many drafts a round verified,
    not "full block"."""
    draft = _draft(tiny_target, tmp_path / "draft")
    base = [f"draft={draft}", "datasets=[tiny]", f"bench_dir={bench_dir}", "max_new_tokens=4",
            "baselines.run=[]", "plots=false", "warmup=0"]  # fmt: skip
    res, report = runner.run(_compose([*base, "verify_length=2"]), tmp_path / "two")
    block = res["conditions"]["block_size"]
    assert block > 2 and res["conditions"]["verify_length"] == 2
    assert f"verification: the first 2 of the block's {block} drafts (verify_length)" in report
    _, full = runner.run(_compose([*base, "verify_length=full"]), tmp_path / "full")
    assert "verification: full block," in full
