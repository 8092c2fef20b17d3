"""Decoder step times on one device against the target's weight-bandwidth floor.

At batch 1 an autoregressive step must read every target weight once, so its floor is
`weight_bytes / memory_bandwidth`; the bandwidth is measured here (a large device copy, read +
write), not taken from a data sheet. Step times are differences of two runs of different
lengths (same prompt), so prefill, warm-up and compilation drop out:
`t_step = (wall(n_long) - wall(n_short)) / (steps(n_long) - steps(n_short))`.
Decoder efficiency = t_AR / t_round: the speedup per token of acceptance length (speedup / tau),
which needs no trained draft (a random draft gives the round's cost; its tau does not matter).
Modes: eager, compile (`torch.compile(dynamic=True)` on the target's layer loop), cudagraphs
(`mode="reduce-overhead"`: CUDA graphs over the static caches, CUDA only).
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM

from dspark.decoding import DecoderOptions, SpeculativeDecoder
from dspark.timing import sync


def copy_bandwidth(device: torch.device, mbytes: int = 512, iters: int = 10) -> float:
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    n = mbytes * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync(device)
    return 2 * src.numel() * src.element_size() * iters / (time.perf_counter() - t0)


def weight_bytes(model) -> int:
    """Bytes of the distinct parameters (a tied head is read once per step anyway)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def random_target(config, dtype: torch.dtype, device: torch.device):
    """A random-weight target of `config`'s shape (step times do not depend on the weights)."""
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval().requires_grad_(False)


def make_decoder(target, draft, mode: str):

    if mode == "eager":
        return SpeculativeDecoder(target, draft, DecoderOptions(max_length=1024))
    if mode == "compile":
        return SpeculativeDecoder(target, draft, DecoderOptions(max_length=1024, compile=True))
    if mode == "cudagraphs":
        dec = SpeculativeDecoder(target, draft, DecoderOptions(max_length=1024, kv_bucket=128))
        dec.runner.compile(mode="reduce-overhead", dynamic=False)
        return dec
    raise ValueError(f"unknown mode {mode!r}: eager | compile | cudagraphs")


def step_times(target, draft, mode: str, prompt_len: int = 64, short: int = 8, long: int = 40):
    """`{"ar_step_s", "round_s"}` for one mode (batch 1, greedy), warm (each length run twice)."""
    g = torch.Generator().manual_seed(0)
    prompt = [torch.randint(0, target.config.vocab_size - 2, (prompt_len,), generator=g).tolist()]
    dec = make_decoder(target, draft, mode)

    def timed(fn, n):
        fn(prompt, n)  # warm: compilation / graph capture for this length's shapes
        out = fn(prompt, n)
        return out.wall_time_s, sum(out.num_rounds)

    (ws, ss), (wl, sl) = (
        timed(dec.generate_autoregressive, short),
        timed(dec.generate_autoregressive, long),
    )
    result = {"ar_step_s": (wl - ws) / max(1, sl - ss)}
    if draft is not None:
        (ws, rs), (wl, rl) = timed(dec.generate, short), timed(dec.generate, long)
        result["round_s"] = (wl - ws) / max(1, rl - rs)
        result["efficiency"] = result["ar_step_s"] / result["round_s"]
    return result
