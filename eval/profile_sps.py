"""Profile SPS(B), verify steps per second at token batch B, on this device (and plot it).

    python eval/profile_sps.py --draft runs/quickstart/draft [--target SPEC] [--max-rows 32] \
        [--context-len 256] [--reps 5] [--refresh] [--out runs/sps]
    python eval/profile_sps.py --target embedded --gamma 7      # the target alone, no draft

Stores the profile in the cache the decoder reads at start-up ($DSPARK_CACHE/sps/, keyed by
device, target, dtype and block size) and writes sps.json, sps.md and sps.png to --out.
Library: dspark/decoding/sps.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--draft", default=None, help="a DSpark draft dir (also times its rounds)")
    ap.add_argument("--target", default=None, help="default: the draft's target_name_or_path")
    ap.add_argument("--gamma", type=int, default=None, help="block size without a draft")
    ap.add_argument("--max-rows", type=int, default=32)
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--refresh", action="store_true", help="measure even when cached")
    ap.add_argument("--out", default="runs/sps")
    args = ap.parse_args()
    import torch

    from dspark.bench.sps_plot import plot_profile, profile_markdown
    from dspark.decoding.sps import default_rows, load_or_measure

    if args.threads:
        torch.set_num_threads(args.threads)
    draft = None
    if args.draft:
        from dspark.eval.models import load_models

        args.draft = str(args.draft)
        target, _, draft, spec = load_models(args)
    else:
        from dspark.eval.models import resolve_device
        from dspark.target.loading import _as_dtype, load_target

        spec = args.target or "embedded"
        target, _ = load_target(
            spec, dtype=_as_dtype(args.dtype), device=resolve_device(args.device)
        )
    gamma = args.gamma or (int(draft.config.block_size) if draft is not None else 7)
    prof = load_or_measure(
        target, draft, gamma=gamma, refresh=args.refresh, rows=default_rows(args.max_rows),
        context_len=args.context_len, reps=args.reps, progress=print,
    )  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sps.json").write_text(json.dumps(prof.to_dict(), indent=2) + "\n")
    plot_profile(prof, out / "sps.png", gamma)
    md = profile_markdown(prof, spec) + "\n![SPS](sps.png)\n"
    (out / "sps.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
