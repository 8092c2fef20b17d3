"""The load generator against a fake OpenAI-compatible streaming server on the loopback: two
concurrency levels, bounded requests, figures computed by hand, and refusal of any address
that is not this machine."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from dspark.bench.load_server import check_loopback, render, run_level, summarize
from dspark.errors import BadInputError

TOKENS, DELAY = 5, 0.01


class FakeServer(http.server.BaseHTTPRequestHandler):
    """Streams TOKENS chunks DELAY s apart, then llama-server-like `timings`; tracks how many
    requests run at once."""

    active = 0
    peak = 0
    guard = threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] is True and body["max_tokens"] == TOKENS
        with FakeServer.guard:
            FakeServer.active += 1
            FakeServer.peak = max(FakeServer.peak, FakeServer.active)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(TOKENS):
            time.sleep(DELAY)
            self.wfile.write(f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n'.encode())
            self.wfile.flush()
        done = {"choices": [{"text": ""}], "timings": {"predicted_n": TOKENS, "draft_n": 4,
                                                       "draft_n_accepted": 3}}  # fmt: skip
        self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        with FakeServer.guard:
            FakeServer.active -= 1


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_two_levels_against_a_streaming_server(server):
    by_level = []
    for c in (1, 4):
        FakeServer.peak = 0
        res, wall = run_level(server, [[1, 2, 3], [4, 5]], c, TOKENS, max_requests=8,
                              time_limit_s=30)  # fmt: skip
        s = summarize(res, wall, c)
        assert s["requests"] == 8 and s["errors"] == 0 and FakeServer.peak == c
        assert s["tokens"] == 8 * TOKENS and s["drafted"] == 32 and s["accepted"] == 24
        assert s["acceptance"] == 0.75 and s["speculating_share"] == 1.0
        assert s["tokens_per_s"] == pytest.approx(8 * TOKENS / wall)
        assert 0 < s["ttft_s"]["p50"] <= s["latency_s"]["p50"] <= s["latency_s"]["p99"]
        by_level.append(s)
    # four clients finish the same 8 requests in well under the one client's time
    assert by_level[1]["wall_s"] < by_level[0]["wall_s"]
    md = render({"plain": by_level}, {"cpu": "x"})
    assert "| plain | 4 | 8 |" in md


def test_a_level_stops_at_its_time_limit(server):
    res, wall = run_level(server, [[1]], 2, TOKENS, max_requests=1000, time_limit_s=0.2)
    assert 0 < len(res) < 1000 and wall < 5


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1:8080", "http://example.com", "http://192.168.1.2"]
)
def test_only_loopback_is_a_target(url):
    with pytest.raises(BadInputError, match="only targets a server on this machine"):
        check_loopback(url)
    for ok in ("http://127.0.0.1:1", "http://localhost:2", "http://[::1]:3", "http://127.5.0.1"):
        assert check_loopback(ok) == ok


def test_percentiles_by_hand():
    from dspark.bench.load_server import RequestResult

    res = [RequestResult(0.0, 0.1 * i, float(i), 1) for i in range(1, 11)]  # latencies 1..10 s
    s = summarize(res, 10.0, 1)
    assert s["latency_s"] == {"p50": 5.0, "p90": 9.0, "p99": 10.0}
    assert s["ttft_s"]["p50"] == pytest.approx(0.5) and s["acceptance"] is None
