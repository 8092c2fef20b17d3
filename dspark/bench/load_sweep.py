"""The load sweep: R requests decoded together, per verify policy, R = 1, 2, 4, ... .

Its command line is `eval/load_sweep.py`, a thin entry script of the same name; its report
(the gains table, Markdown, PNG) is `load_sweep_report.py`.

Policies (one `SpeculativeDecoder` each, same target, same prompts per load):
- `ar`: plain autoregressive decoding (`generate_autoregressive`);
- `full`: every request verifies the whole block;
- `threshold`: the static survival threshold;
- `scheduler`: the prefix scheduler priced for this decoder's padded verify pass;
- `scheduler_ragged`: the published per-slot Algorithm 1 (B = sum(1 + l_r)) in the same
  padded pass (what a ragged serving engine would run, priced as if it were one).

Per policy and load: total tokens/s and per-user tokens/s in the decode phase (prefill
excluded: tokens after the first over the time after the prefill; per user: each request's
tokens over its own finish time), tau, verified tokens per request per round, padded tokens
per round, draft and verify time per round. EOS is ignored by default so the load stays R for
the whole call. Greedy outputs are checked against the AR policy (lossless at every load).
The `full` policy's per-round confidences and acceptance are the simulator's traces.
Results are written after every (load, policy) cell (atomic JSON), so a rerun resumes.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark.bench.load_sweep_report import POLICIES, plot, render_markdown, table
from dspark.config import DSparkConfig, choose_mask_token_id
from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder, VerifyPolicy
from dspark.decoding.sps import SPSProfile, default_rows, load_or_measure
from dspark.eval.prompts import load_dataset, render
from dspark.modeling import DSparkDraftModel
from dspark.target.loading import _as_dtype, eos_ids, load_target

SWEEP_VERSION = 1


def decoders(target, draft, policies, *, threshold: float, sps, temperature: float, max_length):
    """`{policy: SpeculativeDecoder}` sharing the target and draft."""

    out = {}
    for p in policies:
        if p in ("ar", "full"):
            policy = VerifyPolicy("full")
        elif p == "threshold":
            policy = VerifyPolicy("threshold", confidence_threshold=threshold)
        elif p in ("scheduler", "scheduler_ragged"):
            batch = "ragged" if p == "scheduler_ragged" else "padded"
            policy = VerifyPolicy("scheduler", sps=sps, scheduler_batch=batch)
        else:
            raise ValueError(f"unknown policy {p!r}; choose from {POLICIES}")
        opts = DecoderOptions(Sampling(temperature), policy, max_length=max_length)
        out[p] = SpeculativeDecoder(target, draft, opts)
    return out


def cell_metrics(out, load: int) -> dict:
    """One (load, policy) cell from its `GenerationOutput`."""
    tokens = sum(out.new_tokens)
    decode_s = out.wall_time_s - out.prefill_s
    per_user = [
        (n - 1) / (f - out.prefill_s)
        for n, f in zip(out.new_tokens, out.finish_s)
        if n > 1 and f > out.prefill_s
    ]
    timing = out.timing_summary()
    rows = sum(out.round_rows)
    # the rounds with every request live: a closed batch ends in a tail where requests that
    # drafted ahead have finished (a server refills those slots), which is not load `load`
    full = [i for i, r in enumerate(out.round_rows) if r == load]
    full_s = sum(out.round_draft_s[i] + out.round_verify_s[i] for i in full)
    return {
        "load": load,
        "new_tokens": tokens,
        "wall_s": out.wall_time_s,
        "prefill_s": out.prefill_s,
        "decode_s": decode_s,
        "total_tokens_per_s": (tokens - load) / decode_s if decode_s > 0 else None,
        "end_to_end_tokens_per_s": tokens / out.wall_time_s if out.wall_time_s > 0 else None,
        "per_user_tokens_per_s": float(np.mean(per_user)) if per_user else None,
        "full_load_tokens_per_s": sum(out.round_committed[i] for i in full) / full_s
        if full_s > 0
        else None,
        "tau": None if not any(out.accept_lengths) else out.tau,
        "verify_tokens_per_request_round": sum(out.round_tokens) / rows if rows else None,
        **{k: timing[k] for k in timing if k not in ("draft_s", "verify_s")},
        "draft_s": timing["draft_s"],
        "verify_s": timing["verify_s"],
    }


def median_cell(cells: list[dict]) -> dict:
    """The repeat with the median total tokens/s (the lower middle of an even count), with
    every repeat's figure and the lowest match rate with AR over the repeats."""

    def lower_middle(key: str) -> dict:
        return sorted(cells, key=lambda c: c.get(key) or 0.0)[(len(cells) - 1) // 2]

    cell = dict(lower_middle("total_tokens_per_s"))
    if len(cells) > 1:
        cell["total_tokens_per_s_reps"] = [c["total_tokens_per_s"] for c in cells]
        # its own median: the repeat kept for the total need not be the middle one here
        cell["full_load_tokens_per_s"] = lower_middle("full_load_tokens_per_s").get(
            "full_load_tokens_per_s"
        )
        cell["full_load_tokens_per_s_reps"] = [c.get("full_load_tokens_per_s") for c in cells]
    matches = [c["matches_ar"] for c in cells if "matches_ar" in c]
    if matches:
        cell["matches_ar"] = min(matches)
    return cell


def trace_rows(out, load: int, policy: str) -> list[dict]:
    """Per-request per-round confidences / acceptance (the simulator's input)."""
    return [
        {
            "load": load,
            "policy": policy,
            "request": i,
            "confidences": conf,
            "accept_lengths": acc,
            "verify_lengths": ver,
            "new_tokens": n,
        }
        for i, (conf, acc, ver, n) in enumerate(
            zip(out.confidences, out.accept_lengths, out.verify_lengths, out.new_tokens)
        )
    ]


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_sweep(
    decs: dict,
    prompts: list[list[int]],
    loads: list[int],
    *,
    max_new_tokens: int,
    eos,
    seed: int,
    out_dir: Path,
    conditions: dict,
    repeats: int = 1,
    progress=print,
) -> dict:
    """Decode every load with every policy; results.json / traces.jsonl kept current.

    `repeats` > 1 decodes each load `repeats` times, the policies interleaved within each
    repeat (so a slow spell of the machine hits every policy alike), and keeps per cell the
    repeat with the median total tokens/s, plus every repeat's figure (`total_tokens_per_s_reps`).
    A load's cells are written once all its repeats are done. Decoders keep their state across
    calls (the scheduler's draft gate learns, as a server's would)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    res_path, trace_path = out_dir / "results.json", out_dir / "traces.jsonl"
    results: dict[str, Any] = {"version": SWEEP_VERSION, "conditions": conditions, "cells": {}}
    if res_path.exists():
        old = json.loads(res_path.read_text())
        if old.get("conditions") == conditions:  # resume: same conditions, keep finished cells
            results = old
            progress(f"resuming: {len(results['cells'])} cells already measured")
    traces = []
    if trace_path.exists() and results["cells"]:
        traces = [json.loads(x) for x in trace_path.read_text().splitlines() if x.strip()]
    first = next(iter(decs.values()), None)
    for name, dec in decs.items():  # untimed warm-up per policy: allocations, profile tables
        fn = dec.generate_autoregressive if name == "ar" else dec.generate
        fn(prompts[:1], min(8, max_new_tokens), eos_token_id=eos, seed=seed)
    for load in loads:
        batch = [prompts[i % len(prompts)] for i in range(load)]
        todo = [n for n in decs if f"{load}/{n}" not in results["cells"]]
        reps: dict[str, list[dict]] = {n: [] for n in todo}
        reference = None
        for rep in range(repeats):
            for name in todo:
                dec = decs[name]
                fn = dec.generate_autoregressive if name == "ar" else dec.generate
                t0 = time.perf_counter()
                out = fn(batch, max_new_tokens, eos_token_id=eos, seed=seed + load)
                cell = cell_metrics(out, load)
                if name == "ar":
                    reference = out.sequences
                elif reference is not None and first is not None and first.options.sampling.greedy:
                    same = sum(a == b for a, b in zip(out.sequences, reference))
                    cell["matches_ar"] = same / load
                if name != "ar" and rep == 0:
                    traces += trace_rows(out, load, name)
                reps[name].append(cell)
                tps = cell["total_tokens_per_s"]
                progress(
                    f"load {load:>3} {name:<16} {tps or 0:8.1f} tok/s total, "
                    f"{cell['per_user_tokens_per_s'] or 0:7.2f} per user, tau "
                    f"{cell['tau'] or float('nan'):.2f}, {time.perf_counter() - t0:.0f} s"
                    + (f" (repeat {rep + 1}/{repeats})" if repeats > 1 else "")
                )
        for name, cells in reps.items():
            results["cells"][f"{load}/{name}"] = {"policy": name, **median_cell(cells)}
        _atomic_write(trace_path, "".join(json.dumps(t) + "\n" for t in traces))
        _atomic_write(res_path, json.dumps(results, indent=2) + "\n")
    results["table"] = table(results)
    _atomic_write(res_path, json.dumps(results, indent=2) + "\n")
    return results


def load_draft(draft_path: str | None, target, tokenizer, target_spec: str):
    """(draft, kind): the trained draft at `draft_path`, or a random-init default draft."""
    param = next(target.parameters())
    if draft_path:
        draft = DSparkDraftModel.from_pretrained(draft_path)
        kind = os.path.abspath(draft_path)
    else:
        cfg = DSparkConfig.from_target_config(
            target.config,
            mask_token_id=choose_mask_token_id(tokenizer, target.config.vocab_size),
            target_name_or_path=target_spec,
        )
        torch.manual_seed(0)
        draft = DSparkDraftModel.from_target(target, cfg)
        kind = "random-init (no trained draft was available; acceptance near zero)"
    # transformers' `to` is @wraps(nn.Module.to), which mypy types as an unbound function
    draft.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)  # type: ignore[call-arg]
    return draft, kind


def run_from_args(args, draft_path: str | None, policies: list[str]) -> tuple[dict, str]:
    """The sweep behind eval/load_sweep.py (argparse namespace `args`)."""
    target, tokenizer = load_target(args.target, dtype=_as_dtype(args.dtype))
    draft, kind = load_draft(draft_path, target, tokenizer, args.target)
    gamma = int(draft.config.block_size)
    prompts = []
    for name in args.datasets:
        for conv in load_dataset(name, args.bench_dir, args.prompts_per_set):
            prompts.append(render(tokenizer, conv, []))
    sps = None
    if any(p.startswith("scheduler") for p in policies):
        if args.sps:
            sps = SPSProfile.load(args.sps)
        else:
            ctx = int(np.mean([len(p) for p in prompts])) + args.max_new_tokens // 2
            sps = load_or_measure(
                target, draft, gamma=gamma, rows=default_rows(max(args.loads)), context_len=ctx,
                progress=lambda m: print("profile:", m),
            )  # fmt: skip
    max_len = max(len(p) for p in prompts) + args.max_new_tokens + gamma + 64
    decs = decoders(
        target, draft, policies, threshold=args.threshold, sps=sps,
        temperature=args.temperature, max_length=max_len,
    )  # fmt: skip
    param = next(target.parameters())
    temps = getattr(draft.config, "confidence_temperatures", None)
    conditions = {
        "target": args.target,
        "draft_kind": kind,
        "block_size": gamma,
        "confidence_temperatures": temps,
        "datasets": list(args.datasets),
        "prompts": len(prompts),
        "prompt_tokens_mean": round(float(np.mean([len(p) for p in prompts])), 1),
        "loads": list(args.loads),
        "policies": policies,
        "max_new_tokens": args.max_new_tokens,
        "eos": "honoured" if args.honor_eos else "ignored (load constant)",
        "temperature": args.temperature,
        "threshold": args.threshold,
        "sps_profile": (sps.meta.get("cache_path") or args.sps or sps.meta.get("source"))
        if sps is not None
        else None,
        "device": str(param.device),
        "cpu": platform.processor() or platform.machine(),
        "dtype": str(param.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "seed": args.seed,
        "repeats": args.repeats,
    }
    eos = eos_ids(tokenizer, target) if args.honor_eos else None
    out_dir = Path(args.out)
    results = run_sweep(
        decs, prompts, list(args.loads), max_new_tokens=args.max_new_tokens, eos=eos,
        seed=args.seed, out_dir=out_dir, conditions=conditions, repeats=args.repeats,
    )  # fmt: skip
    plots = plot(results, out_dir)
    report = render_markdown(results, plots)
    (out_dir / "report.md").write_text(report)
    return results, report
