"""`trainer.mixed_precision: auto`: bf16 autocast for the draft where the hardware runs it natively.

The frozen target is untouched by this choice: it runs in `target.dtype` with autocast off, and
its logits are fp32 by contract (`dspark.target.capture`). Only the draft's forward/backward runs under
Accelerate's autocast; its master weights and the optimizer stay fp32.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dspark.machine import cpu_flags

# CPU flags of native bf16 matrix math (Linux /proc/cpuinfo names): AVX-512 BF16 dot products
# (Cooper Lake, Zen 4+) and AMX tiles (Sapphire Rapids+). Without them bf16 is emulated and
# slower than fp32.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_support(cpuinfo: str | Path = "/proc/cpuinfo") -> dict:
    """What this CPU offers for bf16: the native flags found, torch's CPU capability
    (`torch.backends.cpu.get_cpu_capability()`: the vector ISA its kernels were dispatched to,
    e.g. AVX512; it does not name bf16 itself) and whether oneDNN runs bf16 natively."""
    flags = sorted(cpu_flags(cpuinfo) & set(BF16_CPU_FLAGS))
    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn = False
    return {
        "native_bf16_flags": flags,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_bf16": onednn,
        "bf16": bool(flags),
    }


def resolve_mixed_precision(
    value: str, device: torch.device | str | None = None, cpuinfo: str | Path = "/proc/cpuinfo"
) -> str:
    """`no | bf16 | fp16` for Accelerate: `auto` becomes `bf16` on a CUDA device that supports
    it or a CPU with native bf16 (`BF16_CPU_FLAGS`), else `no` (fp32); other values pass."""
    if value != "auto":
        return value
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    if device.type == "cpu":
        return "bf16" if cpu_bf16_support(cpuinfo)["bf16"] else "no"
    return "no"
