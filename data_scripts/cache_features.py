"""Run the target once over a tokenized set and cache its features for training.

    python data_scripts/cache_features.py --target embedded \
        --data runs/data/embedded/train/tokenized --output runs/data/embedded/train/features
    # then: accelerate launch train/distill.py recipe=quickstart data.features=<output> ...
    python data_scripts/cache_features.py --target-config '{"hidden_size": 4096,
        "num_hidden_layers": 36}' --estimate-only          # Qwen3-8B size, no hub, no weights

    python data_scripts/cache_features.py --target embedded --data BIGGER/tokenized \
        --output BIGGER/features --reuse-from SMALLER/features   # a grown set: its first
                                                               # shards linked, not recomputed

Prints the size estimate first and refuses to start when the disk lacks room. Resumable: rerun
the same command after a kill; finished shards are kept as they are. Format and what
`--positions loss` keeps: dspark/data/features/feature_cache.py.
"""

import argparse
import json
import sys

from dspark.data.cli import TARGET_DTYPES, check_device
from dspark.data.features import feature_cache as fc
from dspark.errors import user_errors

# --target-dtype auto times a tapped forward of this many tokens per row (rows are ~100-500)
PROBE_TOKENS = 256


def _layer_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated ints") from None


def main(argv=None) -> int:
    """Parse the command line and run; a user's mistake ends as one `error:` line, status 2."""
    with user_errors("cache_features"):
        return _main(argv)


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="embedded", help="embedded | tiny-* | model dir | hub id")
    p.add_argument(
        "--target-config",
        default=None,
        help="estimate from these dims alone (inline JSON or a config.json); implies "
        "--estimate-only and loads no weights",
    )
    p.add_argument("--data", default=None, help="tokenized dataset dir (input_ids, loss_mask)")
    p.add_argument("--output", default=None, help="cache dir (resumes when it exists)")
    p.add_argument("--dtype", default="bf16", choices=sorted(fc.DTYPES))
    p.add_argument("--positions", default="all", choices=fc.POSITIONS)
    p.add_argument(
        "--layer-ids",
        type=_layer_ids,
        default=None,
        help="e.g. 1,8,14,21,27 (default: the draft's)",
    )
    p.add_argument("--num-layers-tapped", type=int, default=5)
    p.add_argument(
        "--target-dtype",
        default="float32",
        choices=TARGET_DTYPES,
        help="the target's own dtype; auto: a short probe of a batched tapped forward in "
        "float32 and bfloat16 picks the faster (cached per device and target)",
    )
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if any)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--shard-mb", type=float, default=fc.DEFAULT_SHARD_MB)
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--reuse-from",
        action="append",
        default=[],
        metavar="CACHE",
        help="a feature cache of a set this one grew from (repeatable): its shards over the "
        "same rows are linked instead of computed",
    )
    p.add_argument("--estimate-only", action="store_true", help="print the size, write nothing")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON too")
    a = p.parse_args(argv)
    if a.batch_size < 1 or a.shard_mb <= 0:
        p.error("--batch-size must be >= 1 and --shard-mb > 0")
    writes = not (a.estimate_only or a.target_config)
    if writes and not (a.data and a.output):
        p.error("--data and --output are needed to write a cache")
    if writes:  # before the estimate and the target load: a wrong path costs seconds
        check_device(p, a.device)
        fc.load_tokenized(a.data)
        fc.check_cache_output(a.output)
        for cache in a.reuse_from:
            fc.read_manifest(cache)

    dims = fc.target_dims(a.target_config or a.target)
    layer_ids = fc.resolve_layer_ids(dims["num_hidden_layers"], a.layer_ids, a.num_layers_tapped)
    est = fc.estimate_from_config(
        dims, layer_ids, data_dir=a.data, dtype=a.dtype, positions=a.positions
    )
    print(fc.format_estimate(est) + f"\n  layers tapped: {layer_ids}")
    if a.json:
        print(json.dumps(est, indent=2))
    if not writes:
        return 0

    import torch

    from dspark.target import load_target

    if a.num_threads:
        torch.set_num_threads(a.num_threads)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # auto: loaded in fp32, then cast to the dtype whose batched tapped forward measured fastest
    load_dtype = "float32" if a.target_dtype == "auto" else a.target_dtype
    target, tokenizer = load_target(a.target, dtype=load_dtype, device=device)
    if a.target_dtype == "auto":
        from dspark.dtype_probe import cast_to_fastest

        # a capture pass: [batch, n] tokens from the start of a row, every tapped layer
        cast_to_fastest(target, job="capture", batch=a.batch_size, tokens=[PROBE_TOKENS],
                        taps=layer_ids, context_len=16)  # fmt: skip
    manifest = fc.write_cache(
        target,
        a.data,
        a.output,
        layer_ids=layer_ids,
        target_name=a.target,
        pad_token_id=tokenizer.pad_token_id,
        dtype=a.dtype,
        positions=a.positions,
        batch_size=a.batch_size,
        shard_mb=a.shard_mb,
        reuse_from=a.reuse_from,
    )
    size = sum(s["bytes"] for s in manifest["shards"])
    print(f"wrote {a.output}: {manifest['num_shards']} shards, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
