"""Fit the confidence head's STS temperatures on benchmark-style prompt sets and ship them with
the draft (`eval/calibrate.py`): the prompts of the named sets, decoded and fitted by
`dspark.calibration.fit`. The default prompt sets (mbpp, math500) are neither training data
nor the benchmark's default sets.
Parallels `dspark/training/calibrate.py`, the same fit at the end of training on the run's
held-out split.
"""

from __future__ import annotations

import os

from dspark.calibration.fit import fit_on_prompts, write_temperatures
from dspark.eval.models import load_models
from dspark.eval.prompts import load_dataset, render
from dspark.target.loading import eos_ids


def run(args) -> dict:
    """`args`: draft, target, datasets, bench_dir, num_prompts, max_new_tokens, temperature,
    batch_size, bins, seed, device, dtype, write, output_dir (see eval/calibrate.py)."""
    target, tokenizer, draft, spec = load_models(args)
    if getattr(draft, "confidence_head", None) is None:
        raise ValueError(f"the draft at {args.draft} has no confidence head: nothing to calibrate")
    prompts = []
    for name in args.datasets:
        convs = load_dataset(name, args.bench_dir, args.num_prompts)
        prompts += [render(tokenizer, c, []) for c in convs]
    result = fit_on_prompts(
        target,
        draft,
        prompts,
        eos_ids(tokenizer, target),
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        bins=args.bins,
        seed=args.seed,
        temperature=args.temperature,
    )
    if result is None:
        raise ValueError("no verified drafts were recorded: raise max_new_tokens or num_prompts")
    result["conditions"] = {
        "draft": os.path.abspath(args.draft),
        "target": spec,
        "datasets": list(args.datasets),
        "num_prompts_per_dataset": args.num_prompts,
        **result["conditions"],
    }
    if args.write:
        result["written_to"] = str(write_temperatures(args.draft, result["temperatures"]))
    return result
