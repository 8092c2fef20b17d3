"""A short measured probe of each candidate dtype on this device, cached per device and target.

`load_or_probe(target, ...)` returns the profile `dspark.dtype_choice` decides from: per dtype
the plain AR step, the target pass of n tokens (tapped) and, with a draft, one draft round, all
at the batch B the job runs (B rows over a `context_len`-token context; medians over
interleaved rounds of every figure of every candidate, each the median of `repeats` calls after
a warm-up). Each candidate runs on a copy of the target (and draft) cast to it, so the caller's
models are left as they are; the numbers are about speed only (random token ids). The verify
curve is fitted non-decreasing in its token count (`dtype_choice.nondecreasing_fit`).

Cached under `$DSPARK_CACHE/dtype_probe/` keyed by the device's kind (`dspark.machine.cpu_kind`
on CPUs, since one model name covers AVX2 and AVX-512 parts; the CUDA name otherwise), CPU
threads, target, batch, the token counts measured and the draft's shape: a second job on the
same machine reads it back instead of measuring again.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch

from dspark.decoding.round_cost import RoundBench
from dspark.dtype_choice import CANDIDATES, choose_dtype, nondecreasing_fit
from dspark.errors import user_errors
from dspark.fileio import write_text_atomic
from dspark.locking import read_or_compute
from dspark.machine import device_kind
from dspark.paths import cache_root
from dspark.target import load_target
from dspark.target.loading import _as_dtype

# 2: verify passes row-exact where the decoder runs them so; draft rounds per verify length;
# medians over interleaved rounds. 3: row-exact passes also run the linear layers that round by
# row count one row at a time (decoding/row_linear.py), so their cost changed where any do.
# 4: the dtypes timed in interleaved rounds; the verify curve fitted non-decreasing in n
PROBE_VERSION = 4


def _draft_signature(draft) -> dict | None:
    if draft is None:
        return None
    c = draft.config
    keys = ("num_hidden_layers", "block_size", "markov_rank", "hidden_size", "vocab_size")
    head = getattr(getattr(draft, "lm_head", None), "weight", None)
    return {k: getattr(c, k, None) for k in keys} | {
        "confidence_head": getattr(draft, "confidence_head", None) is not None,
        "head_rows": int(head.shape[0]) if head is not None else None,  # K of a reduced vocab
    }


def probe_key(
    target,
    *,
    batch: int,
    tokens: Sequence[int],
    taps: Sequence[int],
    draft,
    exact_rows: bool | None = None,
) -> dict:
    """What the cached profile is valid for (it is measured again when any of this differs)."""
    device = next(target.parameters()).device
    return {
        "version": PROBE_VERSION,
        "device": device_kind(device),
        "device_type": device.type,
        "threads": torch.get_num_threads(),
        "target": getattr(target.config, "_name_or_path", "") or target.config.model_type,
        "batch": int(batch),
        "tokens": [int(n) for n in tokens],
        "taps": [int(t) for t in taps],
        "draft": _draft_signature(draft),
        # row-exact verify passes (None: each dtype's default, row_attention.py)
        "exact_rows": None if exact_rows is None else bool(exact_rows) and int(batch) == 1,
    }


def cache_path(key: dict) -> Path:
    draft = key["draft"]
    shape = (
        "nodraft"
        if draft is None
        else f"d{draft['num_hidden_layers']}-g{draft['block_size']}-r{draft['markov_rank']}"
    )
    name = (
        f"{key['device']}__{key['threads']}t__{Path(str(key['target'])).name}__b{key['batch']}"
        f"__n{'-'.join(map(str, key['tokens']))}__{shape}"
    )
    return cache_root() / "dtype_probe" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".json")


def _points(
    target,
    draft,
    *,
    batch: int,
    tokens: Sequence[int],
    taps: Sequence[int],
    context_len: int,
    repeats: int,
    exact_rows: bool | None,
) -> dict[str, Callable[[], float]]:
    """One timer per figure of `target` (and `draft`) as they are: "t_ar", "v{n}" (a verify /
    capture pass of n tokens), "t_draft" and "d{L}" (a round drafting L tokens); each call
    returns the median of `repeats` timed calls."""
    bench = RoundBench(
        target,
        draft,
        batch=batch,
        context_len=context_len,
        max_tokens=max([1, *tokens]),
        taps=None if draft is not None else list(taps),
        exact_rows=exact_rows,
    )
    # [B, n] tokens a pass, tapped as a verify / capture pass is (no draft context written)
    gamma = int(draft.config.block_size) if draft is not None else 0
    points: dict[str, Callable[[], float]] = {"t_ar": partial(bench.time_ar, repeats)}
    for n in tokens:
        points[f"v{int(n)}"] = partial(bench.time_verify, int(n), repeats, write_context=False)
    if draft is not None:
        points["t_draft"] = partial(bench.time_draft, repeats)
        for n in tokens:  # a round verifying L drafts runs the Markov loop L steps only
            if 2 <= int(n) <= gamma + 1:
                points[f"d{int(n) - 1}"] = partial(bench.time_draft, repeats, steps=int(n) - 1)
    return points


def _sample(points: dict[str, dict[str, Callable[[], float]]], rounds: int) -> dict[str, dict]:
    """Per dtype, per figure, the median over `rounds` interleaved rounds, each timing every
    figure of every dtype once (the dtypes in turn, in alternating order). A burst of noise on a
    shared host, or a host that drifts slower, then moves one sample of every figure of every
    dtype, not every sample of one figure or of one dtype (on a 2-core VM, one-shot medians had
    chosen a verify length timed in a quiet spell, and dtypes probed one after the other had
    been compared across a drift)."""
    names = list(points)
    samples: dict[str, dict[str, list[float]]] = {d: {k: [] for k in points[d]} for d in names}
    for r in range(max(1, int(rounds))):
        for d in names if r % 2 == 0 else reversed(names):
            for k, fn in points[d].items():
                samples[d][k].append(fn())
    return {d: {k: statistics.median(v) for k, v in samples[d].items()} for d in names}


def _figures(med: dict[str, float], tokens: Sequence[int], with_draft: bool) -> dict:
    """The profile entry of one dtype from its medians: the verify curve fitted non-decreasing
    in n (`nondecreasing_fit`; the medians stay under "t_verify_measured"), and draft rounds
    never dearer for fewer drafts."""
    ns = sorted(int(n) for n in tokens)
    measured = {n: med[f"v{n}"] for n in ns}
    out: dict = {
        "t_ar": med["t_ar"],
        "t_verify": dict(zip(ns, nondecreasing_fit([measured[n] for n in ns]))),
        "t_verify_measured": measured,
        "t_draft": med.get("t_draft"),
    }
    if with_draft:
        steps = {int(k[1:]): t for k, t in med.items() if k.startswith("d")}
        # drafting fewer tokens is never dearer: a figure above a longer round's is noise
        low = float("inf")
        for L in sorted(steps, reverse=True):
            steps[L] = low = min(steps[L], low)
        out["t_draft_steps"] = steps
    return out


def probe(
    target,
    draft=None,
    *,
    candidates: Sequence[str] = CANDIDATES,
    batch: int = 1,
    tokens: Sequence[int] = (2, 8),
    taps: Sequence[int] = (),
    context_len: int = 128,
    repeats: int = 5,
    exact_rows: bool | None = None,
    rounds: int = 3,
) -> dict[str, dict]:
    """Per candidate dtype, {"t_ar", "t_verify": {n: s}, "t_verify_measured", "t_draft",
    "t_draft_steps": {L: s}} (`t_draft`: the whole block; `t_draft_steps[L]`: its first L
    tokens; `exact_rows`: verify passes as the decoder runs them, None: its default), each
    on a copy cast to it (the models are untouched), the candidates timed in interleaved
    rounds (`_sample`). Every copy is alive for the whole probe: about the target's size in
    each candidate dtype, on its device."""
    points, models = {}, []
    for name in candidates:
        dtype = _as_dtype(name)
        # copies made outside inference mode: the draft's T=0 pruner tracks weight versions
        t = copy.deepcopy(target).to(dtype).eval()
        d = copy.deepcopy(draft).to(dtype).eval() if draft is not None else None
        models.append((t, d))
        key = str(dtype).replace("torch.", "")
        points[key] = _points(
            t,
            d,
            batch=batch,
            tokens=tokens,
            taps=taps,
            context_len=context_len,
            repeats=repeats,
            exact_rows=exact_rows,
        )
    med = _sample(points, rounds)
    del points, models
    return {d: _figures(m, tokens, draft is not None) for d, m in med.items()}


def load_or_probe(
    target,
    draft=None,
    *,
    candidates: Sequence[str] = CANDIDATES,
    batch: int = 1,
    tokens: Sequence[int] = (2, 8),
    taps: Sequence[int] = (),
    refresh: bool = False,
    exact_rows: bool | None = None,
    **kwargs,
) -> dict:
    """{"key", "profile", "cache_path", "cached"}: the cached probe for this device, target,
    batch and draft shape when one holds every candidate, else a fresh one (then cached)."""
    taps = list(draft.config.target_layer_ids) if draft is not None else list(taps)
    key = probe_key(
        target, batch=batch, tokens=tokens, taps=taps, draft=draft, exact_rows=exact_rows
    )
    path = cache_path(key)
    want = [str(_dtype_name(c)) for c in candidates]

    def read() -> dict | None:
        if refresh or not path.exists():
            return None
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if saved.get("key") != key or not all(d in saved.get("profile", {}) for d in want):
            return None
        prof = {d: _int_keys(saved["profile"][d]) for d in want}
        return {"key": key, "profile": prof, "cache_path": str(path), "cached": True}

    def compute() -> dict:
        prof = probe(target, draft, candidates=want, batch=batch, tokens=tokens, taps=taps,
                     exact_rows=exact_rows, **kwargs)  # fmt: skip
        write_text_atomic(path, json.dumps({"key": key, "profile": prof}, indent=2) + "\n")
        return {"key": key, "profile": prof, "cache_path": str(path), "cached": False}

    return read_or_compute(path, "the dtype probe cache entry", read, compute)


def _int_keys(p: dict) -> dict:
    """JSON made the token counts of `t_verify(_measured)` / `t_draft_steps` strings: back to ints."""
    out = p | {"t_verify": {int(n): float(t) for n, t in p["t_verify"].items()}}
    if p.get("t_verify_measured"):
        out["t_verify_measured"] = {int(n): float(t) for n, t in p["t_verify_measured"].items()}
    if p.get("t_draft_steps"):
        out["t_draft_steps"] = {int(n): float(t) for n, t in p["t_draft_steps"].items()}
    return out


def choose(
    target,
    draft=None,
    *,
    job: str,
    batch: int = 1,
    accept: Sequence[float] | None = None,
    candidates: Sequence[str] = CANDIDATES,
    tokens: Sequence[int] | None = None,
    taps: Sequence[int] = (),
    **kwargs,
) -> dict:
    """Measure (or read back) every candidate for `job` at `batch` and pick the fastest:
    `choose_dtype`'s answer plus what was measured, where it is cached and the conditions."""
    gamma = int(draft.config.block_size) if draft is not None else 0
    if tokens is None:  # speculative: every verify length of the block; else the AR step only
        tokens = list(range(2, gamma + 2)) if draft is not None else [1]
    got = load_or_probe(
        target, draft, candidates=candidates, batch=batch, tokens=tokens, taps=taps, **kwargs
    )
    decision = choose_dtype(got["profile"], job, accept, gamma)
    return decision | {
        "measured": got["profile"],
        "cache_path": got["cache_path"],
        "cached": got["cached"],
        "conditions": got["key"],
        "accept": list(accept) if accept else None,
    }


def _dtype_name(name: str) -> str:
    return str(_as_dtype(name)).replace("torch.", "")


def cast_to_fastest(
    model, *, job: str, batch: int, out_dir: str | Path | None = None, **kwargs
) -> dict:
    """`choose` for a job without a draft (regeneration: `plain`; feature capture: `capture`),
    then cast `model` to the chosen dtype in place. Prints one line with the figures and the
    choice and, given `out_dir`, writes the whole decision to `out_dir/dtype_choice.json`."""
    decision = choose(model, job=job, batch=batch, **kwargs)
    model.to(getattr(torch, decision["dtype"]))
    figures = ", ".join(
        f"{d} {1e3 * c['cost_s']:.1f} ms ({c['from']})" for d, c in decision["costs"].items()
    )
    where = "cached" if decision["cached"] else "measured"
    print(
        f"dtype=auto: {decision['dtype']} for {job} at batch {batch} on "
        f"{decision['conditions']['device']} ({where}: {figures}; {decision['cache_path']})",
        file=sys.stderr,
    )
    if out_dir is not None:
        path = Path(out_dir) / "dtype_choice.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(decision, indent=2) + "\n")
    return decision


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m dspark.dtype_probe --target T [--job plain] [--batch-size B]`: print the dtype
    the probe picks for a job without a draft, one word on stdout (its figures on stderr), so a
    pipeline of several steps (the Makefile's quickstart) runs every step in the one measured
    dtype. The probe is the one `--dtype auto` runs, cached the same way."""
    p = argparse.ArgumentParser(prog="python -m dspark.dtype_probe", description=main.__doc__)
    p.add_argument("--target", default="embedded", help="HF id, path or `embedded`")
    p.add_argument("--job", default="plain", choices=("plain",), help="batched AR decoding")
    p.add_argument("--batch-size", type=int, default=32, help="rows per step (regenerate's)")
    p.add_argument("--num-threads", type=int, default=None, help="CPU threads (default: all)")
    a = p.parse_args(argv)
    if a.batch_size < 1:
        p.error("--batch-size must be >= 1")
    with user_errors():
        if a.num_threads:
            torch.set_num_threads(a.num_threads)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, _ = load_target(a.target, dtype="float32", device=device)
        decision = cast_to_fastest(model, job=a.job, batch=a.batch_size)
        print(decision["dtype"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
