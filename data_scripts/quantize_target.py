"""A target's GGUFs in the quantizations users serve, made with llama.cpp's own converter and
`llama-quantize` (dspark/bench/target_quants.py):

    make llama-server                                   # builds llama-quantize too
    python data_scripts/quantize_target.py --target embedded --quants q4_0,q4_k_m,q8_0
    python eval/llama_cpp_bench.py --target-gguf <printed q4_k_m path> ...

Default output: <dspark cache>/targets/gguf/<target name>/. Prints one path per quant.
"""

import argparse
import os
from pathlib import Path

from dspark.bench.target_quants import QUANTS, make_quants, parse_quants
from dspark.errors import user_errors
from dspark.export.gguf import default_llama_cpp_dir
from dspark.paths import cache_root
from dspark.target import resolve_target

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="embedded", help="embedded | model dir | hub id")
    ap.add_argument("--quants", default="q4_0,q4_k_m,q8_0", help=f"some of {', '.join(QUANTS)}")
    ap.add_argument("--output", default=None, help="default: <cache>/targets/gguf/<target>")
    ap.add_argument(
        "--tree", default=None, help=f"llama.cpp tree (default: {default_llama_cpp_dir()})"
    )
    ap.add_argument("--quantize-bin", default=None,
                    help="llama-quantize (default: build-native/bin beside the tree)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    with user_errors("quantize_target"):
        quants = parse_quants(a.quants)
        model_dir = Path(resolve_target(a.target))
        tree = Path(a.tree) if a.tree else default_llama_cpp_dir()
        qbin = a.quantize_bin or tree.parent / "build-native" / "bin" / "llama-quantize"
        out = a.output or cache_root() / "targets" / "gguf" / model_dir.name
        made = make_quants(model_dir, out, quants, tree=tree, quantize_bin=qbin,
                           threads=a.threads)  # fmt: skip
        for q, path in made.items():
            print(f"{q}\t{path}")
