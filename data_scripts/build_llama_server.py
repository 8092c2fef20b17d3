"""Build a native `llama-server` (and `llama-bench`) for this CPU from llama.cpp's own tree,
the fastest plain llama.cpp decoding to measure a draft against:

    python data_scripts/build_llama_server.py             # -> <dspark cache>/llama_cpp/build-native
    python eval/llama_cpp_bench.py --server-bin <printed path> --draft RUN/draft ...

Fetches the tree first when it is missing (data_scripts/fetch_llama_cpp.py). Needs cmake and a
C++ compiler; takes 6-9 min on 2 cores. Prints the server's path.
"""

import argparse
import os

from dspark.bench.llama_cpp_build import build_server
from dspark.errors import user_errors
from dspark.export.gguf import default_llama_cpp_dir, fetch_reference

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tree", default=None, help=f"llama.cpp tree (default: {default_llama_cpp_dir()})"
    )
    ap.add_argument("--build-dir", default=None, help="default: build-native beside the tree")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument(
        "--amx", action="store_true", help="build the AMX kernels too (they crash at batch >= 2)"
    )
    args = ap.parse_args()
    with user_errors("build_llama_server"):
        tree = fetch_reference(args.tree)
        build_dir = args.build_dir or tree.parent / "build-native"
        print(build_server(tree, build_dir, jobs=args.jobs, amx=args.amx))
