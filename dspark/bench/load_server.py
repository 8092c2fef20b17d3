"""Load on a real server: concurrent streaming completions against an OpenAI-compatible
endpoint on this machine (llama-server with parallel slots), and the figures a serving user
reads: throughput, per-request latency p50 / p90 / p99, time to first token, and the
server's own drafted / accepted token counts (llama-server's `timings`).

Bounded and local by construction: only loopback URLs are accepted (127.0.0.0/8, localhost,
::1); each level sends at most `max_requests` requests and stops starting new ones after
`time_limit_s`; every request has a timeout.
"""

from __future__ import annotations

import ipaddress
import json
import math
import statistics
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from dspark.errors import BadInputError
from dspark.plotting import plt


def check_loopback(url: str) -> str:
    """`url` when its host is this machine's loopback; else a `BadInputError`."""
    host = urllib.parse.urlparse(url).hostname or ""
    ok = host == "localhost"
    if not ok:
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = False
    if not ok:
        raise BadInputError(
            f"{url}: the load generator only targets a server on this machine (127.0.0.1, "
            "localhost or ::1); start the server on the loopback and pass its URL"
        )
    return url


@dataclass
class RequestResult:
    start: float
    first: float | None  # first streamed text
    end: float
    tokens: int
    draft_n: int = 0
    draft_accepted: int = 0
    error: str | None = None

    @property
    def latency_s(self) -> float:
        return self.end - self.start

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.start


def stream_completion(url: str, prompt, max_tokens: int, timeout_s: float = 600.0) -> RequestResult:
    """One streamed `/v1/completions` request (greedy); the server's final `timings` give the
    token and draft counts where it sends them, else the streamed chunks are counted."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "top_k": 1,
            "stream": True, "cache_prompt": False}  # fmt: skip
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    start, first, chunks = time.monotonic(), None, 0
    timings: dict = {}
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                msg = json.loads(line[5:])
                text = ((msg.get("choices") or [{}])[0] or {}).get("text") or ""
                if text:
                    chunks += 1
                    first = first or time.monotonic()
                timings = msg.get("timings") or timings
    except (OSError, ValueError) as e:
        return RequestResult(start, first, time.monotonic(), chunks, error=str(e)[:200])
    return RequestResult(
        start,
        first,
        time.monotonic(),
        int(timings.get("predicted_n", chunks)),
        int(timings.get("draft_n", 0)),
        int(timings.get("draft_n_accepted", 0)),
    )


def run_level(url: str, prompts: list, concurrency: int, max_tokens: int, max_requests: int,
              time_limit_s: float) -> tuple[list[RequestResult], float]:  # fmt: skip
    """`concurrency` clients, each sending the next prompt (round robin) as soon as its last
    answer ends, until `max_requests` are sent or `time_limit_s` has passed; the results and
    the level's wall time."""
    check_loopback(url)
    lock, sent, results = threading.Lock(), [0], []
    t0 = time.monotonic()

    def client() -> None:
        while True:
            with lock:
                if sent[0] >= max_requests or time.monotonic() - t0 >= time_limit_s:
                    return
                prompt = prompts[sent[0] % len(prompts)]
                sent[0] += 1
            res = stream_completion(url, prompt, max_tokens)
            with lock:
                results.append(res)

    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(concurrency):
            pool.submit(client)
    return results, time.monotonic() - t0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)  # nearest rank
    return values[max(1, math.ceil(q / 100 * len(values))) - 1]


def summarize(results: list[RequestResult], wall_s: float, concurrency: int) -> dict:
    """A level's figures (see the module docstring)."""
    ok = [r for r in results if r.error is None]
    lat = [r.latency_s for r in ok]
    ttft = [t for r in ok if (t := r.ttft_s) is not None]
    tokens = sum(r.tokens for r in ok)
    drafted = sum(r.draft_n for r in ok)
    accepted = sum(r.draft_accepted for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "latency_s": {f"p{q}": _pct(lat, q) for q in (50, 90, 99)},
        "ttft_s": {f"p{q}": _pct(ttft, q) for q in (50, 90)},
        "mean_latency_s": statistics.fmean(lat) if lat else None,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        # requests in which the server drafted at all: below 1, it fell back to plain steps
        "speculating_share": sum(r.draft_n > 0 for r in ok) / len(ok) if ok else None,
        "per_request": [asdict(r) for r in results],
    }


def render(by_mode: dict[str, list[dict]], conditions: dict) -> str:
    """Markdown: one row per mode and concurrency level."""
    c = conditions
    lines = [
        "# Load on llama-server",
        "",
        f"{c.get('cpu')}, {c.get('threads')} threads, {c.get('parallel')} slots, target "
        f"`{c.get('target_gguf')}`, draft `{c.get('draft_gguf')}`; T=0, {c.get('max_new_tokens')} "
        f"new tokens, prompts: {c.get('prompts')}; loopback. Throughput counts the answers' "
        "tokens over the level's wall time.",
        "",
        "| mode | concurrency | requests | tok/s | latency p50 / p90 / p99 (s) | TTFT p50 / p90 (s) "
        "| drafted | accepted | speculating |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def f(v, d=2):
        return "" if v is None else f"{v:.{d}f}"

    for mode, levels in by_mode.items():
        for s in levels:
            lat, ttft = s["latency_s"], s["ttft_s"]
            spec = s["speculating_share"]
            lines.append(
                f"| {mode} | {s['concurrency']} | {s['requests']} | {f(s['tokens_per_s'], 1)} | "
                f"{f(lat['p50'])} / {f(lat['p90'])} / {f(lat['p99'])} | "
                f"{f(ttft['p50'])} / {f(ttft['p90'])} | {s['drafted']} | {s['accepted']} | "
                f"{'' if spec is None else f'{100 * spec:.0f}%'} |"
            )
    return "\n".join(lines) + "\n"


def plot(by_mode: dict[str, list[dict]], path) -> None:
    """Throughput and p90 latency against concurrency, one line per mode (PNG)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, levels in by_mode.items():
        xs = [s["concurrency"] for s in levels]
        a.plot(xs, [s["tokens_per_s"] or 0 for s in levels], marker="o", label=mode)
        b.plot(xs, [s["latency_s"]["p90"] or 0 for s in levels], marker="o", label=mode)
    for ax, title in ((a, "throughput (tok/s)"), (b, "p90 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
