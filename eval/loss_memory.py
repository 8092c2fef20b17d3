"""Peak training memory of a recipe with the loss chunked over slots or not, on this CPU.

    python eval/loss_memory.py                      # quickstart shape, fp32, 3 steps per arm
    python eval/loss_memory.py --chunks 0 256 64 --before-src /tmp/dspark_before

Each arm is a fresh process (peak RSS is a process's high-water mark): it builds the recipe's
target, draft, objective and data (cached features, so the target runs no layers), takes the
first `--steps` batches of the unshuffled training set (the same in every arm), and runs that
many training steps (objective, backward, grad clip, AdamW). It reports the RSS once everything
is built and the batches are loaded (`ready`), the peak RSS after the steps, and their
difference: the memory the training steps add. Arms: `objective.chunk_slots=N` for each
`--chunks` value (0: all slots at once), and with `--before-src DIR` (a source tree whose
`dspark/` package predates chunking, e.g. `git archive <commit> dspark | tar -x -C DIR`) the
same steps with that code. Memory only: nothing is timed. Writes loss_memory.{json,md} to --out.

Each arm runs with glibc's `MALLOC_MMAP_THRESHOLD_` fixed (`--mmap-threshold`, 128 KiB): left
dynamic, glibc raises the threshold after freeing large blocks and then keeps freed chunk-sized
tensors in its heap, so RSS measured the allocator's caching (arms moved by ~150 MiB run to run,
out of order) rather than the live tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
QUICKSTART = [
    "recipe=quickstart",
    "target.dtype=float32",  # the quickstart's dtype on CPUs without AVX-512-BF16 / AMX
    "trainer.mixed_precision=no",
    "data.features=runs/data/embedded/train/features_320x128_fp32",
    "data.eval_features=runs/data/embedded/test/features_24x128_fp32",
]


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure_arm(overrides: list[str], steps: int) -> dict:
    """In this (fresh) process: build the recipe, run `steps` training steps, report RSS."""
    import torch
    from hydra import compose, initialize_config_dir

    from dspark.objectives import LocalReducer
    from dspark.training.build import build_draft, build_objective_for, load_datasets, make_loader
    from dspark.training.optim import build_optimizer
    from dspark.training.schema import check, register_configs

    register_configs(CHECKOUT / "recipes")
    with initialize_config_dir(str(CHECKOUT / "conf"), version_base=None):
        cfg = compose("config", overrides=[*overrides, "trainer.output_dir=x"])
    check(cfg)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.trainer.seed)
    dev = torch.device("cpu")
    target, tokenizer, draft = build_draft(cfg, dev)
    objective = build_objective_for(cfg, target, draft.config)
    train_ds, _ = load_datasets(cfg, tokenizer, target, draft.config)
    loader = make_loader(train_ds, tokenizer, cfg, shuffle=False)
    optimizer = build_optimizer(draft, cfg.optim)
    batches = []
    for b in loader:
        batches.append(b)
        if len(batches) == steps:
            break
    ready, max_ready = _rss(), _max_rss()
    draft.train()
    slots, lengths, losses = [], [], []
    for batch in batches:
        loss, metrics = objective.step(draft, batch, LocalReducer())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        slots.append(int(metrics["supervised_tokens"]))
        lengths.append(int(batch["input_ids"].shape[1]))
        losses.append(float(loss.detach()))
    peak = _max_rss()
    return {
        "rss_ready": ready,
        "max_rss_ready": max_ready,  # the high-water mark of building / loading, for reference
        "peak_rss": peak,
        "steps_add": peak - ready,
        "supervised_slots": slots,
        "padded_lengths": lengths,
        "losses": losses,
        "conditions": {
            "target": cfg.target.name,
            "target_dtype": cfg.target.dtype,
            "vocab_size": int(draft.config.vocab_size),
            "batch": int(cfg.data.batch_size),
            "max_length": int(cfg.data.max_length),
            "num_anchors": int(cfg.draft.num_anchors),
            "block_size": int(cfg.draft.block_size),
            "draft_layers": int(cfg.draft.num_hidden_layers),
            "markov_rank": int(cfg.draft.markov_rank),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    }


def run_arm(
    name: str, overrides: list[str], steps: int, src: str | None, mmap_threshold: int
) -> dict:
    cmd = [sys.executable, __file__, "--measure-one", json.dumps(overrides), "--steps", str(steps)]
    env = dict(os.environ)
    if mmap_threshold > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    if src:  # that tree's dspark/ package shadows this checkout's (PYTHONPATH comes first)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=CHECKOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"arm {name} failed:\n{proc.stderr[-3000:]}")
    return {"arm": name, "overrides": overrides, **json.loads(proc.stdout.strip().splitlines()[-1])}


def markdown(runs: list[dict], steps: int, mmap_threshold: int) -> str:
    c = runs[0]["conditions"]
    mib = 2**20
    lines = [
        "# Training memory with and without the chunked loss\n",
        f"Conditions: target `{c['target']}` ({c['target_dtype']}, V = {c['vocab_size']}), draft "
        f"fp32 (no autocast), CPU, {c['threads']} threads, batch {c['batch']} rows (max_length "
        f"{c['max_length']}), block {c['block_size']}, {c['num_anchors']} anchors/sequence, "
        f"{c['draft_layers']} draft layers, Markov rank {c['markov_rank']}, cached target "
        f"features; the first {steps} unshuffled training batches (padded lengths "
        f"{runs[0]['padded_lengths']}, supervised slots {runs[0]['supervised_slots']}), one "
        "fresh process per arm, peak = getrusage max RSS, glibc MALLOC_MMAP_THRESHOLD_="
        f"{mmap_threshold or 'dynamic'}; torch {c['torch']}.\n",
        "| arm | RSS ready MiB | peak RSS MiB | added by the steps MiB | losses |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        losses = ", ".join(f"{x:.6f}" for x in r["losses"])
        lines.append(
            f"| {r['arm']} | {r['rss_ready'] / mib:.0f} | {r['peak_rss'] / mib:.0f} | "
            f"{r['steps_add'] / mib:.0f} | {losses} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--overrides", nargs="*", default=QUICKSTART, help="distill overrides")
    ap.add_argument("--chunks", nargs="*", type=int, default=[0, 256, 64])
    ap.add_argument("--before-src", default=None, help="a source tree of the unchunked code")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="runs/loss_memory")
    ap.add_argument("--mmap-threshold", type=int, default=131072, help="bytes; 0: glibc's own")
    ap.add_argument("--measure-one", help=argparse.SUPPRESS)  # internal: the fresh process
    args = ap.parse_args()
    if args.measure_one:
        print(json.dumps(measure_arm(json.loads(args.measure_one), args.steps)))
        return
    arms: list[tuple[str, list[str], str | None]] = []
    if args.before_src:
        arms.append(("before chunking (whole [M, V] logits)", args.overrides, args.before_src))
    for n in args.chunks:
        name = f"chunk_slots={n}" + (" (all slots at once)" if n == 0 else "")
        arms.append((name, [*args.overrides, f"objective.chunk_slots={n}"], None))
    runs = [run_arm(n, over, args.steps, src, args.mmap_threshold) for n, over, src in arms]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "loss_memory.json").write_text(json.dumps(runs, indent=2))
    text = markdown(runs, args.steps, args.mmap_threshold)
    (out / "loss_memory.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
