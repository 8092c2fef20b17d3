"""Fit STS temperatures for a draft's confidence head on held-out prompts and store them.

    python eval/calibrate.py --draft runs/quickstart/draft [--target SPEC] \
        [--datasets mbpp math500] [--num-prompts 24] [--max-new-tokens 64] [--no-write]

Decodes with full-block verification and raw confidences, fits Sequential Temperature Scaling
on half the requests, scores the other half (ECE / Brier / AUROC before and after), and writes
`confidence_temperatures` into the draft's config.json (the decoder applies them). Writes
calibration.json, calibration.md and calibration_reliability.png to --out (default: the draft
directory).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--draft", required=True, help="a DSpark draft directory (save_pretrained)")
    ap.add_argument("--target", default=None, help="default: the draft's target_name_or_path")
    ap.add_argument("--datasets", nargs="+", default=["mbpp", "math500"])
    ap.add_argument(
        "--bench-dir",
        default=None,
        help="default: $DSPARK_BENCH_DIR, else the hub (dspark/eval/prompts.py)",
    )
    ap.add_argument("--num-prompts", type=int, default=24, help="per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--bins", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-write", dest="write", action="store_false", help="report only")
    ap.add_argument("--out", default=None, help="report folder (default: the draft directory)")
    args = ap.parse_args()
    import torch

    from dspark.calibration.report import write_report
    from dspark.eval.calibrate import run

    if args.threads:
        torch.set_num_threads(args.threads)
    res = run(args)
    print(write_report(res, Path(args.out or args.draft)))


if __name__ == "__main__":
    main()
