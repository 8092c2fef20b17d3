"""A byte-counting TCP relay on the loopback: what crosses between two processes (llama-server
and an `rpc-server` holding the draft) in bytes and in round trips, without touching the
protocol. One listening port; each accepted connection is piped to `upstream` both ways.

A round trip is counted each time the traffic turns from the client's direction to the
server's (a request answered): the number of network latencies a round waits for.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass


@dataclass
class Traffic:
    to_server: int = 0
    to_client: int = 0
    round_trips: int = 0

    def minus(self, before: Traffic) -> Traffic:
        return Traffic(self.to_server - before.to_server, self.to_client - before.to_client,
                       self.round_trips - before.round_trips)  # fmt: skip


class TcpRelay:
    """`TcpRelay(upstream_port)`: listens on 127.0.0.1:`port`; `snapshot()` the counters."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._t = Traffic()
        self._last_dir: dict[int, str] = {}
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def snapshot(self) -> Traffic:
        with self._lock:
            return Traffic(self._t.to_server, self._t.to_client, self._t.round_trips)

    def _count(self, conn_id: int, direction: str, n: int) -> None:
        with self._lock:
            if direction == "up":
                self._t.to_server += n
            else:
                self._t.to_client += n
                if self._last_dir.get(conn_id) == "up":
                    self._t.round_trips += 1
            self._last_dir[conn_id] = direction

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid = id(client)
            threading.Thread(
                target=self._pipe, args=(client, server, cid, "up"), daemon=True
            ).start()
            threading.Thread(
                target=self._pipe, args=(server, client, cid, "down"), daemon=True
            ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, cid: int, direction: str) -> None:
        try:
            while data := src.recv(1 << 16):
                self._count(cid, direction, len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._sock.close()
