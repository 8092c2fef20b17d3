"""The dtype and verify-length decisions on measured profiles of three CPU kinds (pure math,
derived by hand below), the probe's report fields and cache on a tiny target, and the
losslessness of a shorter verify length."""

import json

import pytest
import torch

from dspark.dtype_choice import (
    best_verify_length,
    choose_dtype,
    expected_tokens,
    nondecreasing_fit,
)

# The quickstart draft's held-out greedy acceptance per position (eval/greedy_accept@k of a
# 240-step run on 320 embedded answers): P(draft k accepted | drafts < k accepted).
ACCEPT = [0.376, 0.235, 0.173, 0.135, 0.129, 0.123, 0.122]
MS = 1e-3


def _line(n_a: int, t_a: float, n_b: int, t_b: float, ns) -> dict[int, float]:
    """Verify seconds at n tokens on the straight line through two measured points."""
    return {n: t_a + (t_b - t_a) * (n - n_a) / (n_b - n_a) for n in ns}


# AMX Xeon, 2 threads, SmolLM2-135M, batch 1 (README "What a round costs on this CPU"):
# fp32 AR 36.6 ms, verify 2 / 8 tokens 71.6 / 73.9 ms, draft round 18.5 ms;
# bf16 AR 58.6 ms, verify 2 / 8 tokens 58.2 / 60.8 ms, draft round 22.2 ms. Points in between on
# the line through the two measured ones.
AMX_XEON = {
    "float32": {"t_ar": 36.6 * MS, "t_verify": _line(2, 71.6 * MS, 8, 73.9 * MS, range(2, 9)),
                "t_draft": 18.5 * MS},
    "bfloat16": {"t_ar": 58.6 * MS, "t_verify": _line(2, 58.2 * MS, 8, 60.8 * MS, range(2, 9)),
                 "t_draft": 22.2 * MS},
}  # fmt: skip
# 2-core AVX-512-BF16 AMD EPYC (no AMX): bf16 AR 18.9 ms, fp32 37.1 ms; an 8-token verify costs
# 1.37 (bf16) / 1.53 (fp32) AR steps; draft round 9.4 / 11.2 ms. The curve: the line from the AR
# step (1 token) to the 8-token verify.
AVX512_EPYC = {
    "float32": {"t_ar": 37.1 * MS, "t_verify": _line(1, 37.1 * MS, 8, 1.53 * 37.1 * MS, range(2, 9)),
                "t_draft": 11.2 * MS},
    "bfloat16": {"t_ar": 18.9 * MS, "t_verify": _line(1, 18.9 * MS, 8, 1.37 * 18.9 * MS, range(2, 9)),
                 "t_draft": 9.4 * MS},
}  # fmt: skip
# 2-core AVX2-only AMD EPYC (no AVX-512): a batch-32 regeneration step 147 ms fp32, 492 ms bf16;
# the HF 1-token step (batch 1) 65 ms fp32, 43 ms bf16. AR steps only (t_verify: the 1 token).
AVX2_EPYC_B32 = {
    "float32": {"t_ar": 147 * MS, "t_verify": {1: 147 * MS}, "t_draft": None},
    "bfloat16": {"t_ar": 492 * MS, "t_verify": {1: 492 * MS}, "t_draft": None},
}
AVX2_EPYC_B1 = {
    "float32": {"t_ar": 65 * MS, "t_verify": {1: 65 * MS}, "t_draft": None},
    "bfloat16": {"t_ar": 43 * MS, "t_verify": {1: 43 * MS}, "t_draft": None},
}


# 2-core AVX2-only AMD EPYC (machine B), batch 1, the 700-step quickstart draft (4,096-token
# vocabulary), row-exact bf16 verify passes, medians of the benchmark's probe: per verify
# length L the draft round that drafts only L tokens (`t_draft_steps`).
AVX2_EPYC_B1_SPEC = {
    "float32": {"t_ar": 82.3 * MS, "t_draft": 13.3 * MS,
                "t_verify": dict(zip(range(2, 9), [v * MS for v in (120.4, 127.3, 110.9, 106.6, 117.0, 143.4, 144.7)])),
                "t_draft_steps": dict(zip(range(1, 8), [v * MS for v in (10.7, 12.6, 13.4, 12.6, 12.7, 12.3, 13.3)]))},
    "bfloat16": {"t_ar": 52.5 * MS, "t_draft": 14.8 * MS,
                 "t_verify": dict(zip(range(2, 9), [v * MS for v in (77.5, 104.6, 123.7, 150.0, 165.3, 196.8, 214.7)])),
                 "t_draft_steps": dict(zip(range(1, 8), [v * MS for v in (10.8, 11.4, 11.8, 12.6, 13.6, 14.2, 14.8)]))},
}  # fmt: skip
ACCEPT_700 = [0.479, 0.400, 0.354, 0.291, 0.279, 0.257, 0.244]


def test_avx2_epyc_prices_each_verify_length_with_its_own_draft_round():
    # tau(L) = 1.479, 1.6706, 1.73843, 1.75816, 1.76367. bf16: L = 1 (10.8 + 77.5) / 1.479 =
    # 59.70 ms, L = 2 (11.4 + 104.6) / 1.6706 = 69.44 -> L = 1. fp32: L = 3 (13.4 + 110.9) /
    # 1.73843 = 71.50, L = 4 (12.6 + 106.6) / 1.75816 = 67.80, L = 5 (12.7 + 117.0) / 1.76367
    # = 73.54 -> L = 4, dearer than bf16's 59.70, so bf16 verifying one draft.
    d = choose_dtype(AVX2_EPYC_B1_SPEC, "speculative", ACCEPT_700, gamma=7)
    assert d["dtype"] == "bfloat16" and d["costs"]["bfloat16"]["L"] == 1
    assert d["costs"]["bfloat16"]["cost_s"] == pytest.approx(88.3 * MS / 1.479, rel=1e-6)
    fp32 = best_verify_length(AVX2_EPYC_B1_SPEC["float32"], ACCEPT_700)
    assert fp32["L"] == 4 and fp32["s_per_token"] == pytest.approx(119.2 * MS / 1.758164, rel=1e-5)
    # without per-length draft rounds every L pays the whole block's 14.8 ms
    whole = {k: v for k, v in AVX2_EPYC_B1_SPEC["bfloat16"].items() if k != "t_draft_steps"}
    assert best_verify_length(whole, ACCEPT_700)["s_per_token"] == pytest.approx(92.3 * MS / 1.479)
    # and the plain bf16 step (52.5 ms) is cheaper still: this draft does not pay on this CPU
    assert d["costs"]["bfloat16"]["cost_s"] > AVX2_EPYC_B1_SPEC["bfloat16"]["t_ar"]
    # JSON string keys in t_draft_steps decide the same
    text = json.loads(json.dumps(AVX2_EPYC_B1_SPEC))
    assert choose_dtype(text, "speculative", ACCEPT_700, gamma=7)["costs"] == d["costs"]


def test_amx_xeon_plain_in_fp32_speculation_in_bf16_verifying_three():
    # plain: 36.6 < 58.6 ms -> fp32 (oneDNN's bf16 matrix-vector path is the slower one)
    assert choose_dtype(AMX_XEON, "plain")["dtype"] == "float32"
    # tau(L) = 1.376, 1.4644, 1.4797, 1.4818 for L = 1..4. bf16 rounds 22.2 + 58.2 + 0.433 (L-1):
    # 80.40 / 1.376 = 58.43, 80.83 / 1.4644 = 55.20, 81.27 / 1.4797 = 54.92, 81.70 / 1.4818 =
    # 55.14 ms a token -> L = 3; fp32's best (L = 3: 18.5 + 72.37 = 90.87 / 1.4797 = 61.41 ms) is
    # dearer, so speculation runs in bf16: the cheap bf16 verify outweighs the slower AR step.
    d = choose_dtype(AMX_XEON, "speculative", ACCEPT, gamma=7)
    assert d["dtype"] == "bfloat16" and d["costs"]["bfloat16"]["L"] == 3
    assert d["costs"]["bfloat16"]["cost_s"] == pytest.approx(81.2667 * MS / 1.47966, rel=1e-4)
    best = best_verify_length(AMX_XEON["bfloat16"], ACCEPT)
    assert best["L"] == 3 and len(best["curve"]) == 7
    # and against the fastest plain decoding (fp32, 36.6 ms) this draft does not pay here
    assert best["s_per_token"] > AMX_XEON["float32"]["t_ar"]


def test_avx512_epyc_bf16_everywhere_verifying_two():
    assert choose_dtype(AVX512_EPYC, "plain")["dtype"] == "bfloat16"  # 18.9 < 37.1 ms
    # bf16 verify of n tokens: 18.9 + (n - 1) * 1.0 ms. L = 1: (9.4 + 19.9) / 1.376 = 21.29,
    # L = 2: (9.4 + 20.9) / 1.4644 = 20.69, L = 3: (9.4 + 21.9) / 1.4797 = 21.15 -> L = 2: the
    # verify curve is steeper than on AMX, so one draft fewer pays best.
    d = choose_dtype(AVX512_EPYC, "speculative", ACCEPT, gamma=7)
    assert d["dtype"] == "bfloat16" and d["costs"]["bfloat16"]["L"] == 2
    assert best_verify_length(AVX512_EPYC["bfloat16"], ACCEPT)["L"] == 2
    assert best_verify_length(AVX512_EPYC["float32"], ACCEPT)["L"] == 2  # 36.82 ms vs 37.14 / 38.34


def test_avx2_epyc_batched_fp32_single_row_bf16():
    # regeneration's batch-32 step: 147 < 492 ms -> fp32; one row (benchmark's plain): 43 < 65
    assert choose_dtype(AVX2_EPYC_B32, "plain")["dtype"] == "float32"
    assert choose_dtype(AVX2_EPYC_B1, "plain")["dtype"] == "bfloat16"
    assert choose_dtype(AVX2_EPYC_B32, "capture")["dtype"] == "float32"


def test_the_three_cpus_decide_differently():
    amx = choose_dtype(AMX_XEON, "plain")["dtype"], best_verify_length(AMX_XEON["bfloat16"], ACCEPT)
    epyc = (
        choose_dtype(AVX512_EPYC, "plain")["dtype"],
        best_verify_length(AVX512_EPYC["bfloat16"], ACCEPT),
    )
    avx2 = choose_dtype(AVX2_EPYC_B32, "plain")["dtype"]
    assert (amx[0], amx[1]["L"]) == ("float32", 3)
    assert (epyc[0], epyc[1]["L"]) == ("bfloat16", 2)
    assert avx2 == "float32"


def test_speculative_without_acceptance_compares_full_block_rounds():
    # no tau: the same in every dtype, so the cheaper full-block round (draft + 8-token verify)
    d = choose_dtype(AMX_XEON, "speculative", None, gamma=7)
    assert d["dtype"] == "bfloat16"  # 22.2 + 60.8 < 18.5 + 73.9
    assert d["costs"]["float32"]["cost_s"] == pytest.approx((18.5 + 73.9) * MS)


def test_json_profiles_with_string_keys_decide_the_same():
    text = json.loads(json.dumps(AVX512_EPYC))
    assert best_verify_length(text["bfloat16"], ACCEPT)["L"] == 2
    assert expected_tokens(ACCEPT, 2) == pytest.approx(1 + 0.376 + 0.376 * 0.235)


def _minmax_isotonic(y: list[float]) -> list[float]:
    """The isotonic (non-decreasing, least-squares) fit by its min-max formula, an independent
    reference for pool-adjacent-violators: f_i = max_{j <= i} min_{k >= i} mean(y_j..y_k)."""
    mean = lambda a, b: sum(y[a : b + 1]) / (b + 1 - a)  # noqa: E731
    n = len(y)
    return [max(min(mean(j, k) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]


def test_verify_curve_fit_pools_a_dip_and_matches_the_minmax_formula():
    # machine D's fp32 verify medians for 2..5 tokens (ms) on a drifting host: 3 tokens measured
    # dearer than 4 and 5. The fit pools 121.9, 88.6, 100.4 into their mean, by hand 103.633
    measured = [95.9, 121.9, 88.6, 100.4]
    fit = nondecreasing_fit(measured)
    assert fit == pytest.approx([95.9, 103.6333, 103.6333, 103.6333], abs=1e-4)
    assert nondecreasing_fit([1.0, 2.0, 2.0, 5.0]) == [1.0, 2.0, 2.0, 5.0]  # already monotone
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        y = torch.rand(int(torch.randint(1, 9, (1,), generator=gen)), generator=gen).tolist()
        got = nondecreasing_fit(y)
        assert got == pytest.approx(_minmax_isotonic(y), abs=1e-12)
        assert all(a <= b + 1e-15 for a, b in zip(got, got[1:]))
        assert sum(got) == pytest.approx(sum(y))  # each pooled run keeps its mean


def test_probe_rounds_interleave_the_dtypes_against_host_drift():
    """Two dtypes of equal true cost on a host that gets slower every call: timed one dtype
    after the other (the old probe), the second looks ~(figures x rounds) calls dearer; in
    interleaved rounds of alternating order their medians stay within one round's drift."""
    from dspark.dtype_probe import _sample

    calls: list[str] = []

    def timer(name):
        def fn():
            calls.append(name)
            return 1.0 + 0.01 * len(calls)  # the host drifts: each call 1% dearer than the last

        return fn

    figures = ("t_ar", "v2", "v3")
    points = {d: {k: timer(f"{d}:{k}") for k in figures} for d in ("float32", "bfloat16")}
    med = _sample(points, rounds=3)
    assert len(calls) == 2 * 3 * 3
    # the rounds alternate which dtype goes first: A B | B A | A B
    order = [c.split(":")[0] for c in calls[:: len(figures)]]
    assert order == ["float32", "bfloat16", "bfloat16", "float32", "float32", "bfloat16"]
    for k in figures:
        gap = abs(med["float32"][k] - med["bfloat16"][k])
        assert gap <= 0.01 * len(figures) + 1e-9  # within one dtype's share of a round
    calls.clear()  # the same timers probed one dtype after the other fail that bound
    one_by_one = {d: _sample({d: points[d]}, rounds=3)[d] for d in points}
    assert one_by_one["bfloat16"]["t_ar"] - one_by_one["float32"]["t_ar"] > 0.01 * len(figures) * 2


def test_probe_on_a_tiny_target_reports_and_caches(tiny_target, one_thread):
    from dspark.config import DSparkConfig
    from dspark.dtype_probe import choose
    from dspark.modeling import DSparkDraftModel

    target, _ = tiny_target("llama")
    cfg = DSparkConfig.from_target_config(
        target.config, num_hidden_layers=1, block_size=3, markov_rank=8, mask_token_id=0
    )
    draft = DSparkDraftModel.from_target(target, cfg).eval()
    before = next(target.parameters()).dtype
    kw = dict(job="speculative", batch=2, accept=[0.5, 0.4, 0.3], context_len=16, repeats=1)
    first = choose(target, draft, **kw)
    assert next(target.parameters()).dtype == before  # probed on copies
    assert set(first["measured"]) == {"float32", "bfloat16"}
    assert first["dtype"] in first["measured"] and not first["cached"]
    for p in first["measured"].values():
        assert set(p["t_verify"]) == {2, 3, 4} and p["t_draft"] is not None
        curve = [p["t_verify"][n] for n in (2, 3, 4)]  # fitted: never cheaper for more tokens
        assert curve == pytest.approx(
            nondecreasing_fit([p["t_verify_measured"][n] for n in (2, 3, 4)])
        )
        steps = p["t_draft_steps"]  # a round per verify length, never dearer for fewer drafts
        assert set(steps) == {1, 2, 3} and steps[1] <= steps[2] <= steps[3]
    assert first["conditions"]["batch"] == 2 and first["conditions"]["device"]
    assert first["conditions"]["exact_rows"] is None  # each dtype's decoder default
    again = choose(target, draft, **kw)
    assert again["cached"] and again["measured"] == first["measured"]  # read back, same decision
    assert again["dtype"] == first["dtype"]


@pytest.mark.parametrize("max_verify", [1, 2])
def test_a_shorter_verify_length_keeps_greedy_output(tiny_target, one_thread, max_verify):
    from dspark.config import DSparkConfig
    from dspark.decoding import DecoderOptions
    from dspark.eval.capped_decoder import CappedVerifyDecoder
    from dspark.modeling import DSparkDraftModel

    target, _ = tiny_target("qwen3")
    cfg = DSparkConfig.from_target_config(
        target.config, num_hidden_layers=1, block_size=4, markov_rank=8, mask_token_id=0
    )
    torch.manual_seed(0)
    draft = DSparkDraftModel.from_target(target, cfg).eval()
    dec = CappedVerifyDecoder(target, draft, DecoderOptions(max_length=128), max_verify=max_verify)
    prompts = [[3, 17, 40, 9], [5, 6, 7, 8, 9, 10, 11]]
    spec = dec.generate(prompts, max_new_tokens=20)
    plain = dec.generate_autoregressive(prompts, max_new_tokens=20)
    assert [list(s) for s in spec.sequences] == [list(s) for s in plain.sequences]
    assert max(max(v) for v in spec.verify_lengths if v) <= max_verify


def test_draft_acceptance_from_the_training_run(tmp_path):
    from dspark.errors import BadInputError
    from dspark.eval.auto_settings import draft_acceptance, parse_verify_length

    (tmp_path / "draft").mkdir()
    final = {f"eval/greedy_accept@{k}": 0.5 / k for k in range(1, 4)}
    final |= {f"eval/accept_rate@{k}": 0.4 for k in range(1, 4)}
    (tmp_path / "results.json").write_text(json.dumps({"final_eval": final}))
    greedy = draft_acceptance(str(tmp_path / "draft"), 0.0, 3)
    assert greedy["accept"] == pytest.approx([0.5, 0.25, 0.5 / 3])
    assert draft_acceptance(str(tmp_path / "draft"), 1.0, 3)["accept"] == [0.4] * 3
    assert draft_acceptance(str(tmp_path / "draft"), 0.0, 4)["accept"] is None  # no @4
    assert parse_verify_length("auto", 3) == "auto" and parse_verify_length("2", 3) == 2
    with pytest.raises(BadInputError, match="verify_length"):
        parse_verify_length(9, 3)


def test_regeneration_and_feature_capture_pick_a_measured_dtype(tmp_path, tiny_target_dir, capsys):
    import importlib.util
    from pathlib import Path

    from dspark.data.cli import regenerate_main
    from dspark.dtype_choice import choose_dtype

    tiny_target_dir("llama")
    src = tmp_path / "in.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(3)]
    src.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "regen"
    args = ["--target", "tiny-llama", "--input", str(src), "--output", str(out), "--dtype",
            "auto", "--batch-size", "2", "--max-new-tokens", "3", "--no-progress",
            "--tokenize", "--max-length", "128", "--num-threads", "1"]  # fmt: skip
    assert regenerate_main(args) == 0
    choice = json.loads((out / "dtype_choice.json").read_text())
    assert choice["job"] == "plain" and choice["conditions"]["batch"] == 2
    assert choice["dtype"] == choose_dtype(choice["measured"], "plain")["dtype"]
    assert f"dtype=auto: {choice['dtype']} for plain at batch 2" in capsys.readouterr().err

    spec = importlib.util.spec_from_file_location(
        "cache_features", Path(__file__).parents[1] / "data_scripts" / "cache_features.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cache = tmp_path / "features"
    argv = ["--target", "tiny-llama", "--data", str(out / "tokenized"), "--output", str(cache),
            "--target-dtype", "auto", "--batch-size", "2", "--num-threads", "1"]  # fmt: skip
    assert mod.main(argv) == 0
    err = capsys.readouterr().err
    assert "dtype=auto:" in err and "for capture at batch 2" in err
    assert json.loads((cache / "manifest.json").read_text())["complete"]


def test_the_command_line_probe_prints_the_measured_dtype(tmp_path, tiny_target_dir, capsys):
    """`python -m dspark.dtype_probe` (the Makefile resolves QS_DTYPE=auto with it) prints the
    dtype its cached profile makes fastest: rewriting the profile flips the answer."""
    from dspark.dtype_probe import main

    tiny_target_dir("llama")
    argv = ["--target", "tiny-llama", "--batch-size", "2", "--num-threads", "1"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    first = out.strip()
    assert first in ("float32", "bfloat16") and "dtype=auto:" in err
    cached = [w for w in err.split() if w.endswith(".json)")][0].rstrip(")")
    saved = json.loads(open(cached).read())
    for fast, slow in (("float32", "bfloat16"), ("bfloat16", "float32")):
        saved["profile"][fast]["t_ar"], saved["profile"][slow]["t_ar"] = 0.001, 0.002
        with open(cached, "w") as f:
            json.dump(saved, f)
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert out.strip() == fast and "(cached:" in err


def test_the_command_line_probe_refuses_a_bad_batch(capsys):
    from dspark.dtype_probe import main

    with pytest.raises(SystemExit) as e:
        main(["--batch-size", "0"])
    assert e.value.code == 2 and "--batch-size must be >= 1" in capsys.readouterr().err
