"""`trainer.mixed_precision: auto`: bf16 exactly where the CPU has native bf16 (or CUDA has it)."""

import pytest
import torch
from helpers import compose_config

from dspark.training.precision import cpu_bf16_support, cpu_flags, resolve_mixed_precision

SPR = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
ZEN3 = "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n"
COOPER = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n"


@pytest.mark.parametrize(
    "cpuinfo,flags,want",
    [
        (SPR, ["amx_bf16", "avx512_bf16"], "bf16"),
        (COOPER, ["avx512_bf16"], "bf16"),
        (ZEN3, [], "no"),
        (None, [], "no"),  # unreadable /proc/cpuinfo (not Linux): stay fp32
    ],
)
def test_auto_picks_bf16_only_with_native_support(tmp_path, cpuinfo, flags, want):
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    info = cpu_bf16_support(path)
    assert info["native_bf16_flags"] == flags and info["bf16"] == bool(flags)
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert resolve_mixed_precision("auto", "cpu", path) == want
    for explicit in ("no", "bf16", "fp16"):  # explicit choices pass through untouched
        assert resolve_mixed_precision(explicit, "cpu", path) == explicit


def test_auto_on_this_cpu_agrees_with_cpuid():
    """This CPU's answer from another source than the one `auto` reads: CPUID through torch's
    cpuinfo library (AVX-512-BF16 or AMX tiles), not the kernel's /proc/cpuinfo flags."""
    probes = [
        getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    if None in probes:
        pytest.skip("this torch has no CPUID probes for bf16")
    native = any(probe() for probe in probes)
    assert resolve_mixed_precision("auto", "cpu") == ("bf16" if native else "no")
    assert bool(cpu_flags() & {"avx512_bf16", "amx_bf16"}) == native  # the two sources agree


def test_schema_accepts_auto_and_quickstart_uses_it():
    from dspark.training.schema import check

    cfg = compose_config(["recipe=quickstart"])
    check(cfg)
    assert cfg.trainer.mixed_precision == "auto"
    assert compose_config(["data.train=x"]).trainer.mixed_precision == "no"  # the schema default
    bad = compose_config(["data.train=x", "trainer.mixed_precision=bf17"])
    with pytest.raises(ValueError, match="mixed_precision"):
        check(bad)
