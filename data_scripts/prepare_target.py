"""Prepare the embedded target (SmolLM2-135M-Instruct from its PyPI GGUF) and show it answering.

python data_scripts/prepare_target.py [--cache-dir DIR] [--force] [--prompt TEXT]
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never wait on a hub

from dspark.prepare import SAMPLE_PROMPT, greedy_answer, prepare_embedded_target  # noqa: E402
from dspark.target import load_target  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--cache-dir",
        default=None,
        help="dspark cache root (default $DSPARK_CACHE or ~/.cache/dspark)",
    )
    ap.add_argument("--force", action="store_true", help="rebuild even if a prepared copy exists")
    ap.add_argument("--prompt", default=SAMPLE_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()

    path = prepare_embedded_target(args.cache_dir, force=args.force)
    model, tok = load_target(str(path))
    text, n, secs = greedy_answer(model, tok, args.prompt, args.max_new_tokens)
    print(f"\nuser: {args.prompt}\nassistant: {text}")
    print(
        f"[greedy, float32, CPU threads={__import__('torch').get_num_threads()}: "
        f"{n} tokens in {secs:.2f}s = {n / secs:.1f} tokens/s]"
    )


if __name__ == "__main__":
    main()
