"""Per-rank memory of a distillation run: replicated vs FSDP2-sharded target, by component.

  python eval/memory_estimate.py                   # Qwen3-8B and Llama-3.1-70B, 8 ranks
  python eval/memory_estimate.py --batch 2 --seq-len 2048 --world-size 16
  python eval/memory_estimate.py --check tiny-qwen3 embedded   # estimate vs measured peak RSS

`--check` runs real CPU training steps (fp32, sdpa attention, one process) of each named target
in a fresh process and compares the peak RSS growth with the estimate for the same shape.
Writes memory.json and memory.md to --output. The model is in dspark/bench/train_memory.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

from dspark.bench.train_memory import (
    KNOWN_TARGETS,
    GiB,
    RunShape,
    estimate,
    markdown_table,
    measure,
)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--targets", nargs="+", default=list(KNOWN_TARGETS))
    p.add_argument("--batch", type=int, default=1, help="sequences per rank per micro-step")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--num-anchors", type=int, default=RunShape.num_anchors)
    p.add_argument(
        "--chunk-slots",
        type=int,
        default=RunShape.chunk_slots,
        help="supervised slots per loss chunk (objective.chunk_slots); 0: all at once",
    )
    p.add_argument("--check", nargs="*", default=[], help="targets to measure on this CPU")
    p.add_argument("--check-batch", type=int, default=1)
    p.add_argument("--check-seq-len", type=int, default=256)
    p.add_argument("--check-anchors", type=int, default=64)
    p.add_argument("--output", default="runs/memory_estimate")
    p.add_argument("--measure-one", help=argparse.SUPPRESS)  # internal: the fresh process
    p.add_argument("--shape", help=argparse.SUPPRESS)
    return p.parse_args()


def check(spec: str, shape: RunShape) -> dict:
    """Measured (fresh process) vs estimated, world size 1, fp32, sdpa."""
    cmd = [sys.executable, __file__, "--measure-one", spec, "--shape", json.dumps(asdict(shape))]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {spec} failed:\n{proc.stderr[-2000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    est = estimate(spec, shape)["bytes"]["replicated"]
    return {
        "target": spec,
        "shape": asdict(shape),
        **got,
        "estimated": est["total"],
        "measured_over_estimated": got["measured"] / est["total"],
    }


def main() -> None:
    args = parse()
    if args.measure_one:
        torch_threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        import torch

        torch.set_num_threads(torch_threads)
        print(json.dumps(measure(args.measure_one, RunShape(**json.loads(args.shape)))))
        return
    shape = RunShape(
        batch=args.batch,
        seq_len=args.seq_len,
        world_size=args.world_size,
        num_anchors=args.num_anchors,
        chunk_slots=args.chunk_slots,
    )
    results = [estimate(t, shape) for t in args.targets]
    small = replace(
        shape,
        batch=args.check_batch,
        seq_len=args.check_seq_len,
        num_anchors=args.check_anchors,
        world_size=1,
        target_dtype="float32",
        compute_bytes=4,
        attention="sdpa",
    )
    checks = [check(t, small) for t in args.check]
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps({"estimates": results, "checks": checks}, indent=2))
    md = [
        f"Per-rank GiB: batch {shape.batch} x {shape.seq_len} tokens per rank, "
        f"{shape.world_size} ranks, target {shape.target_dtype}, bf16 autocast, flex attention, "
        f"draft {shape.num_hidden_layers} layers, block {shape.block_size}, "
        f"{shape.num_anchors} anchors, Markov rank {shape.markov_rank}, AdamW, loss chunks of "
        f"{shape.chunk_slots or 'all'} slots; every position supervised (upper bound). "
        "Sharded = FSDP2 over all ranks (target.shard=true).",
        "",
        markdown_table(results),
    ]
    if checks:
        md += [
            "",
            f"Check on this CPU (1 process, fp32, sdpa, batch {small.batch} x {small.seq_len}, "
            f"{small.num_anchors} anchors, 2 AdamW steps): peak RSS above the RSS before loading.",
            "",
            "| target | measured MiB | estimated MiB | measured / estimated |",
            "|---|---|---|---|",
        ]
        md += [
            f"| {c['target']} | {c['measured'] / 2**20:.0f} | {c['estimated'] / 2**20:.0f} | "
            f"{c['measured_over_estimated']:.2f} |"
            for c in checks
        ]
    (out / "memory.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    for r in results:
        n = r["params"]
        print(
            f"{r['target']}: target {n['target'] / 1e9:.2f} B params, draft trainable "
            f"{n['draft_trainable'] / 1e6:.0f} M + frozen {n['draft_frozen'] / 1e6:.0f} M; "
            f"activations GiB {', '.join(f'{k} {v / GiB:.2f}' for k, v in r['activation_parts'].items())}"
        )
    print(f"wrote {out}/memory.json and memory.md")


if __name__ == "__main__":
    main()
