"""The byte-counting relay between llama-server and an RPC node, against an echo server whose
traffic is known, and the pricing of that traffic on real links, by hand."""

from __future__ import annotations

import importlib.util
import socket
import threading
from pathlib import Path

import pytest

from dspark.bench.tcp_relay import TcpRelay

spec = importlib.util.spec_from_file_location(
    "rpc_draft", Path(__file__).resolve().parents[1] / "eval" / "rpc_draft.py"
)
rpc_draft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rpc_draft)


def _echo_server() -> int:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data * 2)  # an answer twice the request's size

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        buf += s.recv(n - len(buf))
    return buf


def test_the_relay_counts_bytes_and_round_trips():
    relay = TcpRelay(_echo_server())
    before = relay.snapshot()
    with socket.create_connection(("127.0.0.1", relay.port)) as c:
        for msg in (b"abc", b"hello", b"x" * 100):
            c.sendall(msg)
            assert _recv_exactly(c, 2 * len(msg)) == msg * 2
    t = relay.snapshot().minus(before)
    relay.close()
    assert (t.to_server, t.to_client, t.round_trips) == (108, 216, 3)


def test_pricing_by_hand():
    per_round = {"to_server": 1000.0, "to_client": 250.0, "round_trips": 2.0}
    rows = rpc_draft.priced(per_round, local_round_ms=20.0, tau=2.0, rtts_ms=[0.1])
    ten = next(r for r in rows if r["link"] == "10 GbE")
    # 2 x 0.1 ms + 1250 B x 8 / 10 Gbit/s = 0.2 + 0.001 ms
    assert ten["added_ms_per_round"] == pytest.approx(0.201)
    assert ten["tokens_per_s"] == pytest.approx(1e3 * 2.0 / 20.201)
    assert rpc_draft.rpc_args(5000)[:2] == ["--rpc", "127.0.0.1:5000"]
    assert "RPC0" in rpc_draft.rpc_args(5000) and "-ngl" in rpc_draft.rpc_args(5000)
