"""The llama.cpp engine adapter: the figures it derives from llama.cpp's timings (by hand), the
flags it passes, and its errors; the real engine runs where xllamacpp is installed."""

from __future__ import annotations

import builtins
import subprocess
import sys
import time

import numpy as np
import pytest

from dspark.bench.llama_cpp import Completion, EngineSettings, Mode, ModeRun, server_args
from dspark.engines.llama_server import gguf_weight_types, process_cpu_seconds, weight_mix
from dspark.errors import MissingPackageError


def test_tau_rounds_and_break_even_from_timings_by_hand():
    plain = ModeRun(Mode("none"), [Completion("a", 100, 1000.0), Completion("b", 50, 500.0)])
    # 150 tokens, 90 accepted drafts -> 60 target passes; tau 2.5; 1.2 s -> 20 ms a round
    spec = ModeRun(
        Mode("draft-dspark", 3),
        [Completion("a", 100, 800.0, 150, 60), Completion("x", 50, 400.0, 75, 30)],
    )
    s = spec.summary(plain)
    assert s["tau"] == pytest.approx(150 / 60)
    assert s["round_ms"] == pytest.approx(1200.0 / 60)
    assert s["plain_step_ms"] == pytest.approx(10.0)  # 1.5 s / 150 tokens
    assert s["break_even_tau"] == pytest.approx(2.0)  # a 20 ms round = 2 plain steps
    assert s["speedup_vs_plain"] == pytest.approx((150 / 1.2) / (150 / 1.5))
    assert s["output_equals_plain"] == pytest.approx(0.5)
    p = plain.summary(plain)
    assert p["tau"] == pytest.approx(1.0) and p["break_even_tau"] == pytest.approx(1.0)


def test_server_flags_per_mode():
    s = EngineSettings("t.gguf", "d.gguf", threads=2, ctx=1024)
    assert server_args(s, Mode()) == ["-m", "t.gguf", "-c", "1024", "-np", "1", "-t", "2",
                                      "-tb", "2"]  # fmt: skip
    spec = server_args(s, Mode("draft-dspark", 3, 0.5))
    assert spec[-8:] == ["--spec-type", "draft-dspark", "-md", "d.gguf", "--spec-draft-n-max",
                         "3", "--spec-draft-p-min", "0.5"]  # fmt: skip
    assert server_args(s, Mode("ngram-mod", 16))[-6:] == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "--spec-ngram-mod-n-min", "16"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "help_text,flag",
    [
        (
            "--spec-draft-n-max N\n--spec-draft-conf-min P   cut the block ...\n",
            "--spec-draft-conf-min",
        ),
        ("--spec-draft-n-max N\n--spec-draft-p-min, --draft-p-min P\n", "--spec-draft-p-min"),
        ("usage: llama-server [options]\n", "--spec-draft-p-min"),  # names neither
    ],
)
def test_the_confidence_cut_flag_is_the_one_the_build_reads(tmp_path, monkeypatch, help_text, flag):
    from dspark.engines import llama_server
    from dspark.engines.llama_server import confidence_cut_flag, engine_conditions

    monkeypatch.setattr(llama_server, "gguf_file_type", lambda path: None)  # no real GGUFs here
    monkeypatch.setattr(llama_server, "gguf_weight_types", lambda path: None)

    fake = tmp_path / "llama-server"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}EOF\n")
    fake.chmod(0o755)
    s = EngineSettings("t.gguf", "d.gguf", server_bin=str(fake))
    args = server_args(s, Mode("draft-dspark", 2, 0.4))
    assert args[args.index("--spec-draft-n-max") + 2 :][:2] == [flag, "0.4"]
    assert confidence_cut_flag(str(fake)) == flag
    assert engine_conditions(s)["confidence_cut_flag"] == flag
    assert confidence_cut_flag(None) == "--spec-draft-p-min"  # xllamacpp: its p_min field


def test_without_xllamacpp_the_engine_says_how_to_get_it(monkeypatch):
    from dspark.bench.llama_cpp import InProcessEngine

    real = builtins.__import__

    def no_xllamacpp(name, *a, **k):
        if name == "xllamacpp":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_xllamacpp)
    with pytest.raises(MissingPackageError, match="pip install xllamacpp"):
        InProcessEngine(EngineSettings("t.gguf"), Mode())


def test_the_report_names_its_conditions():
    from dspark.bench.llama_cpp_report import render_markdown

    plain = ModeRun(Mode("none"), [Completion("a", 10, 100.0)])
    spec = ModeRun(Mode("draft-dspark", 3), [Completion("a", 10, 80.0, 9, 5)])
    results = {
        "datasets": {"gsm8k": [plain.summary(plain), spec.summary(plain)]},
        "conditions": {
            "cpu": "Some CPU",
            "engine": "xllamacpp",
            "xllamacpp": "1.0",
            "threads": 2,
            "target_gguf": "t.gguf",
            "target_file_type": "Q4_1",
            "draft_gguf": "d.gguf",
            "draft_file_type": "F16",
            "block_size": 7,
            "prompts_per_set": 1,
            "max_new_tokens": 16,
        },
        "tuning": None,
    }
    md = render_markdown(results, None)
    for needle in ("Some CPU", "2 threads", "Q4_1", "F16", "block size 7", "T=0"):
        assert needle in md, needle
    assert "| gsm8k | dspark n_max=3 p_min=0 | 125.0 | 1.25x | 2.00 |" in md


def test_llama_cpp_serves_our_gguf_draft_losslessly(tiny_target, tiny_target_dir, tmp_path):
    """The real engine: llama.cpp loads the tiny target (converted by llama.cpp's own converter)
    and our tiny draft GGUF with --spec-type draft-dspark, drafts, and its greedy output equals
    its plain greedy output."""
    pytest.importorskip("xllamacpp", reason="the llama-cpp extra: pip install xllamacpp")
    import subprocess
    import sys

    from helpers import CONVERT, FETCH, REFERENCE, random_draft

    from dspark.bench.llama_cpp import decode_all, open_engine, run_modes
    from dspark.export.gguf import write_gguf

    if not (REFERENCE / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {REFERENCE}; fetch it with: {FETCH}")
    target, tok = tiny_target("qwen3")
    target_gguf = tmp_path / "target.gguf"
    env = {"PYTHONPATH": str(REFERENCE / "gguf-py"), "NO_LOCAL_GGUF": ""}
    res = subprocess.run(
        [sys.executable, "-c", CONVERT, str(REFERENCE), str(tiny_target_dir("qwen3")),
         "--outtype", "f32", "--outfile", str(target_gguf)],
        capture_output=True, text=True, env={**__import__("os").environ, **env},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    draft = random_draft(target, tok, "qwen3")
    draft_gguf = write_gguf(draft, tmp_path / "draft.gguf", target="tiny-qwen3", outtype="f32")
    settings = EngineSettings(str(target_gguf), str(draft_gguf), threads=1, ctx=512)
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
               for t in ("hello there", "count to ten", "what is a draft model")]  # fmt: skip
    prompts = [list(p["input_ids"] if isinstance(p, dict) else p) for p in prompts]
    runs = {}
    for mode in (Mode(), Mode("draft-dspark", 3)):
        engine = open_engine(settings, mode)
        try:
            runs[mode.spec] = decode_all(engine, prompts, 24, mode)
        finally:
            engine.close()
    spec, plain = runs["draft-dspark"], runs["none"]
    assert spec.drafted > 0  # it speculated with our draft
    assert plain.tokens > 0
    assert [c.text for c in spec.completions] == [c.text for c in plain.completions]
    # the benchmark's way: both engines open in one process, prompts interleaved; each mode
    # gives what it gave alone
    both = run_modes(settings, [Mode(), Mode("draft-dspark", 3)], {"p": prompts}, 24,
                     progress=lambda m: None)["p"]  # fmt: skip
    for name, alone in (("plain", plain), ("dspark n_max=3 p_min=0", spec)):
        assert [c.text for c in both[name].completions] == [c.text for c in alone.completions]
        assert both[name].drafted == alone.drafted


class DriftingEngine:
    """A fake engine on a machine that slows down as time passes: a request of n tokens
    takes n * (1 + clock / 100) ms times the mode's own cost, and moves the clock on by one."""

    clock = 0
    calls: list[tuple[str, int]] = []
    open_now: set[str] = set()

    def __init__(self, settings, mode):
        self.mode = mode
        DriftingEngine.open_now.add(mode.name)

    def complete(self, prompt, max_new_tokens):
        cost = 1.0 if self.mode.spec == "none" else 0.8  # the draft mode: 1.25x, truly
        DriftingEngine.calls.append((self.mode.name, prompt[0]))
        assert len(DriftingEngine.open_now) == 3  # every engine stays open throughout
        ms = max_new_tokens * cost * (1 + DriftingEngine.clock / 100)
        DriftingEngine.clock += 1
        return Completion(f"{prompt[0]}", max_new_tokens, ms)

    def close(self):
        DriftingEngine.open_now.discard(self.mode.name)


def test_modes_run_interleaved_so_a_drifting_machine_biases_no_mode(monkeypatch):
    from dspark.bench import llama_cpp

    monkeypatch.setattr(llama_cpp, "open_engine", DriftingEngine)
    DriftingEngine.clock, DriftingEngine.calls = 0, []
    modes = [Mode(), Mode("draft-dspark", 1, 0.5), Mode("ngram-mod", 64)]
    sets = {"a": [[i] for i in range(10)], "b": [[i] for i in range(10, 22)]}
    runs = llama_cpp.run_modes(EngineSettings("t.gguf"), modes, sets, 32, progress=lambda m: None)
    assert not DriftingEngine.open_now  # all closed
    timed = DriftingEngine.calls[3:]  # after one warm-up request per mode
    # each prompt is decoded by every mode before the next prompt; the first mode rotates
    assert [p for _, p in timed] == [p for p in range(22) for _ in modes]
    firsts = [timed[3 * i][0] for i in range(22)]
    assert firsts == [modes[i % 3].name for i in range(22)]
    for name, prompts in sets.items():
        for m in modes:  # completions in prompt order, whatever the turn
            assert [c.text for c in runs[name][m.name].completions] == [str(p[0]) for p in prompts]
    # the draft mode is 1.25x faster by construction; one mode after another would have
    # measured it on the slower, later minutes (here: 1.03x and 1.04x)
    for name in sets:
        r = runs[name]["dspark n_max=1 p_min=0.5"].summary(runs[name]["plain"])
        assert r["speedup_vs_plain"] == pytest.approx(1.25, rel=0.02)


def test_round_trip_compares_full_block_acceptance():
    from dspark.bench.llama_cpp_report import ours_rows, round_trip

    full = ModeRun(Mode("draft-dspark", 7), [Completion("a", 50, 100.0, 70, 30)])
    part = ModeRun(Mode("draft-dspark", 3), [Completion("a", 50, 100.0, 30, 20)])
    ours = {"datasets": {"gsm8k": {"acceptance": {"accepted": 32, "drafted": 70}, "speed": {}}}}
    results = {
        "conditions": {"block_size": 7},
        "datasets": {"gsm8k": [full.summary(None), part.summary(None)]},
        "ours": ours_rows(ours),
    }
    trip = round_trip(results)
    assert trip["gsm8k"]["llama_cpp"] == 30 and trip["gsm8k"]["ours"] == 32
    assert trip["gsm8k"]["difference_pct"] == pytest.approx(100 * 2 / 32)


def test_bench_script_hands_server_bin_and_verbosity_to_the_engine(monkeypatch, tmp_path):
    """`--server-bin` and `--verbose` reach `EngineSettings` (a native build is used at all)."""
    import importlib.util
    from pathlib import Path

    from dspark.bench import llama_cpp_report as rep

    spec = importlib.util.spec_from_file_location(
        "llama_cpp_bench", Path(__file__).parents[1] / "eval" / "llama_cpp_bench.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen = {}

    def fake_bench(settings, **kw):
        seen["settings"] = settings
        raise SystemExit(0)

    monkeypatch.setattr(rep, "bench", fake_bench)
    monkeypatch.setattr("dspark.eval.prompts.check_datasets", lambda *a, **k: None)
    monkeypatch.setattr("dspark.target.load_tokenizer", lambda *a, **k: None)
    args = ["--target-gguf", "t.gguf", "--target", "x", "--server-bin", "/opt/llama-server",
            "--verbose", "--datasets", "gsm8k", "--output-dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(SystemExit):
        script.main(args)
    s = seen["settings"]
    assert (s.server_bin, s.verbose, s.target_gguf, s.draft_gguf) == (
        "/opt/llama-server",
        True,
        "t.gguf",
        None,
    )


def test_the_report_ranks_every_engine_and_setting_per_set():
    from dspark.bench.llama_cpp_report import fastest

    results = {
        "datasets": {
            "gsm8k": [
                {"name": "plain", "tokens_per_s": 70.0},
                {"name": "dspark n_max=1 p_min=0.5", "tokens_per_s": 75.0},
                {"name": "ngram-mod n_max=64", "tokens_per_s": 50.0},
            ]
        },
        "ours": {"gsm8k": {"ar_tokens_per_s": 11.0, "spec_tokens_per_s": 80.0, "dtype": "fp32"}},
    }
    assert [w for w, _ in fastest(results)["gsm8k"]] == [
        "bundled decoder DSpark (fp32)",
        "llama.cpp dspark n_max=1 p_min=0.5",
        "llama.cpp plain",
        "llama.cpp ngram-mod n_max=64",
        "bundled decoder plain (fp32)",
    ]


def test_the_gguf_readme_carries_the_tuned_flags_when_given():
    from types import SimpleNamespace

    from dspark.export.readme import render_llama_cpp

    cfg = SimpleNamespace(block_size=7, enable_confidence_head=True)
    kw = dict(config=cfg, gguf="d.gguf", target="t.gguf", outtype="q8_0", draft_vocab_size=None,
              source="runs/x/draft", threads=2)  # fmt: skip
    plain = render_llama_cpp(**kw)
    assert "--spec-draft-n-max 3 --spec-draft-p-min 0 " in plain
    tuned = render_llama_cpp(**kw, tuned={"n_max": 1, "p_min": 0.5, "measured_on": "CPU Z"})
    assert "--spec-draft-n-max 1 --spec-draft-p-min 0.5 " in tuned
    assert "tuned on CPU Z" in tuned


def test_a_gguf_s_weight_types_are_its_tensors_shares_by_elements(tmp_path):
    """A quant's name is not its content: the shares come from each tensor's own type, weighted
    by its elements (4 x 64 Q8_0, 2 x 64 F32, 64 F16: 256 / 128 / 64 of 448), largest first."""
    gguf = pytest.importorskip("gguf")
    quants = pytest.importorskip("gguf.quants")

    path = tmp_path / "mixed.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    q8 = quants.quantize(np.random.rand(4, 64).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("f16", np.zeros((64,), np.float16))
    writer.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("f32", np.zeros((2, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shares = gguf_weight_types(str(path))
    assert list(shares) == ["Q8_0", "F32", "F16"]
    assert shares == pytest.approx({"Q8_0": 256 / 448, "F32": 128 / 448, "F16": 64 / 448}, abs=1e-4)
    assert weight_mix(shares) == "Q8_0 57%, F32 29%, F16 14%"
    assert weight_mix({"Q4_0": 1.0}) == "" and weight_mix(None) == ""


# llama.cpp's statistics lines as its server logs them at trace level (common/speculative.cpp)
STATS = (
    "0.03.086.413 I spec common_specu: statistics     draft-dspark: #calls(b,g,a) =    2     98"
    "     98, #gen drafts =     98, #acc drafts =    76, #gen tokens =    291, #acc tokens =   172,"
    " #mean acc len = 2.76, #acc rate/pos = (0.776, 0.592, 0.388), dur(b,g,a) = 0.008, 361.318,"
    " 0.079 ms\n"
    "0.03.100.000 I spec common_specu: statistics        ngram-mod: #calls(b,g,a) =    2     50"
    "     50, #gen drafts =      3, #acc drafts =     1, #gen tokens =     64, #acc tokens =     2,"
    " dur(b,g,a) = 0.001, 9.500, 0.010 ms\n"
    "0.04.610.401 I spec common_specu: statistics     draft-dspark: #calls(b,g,a) =    3    163"
    "    163, #gen drafts =    163, #acc drafts =   133, #gen tokens =    486, #acc tokens =   297,"
    " #mean acc len = 2.82, #acc rate/pos = (0.816, 0.595, 0.411), dur(b,g,a) = 0.012, 594.748,"
    " 0.116 ms\n"
)


def test_the_draft_timer_is_llama_cpp_s_last_draft_dspark_statistics():
    from dspark.engines.llama_server import parse_draft_timer

    # cumulative over the server's life: the last draft-dspark line counts, not n-gram's
    assert parse_draft_timer(STATS) == {"draft_calls": 163, "draft_ms": 594.748}
    assert parse_draft_timer(STATS.splitlines()[0]) == {"draft_calls": 98, "draft_ms": 361.318}
    assert parse_draft_timer("slot print_timing: eval time = 1 ms") is None


FAKE_SERVER = r"""#!{python}
# a stand-in llama-server: /health, /v1/completions; logs a draft-dspark statistics line
# (cumulative, 4 block drafts of 2.5 ms a request) to --log-file when it drafts
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
a = sys.argv
if "--help" in a:
    sys.exit(0)
port = int(a[a.index("--port") + 1])
log = a[a.index("--log-file") + 1] if "--log-file" in a else None
assert (log is None) or a[a.index("-lv") + 1] == "4"
n = [0]
class H(BaseHTTPRequestHandler):
    def log_message(self, *x):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({{"status": "ok"}})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        n[0] += 1
        if log:
            with open(log, "a") as f:
                f.write("I spec common_specu: statistics     draft-dspark: #calls(b,g,a) = %d %d %d,"
                        " dur(b,g,a) = 0.001, %.3f, 0.002 ms\n" % (n[0], 4 * n[0], 4 * n[0], 10.0 * n[0]))
        self.reply({{"choices": [{{"text": "x"}}], "timings": {{"predicted_n": 8, "predicted_ms": 40.0,
                    "draft_n": 6, "draft_n_accepted": 4}}}})
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_run_modes_reads_each_drafting_server_s_own_timer(tmp_path, monkeypatch):
    import sys
    import tempfile

    from dspark.bench.llama_cpp import run_modes

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the servers' logs go

    fake = tmp_path / "llama-server"
    fake.write_text(FAKE_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    modes = [Mode(), Mode("draft-dspark", 3)]
    s = EngineSettings("t.gguf", "d.gguf", server_bin=str(fake), draft_timer=True)
    timers: dict = {}
    runs = run_modes(s, modes, {"p": [[1], [2]]}, 8, progress=lambda m: None, draft_timers=timers)
    # one warm-up and two prompts: 12 block drafts in 30 ms; plain decoding has no timer
    assert timers == {"dspark n_max=3 p_min=0": {"draft_calls": 12, "draft_ms": 30.0}}
    assert runs["p"]["plain"].tokens == 16
    assert not list(tmp_path.glob("llama-server-*.log"))  # each log goes with its server
    untimed: dict = {}
    run_modes(EngineSettings("t.gguf", "d.gguf", server_bin=str(fake)), modes, {"p": [[1]]}, 8,
              progress=lambda m: None, draft_timers=untimed)  # fmt: skip
    assert untimed == {}


def test_a_server_that_dies_at_start_leaves_no_log(tmp_path, monkeypatch):
    import tempfile

    from dspark.engines.llama_server import NativeServer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "llama-server"
    dead.write_text("#!/bin/sh\nexit 3\n")
    dead.chmod(0o755)
    s = EngineSettings("t.gguf", "d.gguf", server_bin=str(dead), draft_timer=True)
    with pytest.raises(RuntimeError, match=r"exited with 3.*'--log-file', .*'-lv', '4'"):
        NativeServer(s, Mode("draft-dspark", 3))
    assert not list(tmp_path.glob("llama-server-*.log"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_process_cpu_time_is_read_from_outside_it():
    # a child that burns ~0.5 s of CPU, as a native llama-server decodes outside its caller
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    child = subprocess.Popen([sys.executable, "-c", burn + "\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        seen = 0.0
        for _ in range(100):  # until its loop is done (it then waits on stdin, burning nothing)
            seen = process_cpu_seconds(child.pid) or 0.0
            if seen >= 0.5:
                break
            time.sleep(0.05)
        assert 0.5 <= seen < 5.0
    finally:
        child.communicate(b"")
    assert process_cpu_seconds(child.pid) is None  # gone: unknown, not zero
