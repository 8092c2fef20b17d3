"""Regeneration throughput: the HF backend against the decoder backend, in one run.

    python eval/regen_speed.py [--target embedded] [--rows 64] [--max-new-tokens 128] \
        [--hf-batch 8] [--hf-rows N] [--decoder-batches 32 64] [--num-threads 2] [--dtype float32] \
        [--hf-dtypes float32 bfloat16]

Every backend answers the same first `--rows` prompts of the embedded set (greedy) the way
`regenerate` calls it: HF in consecutive chunks of `--hf-batch` rows (today's default), the
decoder all rows at once (it sorts them by prompt length into batches). The decoder runs in
`--dtype`; HF in each of `--hf-dtypes` (default: `--dtype`), the first being the baseline ("x
HF"); `regenerate`'s own CPU default is float32, so `--hf-dtypes float32 bfloat16` measures both
today's default and HF at the decoder's dtype. Greedy rows are compared with the HF run in the
decoder's dtype (bf16 rounding differs with batch shape, so only fp32 equality is exact).
Prints the figures and writes runs/regen_speed/regen_speed.{json,md}.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.data.cli import make_local_backend
from dspark.data.prompts.sources import load_prompts
from dspark.data.regeneration.sampling import SamplingConfig
from dspark.machine import cpu_kind
from dspark.target import load_target


def measure(backend, convs, chunk: int, sampling) -> dict:
    """Greedy answers of `convs`, `chunk` rows per call; wall and process CPU time.

    On a shared CPU the wall time depends on the neighbours; tokens per CPU-second (all of
    this process's threads) much less so, which is why both are reported."""
    t0, c0, replies = time.perf_counter(), time.process_time(), []
    for s in range(0, len(convs), chunk):
        replies += backend.generate(convs[s : s + chunk], [0] * len(convs[s : s + chunk]), sampling)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(r.tokens for r in replies)
    res = {
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "tokens_per_s": round(tokens / wall, 2),
        "tokens_per_cpu_s": round(tokens / cpu, 2),
    }
    return res, [r.text for r in replies]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--input", default="embedded")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--hf-batch", type=int, default=8)
    ap.add_argument("--decoder-batches", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--hf-rows", type=int, default=None, help="HF on the first N rows only")
    ap.add_argument("--num-threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", help="the decoder backend's dtype")
    ap.add_argument("--hf-dtypes", nargs="+", default=None, help="HF dtypes (default: --dtype)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="runs/regen_speed")
    a = ap.parse_args()
    load = [round(x, 2) for x in os.getloadavg()]
    torch.set_num_threads(a.num_threads)
    hf_dtypes = a.hf_dtypes or [a.dtype]
    models = {d: load_target(a.target, dtype=d, device=a.device) for d in {a.dtype, *hf_dtypes}}
    model, tok = models[a.dtype]
    convs = [r["messages"] for r in load_prompts(a.input, split="train", limit=a.rows).rows]
    sampling = SamplingConfig(max_new_tokens=a.max_new_tokens)
    lens = sorted(len(p) for p in make_local_backend("decoder", model, tok).encode(convs))
    hf_rows = min(a.hf_rows or len(convs), len(convs))
    plan = [("hf", d, a.hf_batch, a.hf_batch, hf_rows) for d in hf_dtypes]
    plan += [("decoder", a.dtype, b, len(convs), len(convs)) for b in a.decoder_batches]
    runs, texts = [], {}
    for name, dtype, batch, chunk, rows in plan:
        backend = make_local_backend(name, *models[dtype], batch_size=batch)
        res, texts[(name, dtype, batch)] = measure(backend, convs[:rows], chunk, sampling)
        runs.append({"backend": name, "dtype": dtype, "batch": batch, "rows": rows, **res})
        print(f"{name} {dtype} batch {batch}: {res}", flush=True)
    base, base_cpu = runs[0]["tokens_per_s"], runs[0]["tokens_per_cpu_s"]
    ref_dtype = a.dtype if a.dtype in hf_dtypes else hf_dtypes[0]
    ref = texts[("hf", ref_dtype, a.hf_batch)]
    for r in runs:
        r["speedup_vs_hf"] = round(r["tokens_per_s"] / base, 2)
        r["cpu_speedup_vs_hf"] = round(r["tokens_per_cpu_s"] / base_cpu, 2)
        same = sum(x == y for x, y in zip(texts[(r["backend"], r["dtype"], r["batch"])], ref))
        r["greedy_rows_equal_to_hf"] = f"{same}/{len(ref)} ({ref_dtype})"
    cond = {
        "target": a.target,
        "input": f"{a.input} (train split, first {len(convs)} rows; HF the first {hf_rows})",
        "prompt_tokens_min_median_max": [lens[0], lens[len(lens) // 2], lens[-1]],
        "max_new_tokens": a.max_new_tokens,
        "sampling": "greedy",
        "device": a.device,
        "cpu": cpu_kind(),
        "threads": a.num_threads,
        "decoder_dtype": a.dtype,
        "hf_dtypes": hf_dtypes,
        "baseline": f"hf {hf_dtypes[0]} batch {a.hf_batch}",
        "torch": torch.__version__,
        "load_average_at_start": load,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regen_speed.json").write_text(json.dumps({"conditions": cond, "runs": runs}, indent=2))
    md = "# Regeneration throughput\n\nConditions: " + ", ".join(
        f"{k} {v}" for k, v in cond.items()
    )
    md += (
        ".\n\n| backend | dtype | batch | rows | tokens | wall s | tokens/s | x HF | CPU s | tokens/CPU-s "
        "| x HF (CPU) | greedy rows equal to HF |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in runs:
        md += (
            f"| {r['backend']} | {r['dtype']} | {r['batch']} | {r['rows']} | {r['tokens']} | {r['wall_s']} | "
            f"{r['tokens_per_s']} | {r['speedup_vs_hf']} | {r['cpu_s']} | "
            f"{r['tokens_per_cpu_s']} | {r['cpu_speedup_vs_hf']} | "
            f"{r['greedy_rows_equal_to_hf']} |\n"
        )
    (out / "regen_speed.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
