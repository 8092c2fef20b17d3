"""The one prepared GPU check: `make gpu-check` (or `DEVICE=cpu make gpu-check` at tiny scale).

1. the `gpu`-marked tests (tests/test_gpu.py): lossless decoding in fp32, the bf16 divergence
   rate (reported), flex attention == SDPA forward and backward, a bf16 training step;
2. a short draft training run through the real loop: SmolLM2 on CUDA (bf16 autocast), the
   tiny target on CPU;
3. decoder step times (eager / compile / CUDA graphs) against the weight-bandwidth floor, on
   a random Qwen3-8B-shaped target in bf16 on CUDA (the tiny target in fp32 on CPU).
Writes gpu_check.json and gpu_check.md to --output (default runs/gpu_check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], env: dict, log: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log.write_text(proc.stdout + "\n" + proc.stderr)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return {"rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1), "tail": tail}


def train(device: str, out: Path, env: dict) -> dict:
    """A short run of the one training loop; its own results.json gives the figures."""
    if device == "cpu":
        over = ["recipe=debug", "trainer.max_steps=4", "trainer.threads=1"]
        regen = ["--target", "tiny-qwen3", "--limit", "16", "--max-new-tokens", "32"]
        regen += ["--max-length", "768"]
        launch = ["--cpu", "--mixed_precision=no"]
    else:
        over = ["recipe=quickstart", "trainer.max_steps=100", "data.eval=null"]
        regen = ["--target", "embedded", "--limit", "96", "--max-new-tokens", "96"]
        over += ["trainer.mixed_precision=bf16", "trainer.threads=null", "trainer.eval_every=0"]
        launch = ["--mixed_precision=bf16"]
        prep = run([sys.executable, "data_scripts/prepare_target.py"], env, out / "prepare.log")
        if prep["rc"] != 0:
            return {**prep, "step": "data_scripts/prepare_target.py (SmolLM2) failed"}
    # training reads data, never makes it: the target answers the prompts first
    regen = [sys.executable, "data_scripts/regenerate.py", *regen, "--input", "embedded"]
    regen += ["--split", "train", "--output", str(out / "data"), "--tokenize", "--no-progress"]
    made = run(regen, env, out / "regenerate.log")
    if made["rc"] != 0:
        return {**made, "step": "data_scripts/regenerate.py failed"}
    over += [f"trainer.output_dir={out / 'train'}", f"data.train={out / 'data' / 'tokenized'}"]
    over += [f"hydra.run.dir={out / 'train'}", "tracking=none"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes=1"]
    cmd += ["--num_machines=1", "--dynamo_backend=no", *launch, "train/distill.py", *over]
    res = run(cmd, env, out / "train.log")
    if res["rc"] == 0:
        r = json.loads((out / "train" / "results.json").read_text())
        res.update(
            final_eval=r["final_eval"], last_train=r["last_train"], conditions=r["conditions"]
        )
    return res


def bench(device_name: str, modes: list[str]) -> dict:
    import torch

    from dspark.bench.device_bench import copy_bandwidth, random_target, step_times, weight_bytes
    from dspark.bench.train_memory import target_config
    from dspark.config import DSparkConfig
    from dspark.modeling import DSparkDraftModel

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    spec = "Qwen/Qwen3-8B" if cuda else "tiny-qwen3"
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = target_config(spec)
    target = random_target(cfg, dtype, device)
    dcfg = DSparkConfig.from_target_config(cfg, mask_token_id=cfg.vocab_size - 1)
    draft = DSparkDraftModel.from_target(target, dcfg, dtype=dtype).eval().requires_grad_(False)
    bw = copy_bandwidth(device, mbytes=2048 if cuda else 256)
    floor = weight_bytes(target) / bw
    rows = {}
    for mode in modes:
        t0 = time.perf_counter()
        r = step_times(target, draft, mode)
        r.update(over_floor=r["ar_step_s"] / floor, seconds=round(time.perf_counter() - t0, 1))
        rows[mode] = r
    return {
        "target_shape": spec,
        "dtype": str(dtype),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "threads": torch.get_num_threads(),
        "weight_bytes": weight_bytes(target),
        "copy_bandwidth_gb_s": bw / 1e9,
        "floor_ms": floor * 1e3,
        "draft": "random DSpark draft, 5 layers, block 7, Markov rank 256 (tau ~1: efficiency only)",
        "modes": rows,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default=os.environ.get("DEVICE", "cuda"))
    p.add_argument("--output", default="runs/gpu_check")
    p.add_argument("--modes", default=None, help="eager,compile,cudagraphs (CPU: eager,compile)")
    p.add_argument("--skip", default="", help="comma list of tests,train,bench to skip")
    a = p.parse_args()
    out = Path(a.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    env = {**os.environ, "DEVICE": a.device, "GPU_CHECK_OUT": str(out), "PYTHONPATH": str(ROOT)}
    env.setdefault("HF_HUB_OFFLINE", "1")
    smol = Path(os.environ.get("DSPARK_CACHE", "~/.cache/dspark")).expanduser()
    smol = smol / "targets" / "smollm2-135m-instruct"
    if a.device != "cpu" and (smol / "config.json").exists():
        env["GPU_CHECK_TARGET"] = str(smol)
    report = {"device": a.device, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if "tests" not in skip:
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rs", "tests/test_gpu.py"]
        report["tests"] = run(cmd, env, out / "tests.log")
        report["tests"]["reports"] = [json.loads(f.read_text()) for f in out.glob("bf16_*.json")]
    if "train" not in skip:
        report["train"] = train(a.device, out, env)
    if "bench" not in skip:
        default = "eager,compile,cudagraphs" if a.device.startswith("cuda") else "eager,compile"
        report["bench"] = bench(a.device, (a.modes or default).split(","))
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    md = ["# gpu-check", "", f"device: {a.device}", "", "```json", json.dumps(report, indent=2)]
    (out / "gpu_check.md").write_text("\n".join(md + ["```", ""]))
    print(json.dumps(report, indent=2, default=str))
    failed = [k for k in ("tests", "train") if report.get(k, {}).get("rc", 0) != 0]
    print(f"wrote {out}/gpu_check.json; " + (f"FAILED: {failed}" if failed else "all steps ran"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
