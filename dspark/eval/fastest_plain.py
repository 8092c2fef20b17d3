"""Plain decoding in other dtypes beside the decoding one (`baseline_dtypes`), and the speedup
against the fastest plain decoding measured on this machine in any dtype.

The decoding dtype's plain figure is the benchmark's `autoregressive` timer; each other dtype
gets a copy of the target cast to it, decoded with the same decoder's plain path on the same
prompts, interleaved with the other decoders, under the timer `autoregressive_<dtype>`.
"""

from __future__ import annotations

import copy

import torch

from dspark.eval.metrics import ratio

PREFIX = "autoregressive_"


def dtype_name(dtype: torch.dtype | str) -> str:
    from dspark.target.loading import _as_dtype

    return str(_as_dtype(dtype) if isinstance(dtype, str) else dtype).replace("torch.", "")


def plain_decoders(cfg, target) -> dict[str, object]:
    """dtype name -> a plain `SpeculativeDecoder` over a copy of `target` in that dtype, for
    each of `cfg.baseline_dtypes` other than the target's own."""
    from dspark.decoding import SpeculativeDecoder

    own = dtype_name(next(target.parameters()).dtype)
    out: dict[str, object] = {}
    for name in cfg.baseline_dtypes:
        d = dtype_name(name)
        if d == own or d in out:
            continue
        copy_ = copy.deepcopy(target).to(getattr(torch, d)).eval()
        out[d] = SpeculativeDecoder(
            copy_,
            None,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_length=int(getattr(target.config, "max_position_embeddings", 0) or 32768),
            compile=cfg.compile,
        )
    return out


def summary(timers: dict, own: str, spec_tokens_per_s: float | None) -> dict:
    """{"plain_by_dtype": {dtype: tok/s}, "fastest_plain_dtype", "speedup_vs_same_dtype_plain",
    "speedup_vs_fastest_plain"}; `timers` maps timer names to `Timer`s."""
    plain = {own: timers["autoregressive"].report()["tokens_per_s"]}
    for name, t in timers.items():
        if name.startswith(PREFIX):
            plain[name.removeprefix(PREFIX)] = t.report()["tokens_per_s"]
    known = {d: v for d, v in plain.items() if v is not None}
    fastest = max(known, key=lambda d: known[d]) if known else None
    return {
        "plain_by_dtype": plain,
        "fastest_plain_dtype": fastest,
        "speedup_vs_same_dtype_plain": ratio(spec_tokens_per_s, plain[own]),
        "speedup_vs_fastest_plain": ratio(spec_tokens_per_s, known[fastest] if fastest else None),
    }


def report_lines(results: dict) -> list[str]:
    """Markdown: per dataset, plain tok/s per dtype and the two speedups."""
    rows = []
    every = {n: d["speed"] for n, d in results["datasets"].items()}
    every["**all**"] = results.get("overall", {})
    for name, speed in every.items():
        f = speed.get("fastest_plain")
        if not f:
            continue
        plain = ", ".join(
            f"{k} {v:.1f}" if v is not None else f"{k} n/a" for k, v in f["plain_by_dtype"].items()
        )
        x = lambda v: "n/a" if v is None else f"{v:.2f}x"  # noqa: E731
        rows.append(f"| {name} | {plain} | {f['fastest_plain_dtype']} | "
                    f"{x(f['speedup_vs_same_dtype_plain'])} | "
                    f"{x(f['speedup_vs_fastest_plain'])} |")  # fmt: skip
    if not rows:
        return []
    return [
        "## Against the fastest plain decoding",
        "",
        "Conditions: the speed table's (same prompts and max_new_tokens, calls interleaved "
        "per batch; each other dtype on a copy of the target cast to it). "
        "Plain decoding (tok/s) in every dtype measured on this machine, the fastest of them, "
        "and the speculative decoder's speedup against plain decoding in its own dtype and "
        "against the fastest (with one dtype measured they are the same).",
        "",
        "| dataset | plain tok/s by dtype | fastest plain | speedup vs same dtype | "
        "speedup vs fastest plain |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
