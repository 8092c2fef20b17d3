"""`trainer.mixed_precision: auto`: bf16 exactly where the CPU has native bf16 (or CUDA has it)."""

import pytest
import torch

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


def test_this_machine_reads_its_own_flags():
    flags = cpu_flags()
    native = bool(flags & {"avx512_bf16", "amx_bf16"})
    if not torch.cuda.is_available():
        assert resolve_mixed_precision("auto") == ("bf16" if native else "no")


def test_schema_accepts_auto_and_quickstart_uses_it():
    from test_run_config import _compose

    from dspark.training.schema import check

    cfg = _compose(["recipe=quickstart"])
    check(cfg)
    assert cfg.trainer.mixed_precision == "auto"
    assert _compose(["data.train=x"]).trainer.mixed_precision == "no"  # the schema default
    bad = _compose(["data.train=x", "trainer.mixed_precision=bf17"])
    with pytest.raises(ValueError, match="mixed_precision"):
        check(bad)
