"""The CPU kind every figure names: /proc/cpuinfo files written by hand."""

from __future__ import annotations

import torch

from dspark.decoding.sps import device_name
from dspark.machine import cpu_kind, device_kind


def _cpuinfo(tmp_path, name: str, family: int, model: int, flags: str):
    path = tmp_path / "cpuinfo"
    block = (f"processor\t: 0\nvendor_id\t: x\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: {name}\nstepping\t: 1\nflags\t\t: {flags}\n\n")  # fmt: skip
    path.write_text(block + block.replace("processor\t: 0", "processor\t: 1"))
    return path


def test_one_model_name_is_told_apart_by_family_model_and_vector_units(tmp_path):
    zen4 = _cpuinfo(tmp_path, "AMD EPYC", 25, 17, "fpu avx2 avx512f avx512_bf16 avx512_vnni")
    assert cpu_kind(zen4) == "AMD EPYC (family 25 model 17; AVX-512 BF16, no AMX)"
    zen2 = _cpuinfo(tmp_path, "AMD EPYC", 23, 49, "fpu avx2 fma")
    assert cpu_kind(zen2) == "AMD EPYC (family 23 model 49; AVX2, no AVX-512, no AMX)"
    xeon = _cpuinfo(tmp_path, "Intel(R) Xeon(R) Processor", 6, 143,
                    "avx2 avx512f avx512_bf16 amx_bf16 amx_tile")  # fmt: skip
    assert cpu_kind(xeon) == "Intel(R) Xeon(R) Processor (family 6 model 143; AVX-512 BF16, AMX)"
    plain = _cpuinfo(tmp_path, "Some CPU", 6, 85, "avx2 avx512f")
    assert cpu_kind(plain) == "Some CPU (family 6 model 85; AVX-512, no AMX)"


def test_an_unreadable_cpuinfo_still_names_something(tmp_path):
    assert cpu_kind(tmp_path / "missing")  # platform's name, never an exception


def test_the_cpu_device_is_named_by_its_kind():
    assert device_kind(torch.device("cpu")) == cpu_kind()


def test_the_round_profiles_cache_is_keyed_by_the_cpu_kind_and_threads():
    assert device_name(torch.device("cpu")) == f"{cpu_kind()}-{torch.get_num_threads()}threads"
