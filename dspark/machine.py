"""What machine a figure was measured on: the CPU's model name (every report names it) and its
feature flags."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (`AMD EPYC ...`, `Intel(R) Xeon(R) ...`); `platform.processor()`
    says only `x86_64` on Linux."""
    try:
        return _model_name(Path(cpuinfo).read_text())
    except OSError:
        return _model_name("")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags the kernel reports (empty when unreadable, e.g. not Linux)."""
    try:
        return _flags(Path(cpuinfo).read_text())
    except OSError:
        return set()


def _model_name(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _flags(text: str) -> set[str]:
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpu_field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return None


def cpu_kind(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name with what tells apart machines of one name, for the conditions of
    every figure: `AMD EPYC (family 25 model 17; AVX-512 BF16, no AMX)`. Clouds often report
    only `AMD EPYC`, which covers AVX2-only and AVX-512 parts alike."""
    try:
        text = Path(cpuinfo).read_text()  # one read: the name, flags and family from one file
    except OSError:
        return _model_name("")
    flags = _flags(text)
    if "avx512f" in flags:
        vector = "AVX-512 BF16" if "avx512_bf16" in flags else "AVX-512"
    else:
        vector = "AVX2, no AVX-512" if "avx2" in flags else "no AVX2"
    matrix = "AMX" if "amx_tile" in flags else "no AMX"
    family, model = _cpu_field(text, "cpu family"), _cpu_field(text, "model")
    where = f"family {family} model {model}; " if family and model else ""
    return f"{_model_name(text)} ({where}{vector}, {matrix})"


def device_kind(device: torch.device) -> str:
    """What ran a figure: the GPU's name, or `cpu_kind()`."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_kind()
