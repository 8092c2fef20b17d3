"""Plain decoding in other dtypes beside the decoding one (`baseline_dtypes`), and the speedup
against the fastest plain decoding measured on this machine in any dtype.

The decoding dtype's plain figure is the benchmark's `autoregressive` timer; each other dtype
gets a copy of the target cast to it, decoded with the same decoder's plain path on the same
prompts, interleaved with the other decoders, under the timer `autoregressive_<dtype>`.

With `baseline_probe_margin` > 0 and `dtype=auto`, a dtype whose plain AR step the dtype probe
measured over `margin` times the fastest candidate's is not decoded end to end: it cannot be
the fastest plain decoding by that margin, and timing it costs a whole pass over the prompts
(~1.5 min of the quickstart on a 2-core AVX-512 CPU, where fp32 steps cost ~2x bf16's). The
report names it with the probe's figures instead.
"""

from __future__ import annotations

import copy

import torch

from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder
from dspark.eval.metrics import ratio
from dspark.target.loading import _as_dtype

PREFIX = "autoregressive_"


def dtype_name(dtype: torch.dtype | str) -> str:
    return str(_as_dtype(dtype) if isinstance(dtype, str) else dtype).replace("torch.", "")


def probe_skipped(cfg, auto: dict | None, own: str) -> dict[str, dict]:
    """dtype -> {"t_ar", "fastest_t_ar", "ratio", "margin"} for each of `cfg.baseline_dtypes`
    other than the decoding dtype `own` whose probed AR step is over `cfg.baseline_probe_margin`
    times the fastest probed one (see above); {} without a margin or a dtype probe (an explicit
    `dtype`). A fixed per-token overhead (sampling, Python) adds the same time to every dtype's
    step, so a dtype slower in the probe is slower end to end, by a smaller ratio; the margin
    is for the probe's noise."""
    margin = float(getattr(cfg, "baseline_probe_margin", 0) or 0)
    measured = ((auto or {}).get("dtype") or {}).get("measured") or {}
    steps = {d: p.get("t_ar") for d, p in measured.items() if p.get("t_ar")}
    if margin <= 0 or not steps:
        return {}
    best = min(steps.values())
    out = {}
    for name in cfg.baseline_dtypes:
        d = dtype_name(name)
        t = steps.get(d)
        if d != own and t is not None and t > margin * best:
            out[d] = {"t_ar": t, "fastest_t_ar": best, "ratio": t / best, "margin": margin}
    return out


def plain_decoders(cfg, target, skip: dict | None = None) -> dict[str, object]:
    """dtype name -> a plain `SpeculativeDecoder` over a copy of `target` in that dtype, for
    each of `cfg.baseline_dtypes` other than the target's own and those in `skip`
    (`probe_skipped`)."""

    own = dtype_name(next(target.parameters()).dtype)
    out: dict[str, object] = {}
    for name in cfg.baseline_dtypes:
        d = dtype_name(name)
        if d == own or d in out or d in (skip or {}):
            continue
        copy_ = copy.deepcopy(target).to(getattr(torch, d)).eval()
        out[d] = SpeculativeDecoder(
            copy_,
            None,
            DecoderOptions(
                Sampling(cfg.temperature, cfg.top_k, cfg.top_p),
                max_length=int(getattr(target.config, "max_position_embeddings", 0) or 32768),
                compile=cfg.compile,
            ),
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
    skipped = (results.get("auto_settings") or {}).get("baseline_skipped") or {}
    notes = [
        f"Not decoded end to end: {d}, whose plain AR step the dtype probe measured at "
        f"{1e3 * s['t_ar']:.1f} ms, {s['ratio']:.2f}x the fastest candidate's "
        f"{1e3 * s['fastest_t_ar']:.1f} ms (over baseline_probe_margin={s['margin']:g}, so it "
        "cannot be the fastest plain decoding here; the probe's table is below)."
        for d, s in skipped.items()
    ]
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
        *[line for n in notes for line in (n, "")],
    ]
