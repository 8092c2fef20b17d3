"""LlamaCppBackend: llama.cpp's server as a regeneration backend. The requests it sends, its
cut at the stop ids, failures kept to their rows, requests in flight up to the slots (a fake
server), and the real engine: its greedy answers on an F32 GGUF equal the bundled decoder's,
and a sampled row depends on its own seed only."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from dspark.data.prompts.prompt_set import normalize_rows
from dspark.data.regeneration.decoder_backend import DecoderBackend
from dspark.data.regeneration.llama_cpp_backend import (
    LlamaCppBackend,
    agreement,
    completion_body,
)
from dspark.data.regeneration.regenerate import regenerate
from dspark.data.regeneration.run_files import OUTPUT, RUNS
from dspark.data.regeneration.sampling import GenerationFailed, SamplingConfig
from dspark.engines.llama_server import EngineSettings

CONVS = [
    [{"role": "user", "content": t}]
    for t in ("Hi.", "What is a draft model?", "Sort 3 1 2", "Write a haiku.", "ok", "2+2?")
]


def test_request_asks_for_tokens_and_only_the_samplers_wanted():
    greedy = completion_body([1, 2], 7, SamplingConfig(max_new_tokens=5))
    assert greedy["prompt"] == [1, 2] and greedy["n_predict"] == 5 and greedy["return_tokens"]
    assert greedy["temperature"] == 0 and greedy["top_k"] == 1 and greedy["seed"] == 7
    s = completion_body([1], 2**62 + 5, SamplingConfig(temperature=0.8, top_p=0.9, top_k=0))
    # llama.cpp's defaults (top-k 40, min-p 0.05) would warp the distribution: switched off
    assert s["samplers"] == ["temperature", "top_k", "top_p"] and s["min_p"] == 0.0
    assert s["top_k"] == 0 and s["top_p"] == 0.9 and s["temperature"] == 0.8
    assert 0 <= s["seed"] < 0xFFFFFFFF and s["seed"] == (2**62 + 5) % 0xFFFFFFFF


def test_agreement_by_hand():
    a = agreement([[1, 2, 3, 4], [5, 6], [7, 8, 9, 9]], [[1, 2, 3, 4], [5, 7], [7, 8, 0, 0]])
    assert a["rows"] == 3 and a["rows_equal"] == 1
    assert a["common_prefix_share"] == pytest.approx((1 + 1 / 2 + 2 / 4) / 3)
    assert agreement(["abc"], ["abd"])["common_prefix_share"] == pytest.approx(2 / 3)


class FakeServer:
    """Answers `/completion` with the prompt's last id + 1, +2, ... (a stop id 9 ends it), after
    a short wait; counts the requests in flight at once. A prompt starting with 0 fails."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = self.most = 0
        self.bodies: list[dict] = []

    def cpu_seconds(self):  # answers in this process: nothing outside it to count
        return 0.0

    def post(self, path, body, timeout_s=600.0):
        assert path == "/completion"
        with self.lock:
            self.live += 1
            self.most = max(self.most, self.live)
            self.bodies.append(body)
        time.sleep(0.02)
        with self.lock:
            self.live -= 1
        if body["prompt"][0] == 0:
            raise OSError("HTTP Error 500: boom")
        last = body["prompt"][-1]
        return {"tokens": [(last + k) % 10 for k in range(1, body["n_predict"] + 1)]}

    def close(self):
        pass


def fake_backend(tiny_target, parallel=3, ctx=3 * 64):
    _, tok = tiny_target("qwen3")
    server = FakeServer()
    settings = EngineSettings("t.gguf", parallel=parallel, ctx=ctx)
    be = LlamaCppBackend(settings, tok, server=server)
    be.stop_ids = [9]
    return be, server


def test_rows_in_order_cut_at_a_stop_id_and_failures_kept_to_their_row(tiny_target):
    be, server = fake_backend(tiny_target)
    ids = [[5], [0, 1], [8], [1] * 70, [2], [3], [6]]  # row 1 errors; row 3 overflows a slot
    out = be.generate_ids(ids, list(range(len(ids))), SamplingConfig(max_new_tokens=6))
    assert out[0] == [6, 7, 8, 9]  # cut after the stop id, which is kept
    assert out[2] == [9] and out[4] == [3, 4, 5, 6, 7, 8] and out[6] == [7, 8, 9]
    assert isinstance(out[1], GenerationFailed) and "500" in str(out[1])
    assert isinstance(out[3], GenerationFailed) and "slot" in str(out[3])
    assert 1 < server.most <= 3  # concurrent, never more than the slots
    assert [b["seed"] for b in server.bodies if b["prompt"][0] != 1] != []


def test_regenerate_through_the_backend_records_its_engine(tiny_target, tmp_path):
    be, server = fake_backend(tiny_target, parallel=2, ctx=2 * 512)
    be.conditions = lambda: {"engine": "fake", "target_file_type": "Q4_1", "threads": 3}
    prompts = normalize_rows([{"messages": c} for c in CONVS], "fake")
    summary = regenerate(prompts, be, tmp_path / "out", batch_size=4, progress=False, log=None)
    assert summary["complete"] and summary["rows_done"] == len(CONVS)
    written = [json.loads(x) for x in (tmp_path / "out" / OUTPUT).read_text().splitlines()]
    assert sorted(r["index"] for r in written) == list(range(len(CONVS)))
    run = json.loads((tmp_path / "out" / RUNS).read_text().splitlines()[-1])
    assert run["engine"] == "fake" and run["target_file_type"] == "Q4_1" and run["threads"] == 3


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory, tiny_target_dir):
    """The tiny qwen3 target as an F32 GGUF written by llama.cpp's own converter."""
    from helpers import CONVERT, FETCH, REFERENCE

    if not (REFERENCE / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {REFERENCE}; fetch it with: {FETCH}")
    out = tmp_path_factory.mktemp("gguf") / "target.gguf"
    env = {
        **__import__("os").environ,
        "PYTHONPATH": str(REFERENCE / "gguf-py"),
        "NO_LOCAL_GGUF": "",
    }
    res = subprocess.run(
        [sys.executable, "-c", CONVERT, str(REFERENCE), str(tiny_target_dir("qwen3")),
         "--outtype", "f32", "--outfile", str(out)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return str(out)


def test_real_engine_greedy_equals_the_bundled_decoder_and_samples_per_row(tiny_target, f32_gguf):
    pytest.importorskip("xllamacpp", reason="the llama-cpp extra: pip install xllamacpp")
    model, tok = tiny_target("qwen3")
    ref = DecoderBackend(model, tok, batch_size=4)
    settings = EngineSettings(f32_gguf, threads=1, ctx=3 * 256, parallel=3)
    be = LlamaCppBackend(settings, tok)
    try:
        ids = be.encode(CONVS)
        assert ids == ref.encode(CONVS)
        greedy = SamplingConfig(max_new_tokens=16)
        theirs = ref.generate_ids(ids, [0] * len(ids), greedy)
        ours = be.generate_ids(ids, [0] * len(ids), greedy)
        # F32 weights: llama.cpp's sums in another order may flip a near-tie of a random
        # target's logits, so most rows, not all, must be equal from the first token on
        a = agreement(ours, theirs)
        assert a["rows_equal"] >= len(ids) - 1, (ours, theirs)
        hot = SamplingConfig(temperature=1.0, max_new_tokens=12)
        seeds = [11, 22, 33, 44, 55, 66]
        together = be.generate_ids(ids, seeds, hot)
        alone = [be.generate_ids([p], [s], hot)[0] for p, s in zip(ids[::-1], seeds[::-1])][::-1]
        assert together == alone  # a row's answer is its seed's, whatever its slot or neighbours
        other = be.generate_ids(ids, [s + 1 for s in seeds], hot)
        assert other != together  # and the seed is used
        replies = be.generate(CONVS[:2], [0, 0], greedy)
        assert all(r.tokens > 0 and r.finish_reason in ("stop", "length") for r in replies)
    finally:
        be.close()


def test_a_native_server_dies_with_the_job_that_started_it(f32_gguf, tmp_path):
    """A job killed by SIGKILL runs no clean-up; its llama-server must not live on."""
    import os
    import signal

    from helpers import REFERENCE

    # beside the llama.cpp tree, as `make llama-server` builds it (the tests' cache is private)
    server_bin = REFERENCE.parent / "build-native" / "bin" / "llama-server"
    if not server_bin.is_file():
        pytest.skip(f"no native llama-server at {server_bin} (make llama-server)")
    pid_file = tmp_path / "server.pid"
    job = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time\n"
            "from dspark.engines.llama_server import EngineSettings, open_server\n"
            f"s = open_server(EngineSettings({f32_gguf!r}, threads=1, ctx=256, "
            f"server_bin={str(server_bin)!r}))\n"
            f"open({str(pid_file)!r}, 'w').write(str(s._proc.pid))\n"
            "time.sleep(600)\n"
        )],
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert job.poll() is None and time.monotonic() < deadline, "the job did not start a server"
        time.sleep(0.2)
    server = int(pid_file.read_text())
    os.kill(server, 0)  # the server runs
    job.send_signal(signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            return
        # a zombie is gone for good; its parent is init, which reaps it
        if open(f"/proc/{server}/stat").read().split()[2] == "Z":
            return
        time.sleep(0.2)
    os.kill(server, signal.SIGKILL)
    pytest.fail("llama-server outlived the job that started it")
