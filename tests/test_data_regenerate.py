"""Regeneration: turn by turn, resumable with identical output, per-row failures, servers."""

import http.server
import json
import threading

import pytest

from dspark.data.prompts.prompt_set import normalize_rows
from dspark.data.regeneration.decoder_backend import DecoderBackend
from dspark.data.regeneration.hf_backend import HFBackend
from dspark.data.regeneration.openai_backend import OpenAIBackend
from dspark.data.regeneration.regenerate import regenerate
from dspark.data.regeneration.run_files import FAILURES, OUTPUT, SUMMARY
from dspark.data.regeneration.sampling import SamplingConfig, row_seed

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [
    {"turns": ["What is 2 + 3?", "And times 4?"]},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "Say hi."},
            {"from": "gpt", "value": "an old answer to be replaced"},
        ]
    },
    {"instruction": "Reverse the word", "input": "abc"},
    {"turns": ["Count to three."]},
    {"turns": ["def add(a, b):", "Now subtract."]},
    {"turns": ["Tell me a fact."]},
]
SAMPLED = SamplingConfig(temperature=0.9, top_p=0.95, top_k=50, max_new_tokens=6, seed=7)


def read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(params=["hf", "decoder"])
def backend(tiny_target, request):
    """Both local backends meet the same regeneration contract (turns, resume, seeds)."""
    model, tok = tiny_target("qwen2")
    if request.param == "hf":
        return HFBackend(model, tok)
    return DecoderBackend(model, tok, batch_size=2)


class Killed(BaseException):
    """Stands in for SIGKILL / Ctrl-C: not an Exception, so nothing catches it."""


class KillAfter:
    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def generate(self, *a):
        if self.calls == 0:
            raise Killed()
        self.calls -= 1
        return self.inner.generate(*a)


def test_multi_turn_feeds_back_own_answers(backend, tmp_path):
    ps = normalize_rows(PROMPTS)
    stats = regenerate(
        ps, backend, tmp_path, sampling=SAMPLED, batch_size=3, progress=False, log=None
    )
    rows = read(tmp_path / OUTPUT)
    assert [r["index"] for r in rows] == list(range(len(PROMPTS)))
    roles = [[m["role"] for m in r["messages"]] for r in rows]
    assert roles[0] == ["user", "assistant", "user", "assistant"]
    assert roles[1] == ["system", "user", "assistant"]
    assert rows[2]["messages"][-1]["content"] != "an old answer to be replaced"
    assert rows[3]["messages"][0]["content"] == "Reverse the word\n\nabc"
    assert all(len(r["finish_reasons"]) == roles[i].count("assistant") for i, r in enumerate(rows))
    assert stats["rows_done"] == len(PROMPTS) and stats["rows_failed"] == 0
    assert stats["generated_tokens"] == sum(r["generated_tokens"] for r in rows) > 0
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["tokens_per_s"] > 0 and summary["rows_in_output"] == len(PROMPTS)
    assert 0 < summary["cpu_s"]  # the process's CPU time: the build's CPU-hours add these up
    (run,) = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    if isinstance(backend, DecoderBackend):  # a run's speed names the rows decoding at once
        assert (run["engine"], run["dtype"], run["live_batch"]) == ("dspark decoder", "float32", 2)


class WithServer:
    """A backend whose engine decodes in a server process of its own: `server_cpu_s` reads
    that process's CPU seconds (here as a script gives them, None for unreadable)."""

    def __init__(self, inner, readings):
        self.inner, self.readings = inner, list(readings)

    def generate(self, *a):
        return self.inner.generate(*a)

    def server_cpu_s(self):
        return self.readings.pop(0)


@pytest.mark.parametrize("readings", [(10.0, 110.0), (None, None), (10.0, None)])
def test_a_runs_cpu_time_counts_its_server_process(tiny_target, tmp_path, readings):
    model, tok = tiny_target("qwen2")
    prompts = normalize_rows(PROMPTS[:2])
    stats = regenerate(prompts, WithServer(DecoderBackend(model, tok, batch_size=2), readings),
                       tmp_path, sampling=SAMPLED, progress=False, log=None)  # fmt: skip
    (run,) = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    if readings[1] is None:  # a server's CPU time unknown: the run's is unknown, not this process's
        assert "cpu_s" not in stats and "cpu_s" not in run
    else:
        assert 100.0 < run["cpu_s"] == stats["cpu_s"] < 100.0 + run["elapsed_s"] * 8


@pytest.mark.parametrize(
    "sampling", [SamplingConfig(max_new_tokens=6), SAMPLED], ids=["greedy", "sampled"]
)
def test_killed_and_resumed_equals_uninterrupted(backend, tmp_path, sampling):
    ps = normalize_rows(PROMPTS)
    kw = dict(sampling=sampling, batch_size=2, progress=False, log=None)
    regenerate(ps, backend, tmp_path / "full", **kw)

    part = tmp_path / "part"
    # batches of 2 rows: [0 (two turns), 1] take 2 generate calls, [2, 3] one; die in [4, 5]
    with pytest.raises(Killed):
        regenerate(ps, KillAfter(backend, 3), part, **kw)
    assert len(read(part / OUTPUT)) == 4
    with open(part / OUTPUT, "a") as f:  # and a half-written line, as a kill mid-write leaves
        f.write('{"index": 4, "messages": [{"role": "us')
    stats = regenerate(ps, backend, part, **kw)
    assert stats["rows_skipped"] == 4 and stats["rows_done"] == len(PROMPTS) - 4
    assert read(part / OUTPUT) == read(tmp_path / "full" / OUTPUT)
    again = regenerate(ps, backend, part, **kw)  # a third run has nothing left to do
    assert again["rows_done"] == 0 and again["rows_skipped"] == len(PROMPTS)
    assert read(part / OUTPUT) == read(tmp_path / "full" / OUTPUT)


def test_batching_does_not_change_greedy_answers(backend, tmp_path):
    ps = normalize_rows(PROMPTS)
    g = SamplingConfig(max_new_tokens=6)
    regenerate(ps, backend, tmp_path / "b1", sampling=g, batch_size=1, progress=False, log=None)
    regenerate(ps, backend, tmp_path / "b4", sampling=g, batch_size=4, progress=False, log=None)
    assert read(tmp_path / "b1" / OUTPUT) == read(tmp_path / "b4" / OUTPUT)


def test_rerun_with_other_settings_is_refused(backend, tmp_path):
    ps = normalize_rows(PROMPTS[:2])
    regenerate(ps, backend, tmp_path, sampling=SAMPLED, progress=False, log=None)
    with pytest.raises(ValueError, match="other settings"):
        regenerate(ps, backend, tmp_path, sampling=SamplingConfig(), progress=False, log=None)


def test_greedy_resume_may_switch_local_backend_but_sampled_may_not(tiny_target, tmp_path):
    model, tok = tiny_target("qwen2")
    ps = normalize_rows(PROMPTS)
    kw = dict(progress=False, log=None, batch_size=4)
    g = SamplingConfig(max_new_tokens=5)
    hf, dec = HFBackend(model, tok), DecoderBackend(model, tok, batch_size=4)
    regenerate(
        normalize_rows(PROMPTS[:4]),
        hf,
        tmp_path / "g",
        sampling=g,
        **kw,
        settings={"generator": "hf:tiny-qwen2"},
    )
    stats = regenerate(
        ps, dec, tmp_path / "g", sampling=g, **kw, settings={"generator": "decoder:tiny-qwen2"}
    )
    assert stats["rows_skipped"] == 4 and stats["rows_done"] == len(PROMPTS) - 4
    regenerate(
        ps, hf, tmp_path / "s", sampling=SAMPLED, **kw, settings={"generator": "hf:tiny-qwen2"}
    )
    with pytest.raises(ValueError, match="generator"):
        regenerate(
            ps,
            dec,
            tmp_path / "s",
            sampling=SAMPLED,
            **kw,
            settings={"generator": "decoder:tiny-qwen2"},
        )
    with pytest.raises(ValueError, match="generator"):  # another target never matches
        regenerate(
            ps, dec, tmp_path / "g", sampling=g, **kw, settings={"generator": "decoder:tiny-llama"}
        )


def test_row_seed_is_stable():
    assert row_seed(0, 5, 1) == row_seed(0, 5, 1) != row_seed(0, 6, 1) != row_seed(1, 5, 1)
    assert row_seed(0, 0, 0) == 8387133978117270309  # same on every machine


class FakeServer(http.server.BaseHTTPRequestHandler):
    requests: list = []
    flaky_seen: set = set()

    def log_message(self, *a):
        pass

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        if code == 503:
            self.send_header("retry-after-ms", "20")  # the openai client honours it
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "fake-model"}]})
        else:
            self._send(404, {"error": "no"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeServer.requests.append(req)
        last = req["messages"][-1]["content"]
        if "FAIL" in last:
            return self._send(400, {"error": {"message": "prompt refused by policy"}})
        if "FLAKY" in last and last not in FakeServer.flaky_seen:  # fails once, then works
            FakeServer.flaky_seen.add(last)
            return self._send(503, {"error": {"message": "overloaded"}})
        n_prev = sum(m["role"] == "assistant" for m in req["messages"])
        text = f"reply {n_prev} to {last[:12]} seed {req['seed'] % 1000}"
        msg = {"role": "assistant", "content": text, "reasoning_content": f"think {n_prev}"}
        self._send(
            200,
            {
                "choices": [{"message": msg, "finish_reason": "stop"}],
                "usage": {"completion_tokens": len(text.split())},
            },
        )


@pytest.fixture
def server():
    FakeServer.requests, FakeServer.flaky_seen = [], set()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_openai_server_path(server, tmp_path):
    prompts = PROMPTS[:2] + [{"turns": ["fine", "please FAIL here"]}]
    ps = normalize_rows(prompts)
    backend = OpenAIBackend(server + "/v1", retries=0)
    assert backend.model == "fake-model"
    stats = regenerate(
        ps, backend, tmp_path, sampling=SAMPLED, batch_size=4, progress=False, log=None
    )
    assert stats["rows_done"] == 2 and stats["rows_failed"] == 1
    rows = read(tmp_path / OUTPUT)
    first = rows[0]["messages"]
    assert first[1]["content"].startswith("reply 0 to What is 2 +")
    assert first[3]["content"].startswith("reply 1 to And times 4?")
    # the second turn's request carried the server's own first answer as history
    turn2 = [r for r in FakeServer.requests if r["messages"][-1]["content"] == "And times 4?"][0]
    assert turn2["messages"][1] == first[1]
    assert turn2["seed"] == row_seed(SAMPLED.seed, 0, 1) and turn2["top_k"] == 50
    assert turn2["model"] == "fake-model" and turn2["max_tokens"] == SAMPLED.max_new_tokens
    assert "chat_template_kwargs" not in turn2
    assert all("reasoning_content" not in m for r in rows for m in r["messages"])
    fails = read(tmp_path / FAILURES)
    assert fails == [{"index": 2, "turn": 1, "reason": fails[0]["reason"]}]
    assert "HTTP 400" in fails[0]["reason"] and "refused by policy" in fails[0]["reason"]
    # a rerun retries only the failed row
    FakeServer.requests = []
    again = regenerate(ps, backend, tmp_path, sampling=SAMPLED, progress=False, log=None)
    assert again["rows_skipped"] == 2 and again["rows_failed"] == 1
    assert len(read(tmp_path / OUTPUT)) == 2


def test_openai_server_retries_extra_body_and_reasoning(server, tmp_path):
    ps = normalize_rows([{"turns": ["be FLAKY", "again"]}, {"turns": ["calm"]}])
    backend = OpenAIBackend(
        server,
        retries=2,
        chat_template_kwargs={"enable_thinking": False},
        keep_reasoning=True,
    )
    stats = regenerate(ps, backend, tmp_path, sampling=SAMPLED, progress=False, log=None)
    assert stats["rows_done"] == 2 and stats["rows_failed"] == 0
    flaky = [r for r in FakeServer.requests if r["messages"][-1]["content"] == "be FLAKY"]
    assert len(flaky) == 2  # a 503, then the retry answered
    assert all(r["chat_template_kwargs"] == {"enable_thinking": False} for r in flaky)
    first = read(tmp_path / OUTPUT)[0]["messages"]
    assert [m.get("reasoning_content") for m in first] == [None, "think 0", None, "think 1"]
    no_retry = OpenAIBackend(server, retries=0)
    rep = no_retry.generate([[{"role": "user", "content": "FLAKY twice"}]], [1], SAMPLED)[0]
    assert isinstance(rep, Exception) and "HTTP 503" in str(rep)


def test_cli_end_to_end_with_tokenize(tmp_path, tiny_target_dir):
    import datasets

    from dspark.data.cli import regenerate_main
    from dspark.data.tokenize import load_manifest

    tiny_target_dir("llama")
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in PROMPTS[:4] + [{"bad": 1}] + PROMPTS[4:6]))
    out = tmp_path / "out"
    args = [
        "--target",
        "tiny-llama",
        "--input",
        str(src),
        "--output",
        str(out),
        "--batch-size",
        "2",
        "--max-new-tokens",
        "5",
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--no-progress",
        "--tokenize",
        "--max-length",
        "256",
    ]
    assert regenerate_main(args + ["--limit", "4"]) == 0  # an early stop ...
    assert len(read(out / OUTPUT)) == 4
    assert regenerate_main(args) == 0  # ... then the rest
    rows = read(out / OUTPUT)
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 5, 6]
    rejected = read(out / "rejected.jsonl")
    assert [(r["index"], "unknown row shape" in r["reason"]) for r in rejected] == [(4, True)]
    full = tmp_path / "full"
    regenerate_main([a if a != str(out) else str(full) for a in args])
    assert read(full / OUTPUT) == rows
    ds = datasets.load_from_disk(str(out / "tokenized"))
    man = load_manifest(out / "tokenized")
    assert len(ds) == man["rows"] == 6 and ds["index"] == [0, 1, 2, 3, 5, 6]
    assert man["target"] == "tiny-llama" and man["mask_method"] == "offsets"
    assert 0 < man["assistant_share"] < 1
    # the separate tokenize script gives the same set
    from dspark.data.tokenize_cli import tokenize_main

    again = tmp_path / "tok2"
    tok_args = ["--target", "tiny-llama", "--input", str(out / OUTPUT), "--output", str(again)]
    assert tokenize_main(tok_args + ["--max-length", "256"]) == 0
    ds2 = datasets.load_from_disk(str(again))
    assert ds2["input_ids"] == ds["input_ids"] and ds2["loss_mask"] == ds["loss_mask"]
    # several sources joined by commas: one set, their rows in that order, rejects of each
    joined = tmp_path / "joined"
    both = f"{out / OUTPUT},{src}"
    assert tokenize_main(["--target", "tiny-llama", "--input", both, "--output", str(joined)]) == 0
    ds3 = datasets.load_from_disk(str(joined))
    alone = tmp_path / "src_alone"
    assert (
        tokenize_main(["--target", "tiny-llama", "--input", str(src), "--output", str(alone)]) == 0
    )
    ds4 = datasets.load_from_disk(str(alone))
    assert len(ds3) == len(ds) + len(ds4) and len(ds4) > 0
    for col in ("input_ids", "loss_mask"):
        assert list(ds3[col]) == list(ds2[col]) + list(ds4[col])
    assert [r["index"] for r in read(joined / "rejected.jsonl")] == [4]


def test_per_row_sampling_ignores_batch_neighbours(backend):
    conv = [{"role": "user", "content": "hi there"}]
    s = SamplingConfig(temperature=1.0, max_new_tokens=6)
    batch = [r.text for r in backend.generate([conv] * 3, [1, 2, 1], s)]
    alone = [r.text for r in backend.generate([conv], [2], s)]
    greedy = [r.text for r in backend.generate([conv], [2], SamplingConfig(max_new_tokens=6))]
    assert batch[0] == batch[2] != batch[1] == alone[0]
    assert len({batch[0], batch[1], greedy[0]}) == 3
