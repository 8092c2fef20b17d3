"""The native llama-server build's configure line follows the CPU's flags."""

from pathlib import Path

from dspark.bench.llama_cpp_build import cmake_args
from dspark.machine import cpu_flags

XEON_AMX = (
    "fpu sse avx avx2 bmi2 fma f16c avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8"
)
EPYC_ZEN4 = "fpu sse avx avx2 bmi2 fma f16c avx512f avx512_vbmi avx512_vnni avx512_bf16"


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    return path


def test_cpu_flags_reads_the_first_cpu(tmp_path):
    assert cpu_flags(_cpuinfo(tmp_path, EPYC_ZEN4)) == set(EPYC_ZEN4.split())
    assert cpu_flags(tmp_path / "missing") == set()


def test_native_without_amx():
    args = cmake_args(EPYC_ZEN4.split())
    assert "-DGGML_NATIVE=ON" in args
    assert not any("AMX" in a for a in args)


def test_amx_cpu_names_its_features_and_leaves_amx_out():
    args = cmake_args(XEON_AMX.split())
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_NATIVE=ON" not in args
    assert "-DGGML_AVX512_BF16=ON" in args and "-DGGML_AVX512_VNNI=ON" in args
    assert "-DGGML_AVX512_VBMI=OFF" in args  # this Xeon's flags lack it
    assert not any("AMX" in a and a.endswith("=ON") for a in args)
    assert "-DGGML_NATIVE=ON" in cmake_args(XEON_AMX.split(), amx=True)
