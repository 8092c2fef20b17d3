"""Regeneration throughput: the bundled decoder backend against llama.cpp's server, interleaved.

    python eval/regen_backends.py --rows 256 --max-new-tokens 256 --threads 2 \
        --arm decoder:float32:32 --arm decoder:bfloat16:32 \
        --arm llama-cpp:embedded:16 --arm llama-cpp:PATH/target.q4_0.gguf:16

An arm is `decoder:DTYPE:BATCH` (dspark's static-cache decoder, BATCH rows live, batched
continuously) or `llama-cpp:GGUF:SLOTS` (`embedded`: the embedded target's own Q4_1 file;
the native llama-server `make llama-server` built when there is one, else xllamacpp). Every
arm answers the same first `--rows` prompts greedily, the way `regenerate` calls it: in
consecutive blocks of `--block` rows, each block decoded by every arm in turn, the first arm
rotating from block to block, so a drift of the machine's speed falls on every arm alike.
Every arm stays loaded throughout; nothing else should run on the cores.

Agreement: each arm's answers against the first decoder arm's (token for token: rows equal,
and the share of tokens before the first difference). Writes
runs/regen_backends/regen_backends.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.data.prompts.sources import load_prompts
from dspark.data.regeneration.decoder_backend import DecoderBackend
from dspark.data.regeneration.llama_cpp_backend import (
    LlamaCppBackend,
    agreement,
    resolve_server_bin,
)
from dspark.data.regeneration.sampling import SamplingConfig
from dspark.engines.llama_server import EngineSettings, target_gguf_of
from dspark.machine import cpu_flags, cpu_name
from dspark.plotting import plt
from dspark.target import load_target, load_tokenizer


def open_arm(spec: str, target: str, threads: int, slot_ctx: int, server_bin: str):
    """(name, backend) of `decoder:DTYPE:BATCH` or `llama-cpp:GGUF:SLOTS`."""
    kind, what, n = spec.rsplit(":", 2) if spec.count(":") >= 2 else (spec, "", "")
    if kind == "decoder":
        model, tok = load_target(target, dtype=what, device="cpu")
        return f"decoder {what} batch {n}", DecoderBackend(model, tok, batch_size=int(n))
    if kind == "llama-cpp":
        gguf = target_gguf_of(target, None if what == "embedded" else what)
        settings = EngineSettings(
            gguf,
            threads=threads,
            ctx=int(n) * slot_ctx,
            server_bin=resolve_server_bin(server_bin),
            parallel=int(n),
        )
        backend = LlamaCppBackend(settings, load_tokenizer(target))
        quant = backend.conditions()["target_file_type"]
        return f"llama.cpp {quant} {int(n)} slots", backend
    raise SystemExit(f"error: --arm {spec}: use decoder:DTYPE:BATCH or llama-cpp:GGUF:SLOTS")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--input", default="embedded")
    ap.add_argument("--split", default="train")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--block", type=int, default=128, help="rows per interleaved block")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slot-ctx", type=int, default=2048)
    ap.add_argument("--server-bin", default="auto")
    ap.add_argument("--arm", action="append", required=True)
    ap.add_argument("--out", default="runs/regen_backends")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load = [round(x, 2) for x in os.getloadavg()]
    rows = load_prompts(a.input, split=a.split, limit=a.rows).rows
    convs = [r["messages"][: 2 if r["messages"][0]["role"] == "system" else 1] for r in rows]
    sampling = SamplingConfig(max_new_tokens=a.max_new_tokens)
    arms = [open_arm(s, a.target, a.threads, a.slot_ctx, a.server_bin) for s in a.arm]
    ids = arms[0][1].encode(convs)
    answers: dict[str, list] = {name: [] for name, _ in arms}
    wall = {name: 0.0 for name, _ in arms}
    try:
        for _, be in arms:  # warm-up: first requests pay for allocation and the repack
            be.generate_ids(ids[:2], [0, 0], SamplingConfig(max_new_tokens=8))
        for k, start in enumerate(range(0, len(ids), a.block)):
            block = ids[start : start + a.block]
            turn = arms[k % len(arms) :] + arms[: k % len(arms)]
            for name, be in turn:
                t0 = time.perf_counter()
                answers[name] += be.generate_ids(block, [0] * len(block), sampling)
                wall[name] += time.perf_counter() - t0
                print(f"block {k}: {name} {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        for _, be in arms:
            if hasattr(be, "close"):
                be.close()
    ref_name = arms[0][0]
    results = []
    for name, be in arms:
        ok = [x for x in answers[name] if isinstance(x, list)]
        tokens = sum(len(x) for x in ok)
        pairs = [(x, y) for x, y in zip(answers[name], answers[ref_name])
                 if isinstance(x, list) and isinstance(y, list)]  # fmt: skip
        results.append(
            {
                "arm": name,
                "rows": len(ok),
                "failed": len(answers[name]) - len(ok),
                "tokens": tokens,
                "wall_s": round(wall[name], 2),
                "tokens_per_s": round(tokens / wall[name], 1),
                "rows_per_hour": round(3600 * len(ok) / wall[name]),
                "agreement_with_first": agreement([x for x, _ in pairs], [y for _, y in pairs]),
                **(be.conditions() if hasattr(be, "conditions") else {}),
            }
        )
    base = results[0]["tokens_per_s"]
    for r in results:
        r["speed_vs_first"] = round(r["tokens_per_s"] / base, 2)
    lens = sorted(len(p) for p in ids)
    cond = {
        "target": a.target,
        "input": f"{a.input} ({a.split} split, first {len(ids)} rows, first turn)",
        "prompt_tokens_min_median_max": [lens[0], lens[len(lens) // 2], lens[-1]],
        "max_new_tokens": a.max_new_tokens,
        "sampling": "greedy",
        "cpu": cpu_name(),
        "cpu_flags": " ".join(sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_tile"})),
        "threads": a.threads,
        "block": a.block,
        "torch": torch.__version__,
        "load_average_at_start": load,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regen_backends.json").write_text(
        json.dumps({"conditions": cond, "arms": results}, indent=2)
    )
    md = "# Regeneration backends\n\nConditions: " + ", ".join(f"{k} {v}" for k, v in cond.items())
    md += (
        ".\n\n| arm | rows | tokens | wall s | tokens/s | x first | rows/hour | rows equal to "
        f"{ref_name} | tokens before the first difference |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in results:
        g = r["agreement_with_first"]
        md += (
            f"| {r['arm']} | {r['rows']} | {r['tokens']} | {r['wall_s']} | {r['tokens_per_s']} | "
            f"{r['speed_vs_first']}x | {r['rows_per_hour']} | {g['rows_equal']}/{g['rows']} | "
            f"{g['common_prefix_share']:.3f} |\n"
        )
    (out / "regen_backends.md").write_text(md)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh([r["arm"] for r in results], [r["tokens_per_s"] for r in results])
    ax.set_xlabel("generated tokens / s (greedy)")
    ax.set_title(
        f"regeneration, {len(ids)} prompts, {cond['cpu']}, {a.threads} threads", fontsize=8
    )
    fig.tight_layout()
    fig.savefig(out / "regen_backends.png", dpi=120)
    print(md)


if __name__ == "__main__":
    main()
