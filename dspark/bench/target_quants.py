"""A target's GGUF in the quantizations llama.cpp users serve (Q4_0, Q4_K_M, Q8_0, ...), made
with llama.cpp's own tools: its converter (`convert_hf_to_gguf.py` of the tree
`dspark.export.gguf.fetch_reference` unpacks) writes an F16 GGUF of the HF weights, then
`llama-quantize` (built beside `llama-server`, llama_cpp_build.py) writes each quant from it.

Files: `<out>/<name>.f16.gguf` and `<out>/<name>.<quant>.gguf`, each written under a temporary
name and renamed, under the output folder's writer lock; a file already there is kept, so a
rerun makes only what is missing. A quantized target, given back to dspark as the target
(`--target <file>.gguf`), is dequantized once (dspark/target/prepare.py), so regeneration and
features come from the weights the engine serves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dspark.errors import BadInputError, MissingPathError
from dspark.locking import exclusive_output

# the names users and llama-quantize give them; F16 is the converter's own output
QUANTS = {"f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q4_k_m": "Q4_K_M",
          "q5_k_m": "Q5_K_M", "q6_k": "Q6_K", "iq4_nl": "IQ4_NL",
          "q4_0_pure": "Q4_0", "iq4_nl_pure": "IQ4_NL"}  # fmt: skip
# `llama-quantize --pure`: every weight in the one type, the output head (the token embedding
# of a tied model) too. A plain Q4_0 keeps that head in Q8_0 (or Q6_K), which llama.cpp's x86
# CPU backend does not repack into its multi-row kernels; a pure Q4_0 target is repacked whole
# (at the price of a 4-bit head: the agreement column of the quant table shows what it changes).
# IQ4_NL (4.5 bits, a non-linear grid over blocks of 32) is the other 4-bit type that backend
# repacks on AVX2 and needs no importance matrix; a model whose rows are not multiples of 256
# (SmolLM2's 576) cannot hold Q4_K, so its Q4_K_M falls back to types that are not repacked.
PURE = {q for q in QUANTS if q.endswith("_pure")}


def parse_quants(text: str) -> list[str]:
    """`"q4_0,Q4_K_M"` -> `["q4_0", "q4_k_m"]`, or a `BadInputError` naming the known ones."""
    names = [q.strip().lower() for q in text.split(",") if q.strip()]
    bad = [q for q in names if q not in QUANTS]
    if bad or not names:
        raise BadInputError(f"unknown quant(s) {bad or text!r}; use some of {', '.join(QUANTS)}")
    return list(dict.fromkeys(names))


def convert_command(tree: Path, model_dir: Path, out_file: Path) -> list[str]:
    """llama.cpp's converter: the HF directory `model_dir` to an F16 GGUF `out_file`."""
    return [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(model_dir),
            "--outfile", str(out_file), "--outtype", "f16"]  # fmt: skip


def quantize_command(quantize_bin: Path, src: Path, dst: Path, quant: str, threads: int) -> list:
    """`llama-quantize [--pure] SRC DST TYPE THREADS`."""
    pure = ["--pure"] if quant in PURE else []
    return [str(quantize_bin), *pure, str(src), str(dst), QUANTS[quant], str(threads)]


def converter_env(tree: Path) -> dict:
    """The converter reads the tree's own gguf-py (its version of the format), not the
    installed `gguf` package."""
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(tree / "gguf-py"), env.get("PYTHONPATH")])
    )
    return env


def _run_into(cmd_for: Callable[[Path], list[str]], dst: Path, log, env=None) -> Path:
    """Run the command that writes `cmd_for(tmp)`, then rename `tmp` to `dst`."""
    if dst.is_file():
        log(f"{dst} (kept)")
        return dst
    tmp = dst.with_name(f".{dst.name}.tmp")
    try:
        subprocess.run(cmd_for(tmp), check=True, env=env)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    log(f"{dst}")
    return dst


def make_quants(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    quants: Sequence[str],
    *,
    tree: str | os.PathLike,
    quantize_bin: str | os.PathLike | None,
    name: str | None = None,
    threads: int = 2,
    convert: Callable[[Path, Path, Path], list[str]] = convert_command,
    log=print,
) -> dict[str, Path]:
    """`{quant: path}` of `model_dir`'s GGUFs in `out_dir` (the F16 one always made first)."""
    model_dir, out, tree = Path(model_dir), Path(out_dir), Path(tree)
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise MissingPathError(f"{tree}: no llama.cpp converter; data_scripts/fetch_llama_cpp.py")
    needs_quantize = [q for q in quants if q != "f16"]
    if needs_quantize and (quantize_bin is None or not Path(quantize_bin).is_file()):
        raise MissingPathError(
            f"llama-quantize not found ({quantize_bin}); build it with `make llama-server` "
            "(data_scripts/build_llama_server.py), or ask only for f16"
        )
    stem = name or model_dir.name
    with exclusive_output(out, "the quantized targets"):
        out.mkdir(parents=True, exist_ok=True)
        f16 = _run_into(lambda tmp: convert(tree, model_dir, tmp), out / f"{stem}.f16.gguf", log,
                        env=converter_env(tree))  # fmt: skip
        made = {"f16": f16}
        qbin = Path(str(quantize_bin))
        for q in needs_quantize:

            def command(tmp: Path, q: str = q) -> list[str]:
                return quantize_command(qbin, f16, tmp, q, threads)

            made[q] = _run_into(command, out / f"{stem}.{q}.gguf", log)
    return {q: made[q] for q in quants}
