"""The draft on another node through llama.cpp's own RPC backend: `ggml-rpc-server` holds the draft
(node B), `llama-server` runs the target and drafts through `--rpc` (node A). Both nodes are
processes on this machine's loopback, with a byte-counting relay between them
(dspark/bench/tcp_relay.py); the same prompts decode with the draft local, then remote.

    make llama-server      # builds ggml-rpc-server with ggml's RPC backend
    python eval/rpc_draft.py --server-bin $DSPARK_CACHE/llama_cpp/build-native/bin/llama-server \
        --draft runs/quickstart/draft --n-max 2

Reports tok/s and output equality against the local run, the bytes each way and round trips
per speculative round, and that traffic priced for real links (--links, --rtt-ms): the time a
round would wait on the network, and the tok/s it leaves. Writes OUTPUT/rpc.json and rpc.md.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import BadInputError, MissingPathError, user_errors

LINKS_GBPS = {"1 GbE": 1.0, "10 GbE": 10.0, "100 GbE": 100.0}


def rpc_args(port: int) -> list[str]:
    """llama-server flags that put the draft (all its layers) on the RPC node at `port` and keep
    the target on this node's CPU."""
    return ["--rpc", f"127.0.0.1:{port}", "--spec-draft-device", "RPC0", "--spec-draft-ngl", "all",
            "-ngl", "0"]  # fmt: skip


def priced(per_round: dict, local_round_ms: float, tau: float, rtts_ms: list[float]) -> list:
    """Each link and RTT: the network ms a round adds (its round trips x RTT + its bytes over
    the link) and the tok/s left (tau tokens per round)."""
    rows = []
    for link, gbps in LINKS_GBPS.items():
        for rtt in rtts_ms:
            wire_ms = (per_round["to_server"] + per_round["to_client"]) * 8 / (gbps * 1e6)
            add = per_round["round_trips"] * rtt + wire_ms
            rows.append({"link": link, "rtt_ms": rtt, "added_ms_per_round": add,
                         "tokens_per_s": 1e3 * tau / (local_round_ms + add)})  # fmt: skip
    return rows


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--rpc-server-bin", default=None, help="default: beside --server-bin")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--target-gguf", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--draft-gguf", default=None)
    ap.add_argument("--n-max", type=int, default=2)
    ap.add_argument("--p-min", type=float, default=0.0)
    ap.add_argument("--datasets", default="gsm8k,mt-bench")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rtt-ms", default="0.05,0.2,1.0", help="round-trip times to price")
    ap.add_argument("--output-dir", default="runs/rpc_draft")
    a = ap.parse_args(argv)
    if not (a.draft or a.draft_gguf):
        raise BadInputError("pass --draft DIR or --draft-gguf FILE")
    a.rtts = [float(x) for x in a.rtt_ms.split(",") if x.strip()]
    return a


def decode(settings, mode, prompts, max_new, relay=None) -> dict:
    from dspark.bench.llama_cpp import NativeServerEngine

    engine = NativeServerEngine(settings, mode)
    texts, tokens, ms, drafted, accepted, traffic = [], 0, 0.0, 0, 0, None
    try:
        engine.complete(prompts[0], 8)  # warm-up
        before = relay.snapshot() if relay else None
        for p in prompts:
            c = engine.complete(p, max_new)
            texts.append(c.text)
            tokens, ms = tokens + c.predicted_n, ms + c.predicted_ms
            drafted, accepted = drafted + c.draft_n, accepted + c.draft_accepted
        if relay:
            traffic = relay.snapshot().minus(before)
    finally:
        engine.close()
    rounds = max(tokens - accepted, 1)
    return {"texts": texts, "tokens": tokens, "decode_ms": ms, "tokens_per_s": 1e3 * tokens / ms,
            "drafted": drafted, "accepted": accepted, "rounds": rounds, "tau": tokens / rounds,
            "round_ms": ms / rounds, "traffic": traffic}  # fmt: skip


def main(argv=None) -> None:
    with user_errors("rpc_draft"):
        a = parse(argv)
        from dataclasses import asdict, replace

        from dspark.bench.llama_cpp import EngineSettings, Mode, draft_gguf_of, target_gguf_of
        from dspark.bench.llama_cpp_report import prompt_sets
        from dspark.bench.tcp_relay import TcpRelay
        from dspark.fileio import dumps_strict, write_text_atomic
        from dspark.machine import cpu_name
        from dspark.target import load_tokenizer

        out = Path(a.output_dir)
        rpc_bin = Path(a.rpc_server_bin or Path(a.server_bin).parent / "ggml-rpc-server")
        if not rpc_bin.is_file():
            raise MissingPathError(
                f"{rpc_bin}: no ggml-rpc-server; build it with `make llama-server`"
            )
        target_gguf = target_gguf_of(a.target, a.target_gguf)
        draft_gguf = draft_gguf_of(a.draft, a.draft_gguf, out, a.target)
        sets = [d.strip() for d in a.datasets.split(",") if d.strip()]
        ids = prompt_sets(load_tokenizer(a.target), sets, a.bench_dir, 0, a.num_prompts)
        prompts = [p for s in sets for p in ids[s]]
        mode = Mode("draft-dspark", a.n_max, a.p_min)
        local = EngineSettings(target_gguf, draft_gguf, threads=a.threads, server_bin=a.server_bin)
        print("draft local", flush=True)
        here = decode(local, mode, prompts, a.max_new_tokens)
        from dspark.engines.llama_server import free_port

        port = free_port()
        node_b = subprocess.Popen([str(rpc_bin), "-H", "127.0.0.1", "-p", str(port), "-t",
                                   str(a.threads)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)  # fmt: skip
        relay = TcpRelay(port)
        try:
            time.sleep(1.0)  # rpc-server binds its port
            remote = replace(local, extra_args=tuple(rpc_args(relay.port)))
            print("draft on the RPC node", flush=True)
            there = decode(remote, mode, prompts, a.max_new_tokens, relay)
        finally:
            relay.close()
            node_b.terminate()
            node_b.wait(10)
        t = there["traffic"]
        per_round = {k: v / there["rounds"] for k, v in asdict(t).items()}
        equal = sum(x == y for x, y in zip(here["texts"], there["texts"])) / len(prompts)
        result = {
            "conditions": {
                "cpu": cpu_name(),
                "threads": a.threads,
                "target_gguf": target_gguf,
                "draft_gguf": draft_gguf,
                "n_max": a.n_max,
                "p_min": a.p_min,
                "prompts": len(prompts),
                "max_new_tokens": a.max_new_tokens,
                "nodes": "two processes on the loopback",
            },  # fmt: skip
            "local": {k: v for k, v in here.items() if k not in ("texts", "traffic")},
            "rpc": {k: v for k, v in there.items() if k not in ("texts", "traffic")},
            "output_equal_share": equal,
            "traffic_per_round": per_round,
            "priced": priced(per_round, here["round_ms"], here["tau"], a.rtts),
        }
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "rpc.json", dumps_strict(result, indent=2) + "\n")
        lines = [
            "# The draft on an RPC node", "",
            f"{result['conditions']}", "",
            f"- local draft: {here['tokens_per_s']:.1f} tok/s, tau {here['tau']:.2f}",
            f"- draft on the RPC node (loopback): {there['tokens_per_s']:.1f} tok/s, tau "
            f"{there['tau']:.2f}; output equal to the local run on {100 * equal:.0f}% of prompts",
            f"- per round: {per_round['to_server']:.0f} B to the draft node, "
            f"{per_round['to_client']:.0f} B back, {per_round['round_trips']:.1f} round trips", "",
            "| link | RTT (ms) | network ms per round | tok/s |", "|---|---|---|---|",
            *[f"| {p['link']} | {p['rtt_ms']:g} | {p['added_ms_per_round']:.3f} | "
              f"{p['tokens_per_s']:.1f} |" for p in result["priced"]],
        ]  # fmt: skip
        report = write_text_atomic(out / "rpc.md", "\n".join(lines) + "\n")
    print(report.read_text())


if __name__ == "__main__":
    main()
