"""Load sweep: AR, full-block, static threshold and the prefix scheduler at R concurrent requests.

    python eval/load_sweep.py [--draft DIR] [--target embedded] [--loads 1 2 4 8 16 32] \
        [--max-new-tokens 32] [--policies ar full threshold scheduler scheduler_ragged] \
        [--threshold 0.5] [--threads N] [--out runs/load_sweep]

Draft: --draft, else the first of runs/{smollm2,quickstart}/draft (from the cwd) that exists (read
in place), else a random-init draft (--random-draft; acceptance near zero, said in the report).
The scheduler's SPS profile is the cached one for this device/target/dtype (measured on first
use; --sps PROFILE.json to pass another). Writes results.json, traces.jsonl, report.md and two
plots to --out; rerunning with the same conditions resumes. Library: dspark/bench/load_sweep.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)

KNOWN_DRAFTS = ("runs/smollm2/draft", "runs/quickstart/draft")  # relative to the cwd


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--draft", default=None)
    ap.add_argument("--random-draft", action="store_true", help="no trained draft: random init")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--datasets", nargs="+", default=["gsm8k", "humaneval", "mt-bench"])
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument("--prompts-per-set", type=int, default=12)
    ap.add_argument("--loads", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--policies", nargs="+", default=None, help="default: all")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--honor-eos", action="store_true", help="stop requests at EOS (load drifts)")
    ap.add_argument("--sps", default=None, help="an SPS profile JSON (default: cached/measured)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeats", type=int, default=1, help="per load, policies interleaved; median kept"
    )
    ap.add_argument("--out", default="runs/load_sweep")
    args = ap.parse_args()

    import torch

    from dspark.bench.load_sweep import POLICIES, run_from_args

    if args.threads:
        torch.set_num_threads(args.threads)
    draft = args.draft or next((d for d in KNOWN_DRAFTS if Path(d, "config.json").exists()), None)
    if draft is None and not args.random_draft:
        raise SystemExit(
            f"no draft: pass --draft DIR (none of {KNOWN_DRAFTS} exists) or --random-draft"
        )
    _, report = run_from_args(args, draft, list(args.policies or POLICIES))
    print(report)
    print(f"results: {Path(args.out).resolve()}/results.json")


if __name__ == "__main__":
    main()
