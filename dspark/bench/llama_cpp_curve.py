"""What a llama.cpp target pass of n tokens costs on this machine, measured with `llama-bench`
(built beside `llama-server`): passes of 1..N tokens after `depth` tokens of context, the shape
of a verify pass. The curve prices verification in the flag tuner (llama_cpp_flags.RoundCost
`verify_ms`), so `n_max` lands where the kernels are cheap: a quant whose CPU kernels run 4
rows at a time verifies 1 + 3 drafts for little more than 2 tokens, and Q4_1, which is never
repacked for them, pays nearly n single steps.

    llama-bench -m TARGET.gguf -p 1,2,...,N -n 0 -d DEPTH -t THREADS -r REPS -o json

Each entry's `avg_ns` is one pass of `n_prompt` tokens; the curve is `{n: ms}`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def bench_command(bench_bin, gguf, threads: int, depth: int = 128, max_n: int = 8, reps: int = 5):
    ns = ",".join(str(n) for n in range(1, max_n + 1))
    return [str(bench_bin), "-m", str(gguf), "-p", ns, "-n", "0", "-d", str(depth),
            "-t", str(threads), "-r", str(reps), "-o", "json"]  # fmt: skip


def parse_curve(text: str) -> dict[int, float]:
    """`{n_prompt: ms per pass}` from llama-bench's JSON output (its prompt-only tests)."""
    curve = {}
    for entry in json.loads(text):
        if int(entry.get("n_gen", 0)) == 0 and int(entry.get("n_prompt", 0)) > 0:
            curve[int(entry["n_prompt"])] = float(entry["avg_ns"]) / 1e6
    if not curve:
        raise ValueError("llama-bench printed no prompt-pass test (expected -p N -n 0 -o json)")
    return dict(sorted(curve.items()))


def measure_curve(bench_bin, gguf, threads: int, depth: int = 128, max_n: int = 8,
                  reps: int = 5) -> dict[int, float]:  # fmt: skip
    """Run `llama-bench` (see the module docstring) and return the curve."""
    if not Path(bench_bin).is_file():
        raise FileNotFoundError(f"{bench_bin}: llama-bench is built by `make llama-server`")
    res = subprocess.run(bench_command(bench_bin, gguf, threads, depth, max_n, reps),
                         capture_output=True, text=True, check=True)  # fmt: skip
    return parse_curve(res.stdout)


def relative(curve: dict[int, float]) -> dict[int, float]:
    """The curve in single-token passes: how quants and machines compare."""
    one = curve[min(curve)]
    return {n: round(ms / one, 3) for n, ms in curve.items()}


def server_curve(settings, block_size: int, progress) -> dict[int, float] | None:
    """The target's pass costs for 1..block_size tokens from the `llama-bench` built beside a
    native `llama-server` (llama_cpp_curve.py); None without one (the fit then prices verify
    work linearly)."""
    if not getattr(settings, "server_bin", None):  # xllamacpp, or a simulated engine
        return None
    bench_bin = Path(settings.server_bin).parent / "llama-bench"
    if not bench_bin.is_file():
        return None
    curve = measure_curve(bench_bin, settings.target_gguf, settings.threads, max_n=block_size)
    progress(f"verify curve (single-token passes): {relative(curve)}")
    return curve
