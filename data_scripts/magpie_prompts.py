"""Chat prompts the target writes itself (Magpie): sample user messages, filter, deduplicate.

    python data_scripts/magpie_prompts.py --target embedded --num 20000 \
        --output runs/data/magpie-embedded
    python data_scripts/regenerate.py --target embedded \
        --input runs/data/magpie-embedded/prompts.jsonl --output runs/data/magpie-answers

The chat template is rendered up to the start of a user turn and the target samples the
message (T 1, top-p 0.95 by default) until its end-of-turn token, on dspark's batched decoder
(`--batch-size` rows at a time) or, with `--backend llama-cpp`, on llama.cpp's server and the
target's GGUF (`--batch-size` slots; each sample names its generator). Each row's text depends only on its seed; rerun the same
command (or a larger --num) to continue after a kill. Junk, duplicates (exact and word
5-gram Jaccard >= --near-threshold) and any prompt that copies a bench prompt (--bench-dir,
$DSPARK_BENCH_DIR, else the public bench sets by name from the hub) are rejected and counted in
summary.json. See dspark/data/regeneration/magpie.py for the files written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dspark.errors import EXIT_UNFINISHED, BadInputError, user_errors


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="embedded", help="embedded | tiny-* | model dir | hub id")
    p.add_argument("--num", type=int, required=True, help="user messages to sample (rows 0..N-1)")
    p.add_argument("--output", required=True, help="output directory (rerun to continue)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="rows decoded together")
    p.add_argument(
        "--chunk-rows", type=int, default=None, help="rows per written chunk (default 4 x batch)"
    )
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest user message")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument(
        "--system-prompt", default=None, help="system message (default: the template's own)"
    )
    p.add_argument("--bench-dir", default=None, help="bench sets never to copy")
    p.add_argument("--min-chars", type=int, default=12)
    p.add_argument("--max-chars", type=int, default=4000)
    p.add_argument("--near-threshold", type=float, default=0.7, help="word 5-gram Jaccard")
    p.add_argument("--language", default=None, choices=("en",), help="keep English only")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if any)")
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="MINUTES",
        help=f"stop at the first chunk boundary past this many minutes, exit {EXIT_UNFINISHED}; "
        "rerun the same command to continue",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="float32 | bfloat16 | auto (the faster batched AR step, measured and cached per "
        "device as regenerate.py does; default: bf16 on GPU, fp32 on CPU)",
    )
    p.add_argument(
        "--backend",
        default="decoder",
        choices=("decoder", "llama-cpp"),
        help="decoder: dspark's batched decoder; llama-cpp: llama.cpp's server on the target's "
        "GGUF (see regenerate.py --backend llama-cpp)",
    )
    p.add_argument("--target-gguf", default=None, help="llama-cpp: default the embedded file")
    p.add_argument("--server-bin", default="auto", help="llama-cpp: auto | xllamacpp | a path")
    p.add_argument("--num-threads", type=int, default=None, help="llama-cpp: threads (all)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def check(a: argparse.Namespace) -> None:
    """Bad values as one `error:` line each, before the target loads."""
    if a.num < 1:
        raise BadInputError(f"--num {a.num}: must be >= 1")
    if a.batch_size < 1 or (a.chunk_rows is not None and a.chunk_rows < 1):
        raise BadInputError("--batch-size and --chunk-rows must be >= 1")
    if a.max_new_tokens < 1:
        raise BadInputError(f"--max-new-tokens {a.max_new_tokens}: must be >= 1")
    if a.temperature <= 0 or not 0 < a.top_p <= 1 or a.top_k < 0:
        raise BadInputError(
            "--temperature must be > 0 (the messages are sampled; T 1 is usual), --top-p in "
            "(0, 1], --top-k >= 0"
        )
    if not 0 < a.near_threshold <= 1:
        raise BadInputError(f"--near-threshold {a.near_threshold}: must be in (0, 1]")
    if a.min_chars < 0 or a.max_chars < max(a.min_chars, 1):
        raise BadInputError("--min-chars must be >= 0 and --max-chars >= --min-chars")


def main(argv=None) -> int:
    a = parse(argv)
    with user_errors("magpie_prompts"):
        check(a)
        import torch

        from dspark.data.outputs import require_output_dir
        from dspark.data.prompts.prompt_filter import (
            BenchOverlap,
            find_bench_dir,
            public_bench_texts,
            read_bench_texts,
        )
        from dspark.data.regeneration.decoder_backend import DecoderBackend
        from dspark.data.regeneration.magpie import (
            Filters,
            check_run,
            generate_prompts,
            magpie_settings,
            pre_query_template,
        )
        from dspark.data.regeneration.sampling import SamplingConfig
        from dspark.dtype_probe import cast_to_fastest
        from dspark.target import load_target, load_tokenizer

        require_output_dir(a.output)
        bench_dir = find_bench_dir(a.bench_dir)
        # no folder: the public bench sets by name (the hub; offline, an error naming the fix)
        texts = read_bench_texts(bench_dir) if bench_dir else public_bench_texts()
        bench = BenchOverlap(texts, a.near_threshold)
        sampling = SamplingConfig(
            temperature=a.temperature,
            top_p=a.top_p,
            top_k=a.top_k,
            max_new_tokens=a.max_new_tokens,
            seed=a.seed,
        )
        # The template and an earlier run's settings are checked on the tokenizer alone: a
        # target it cannot serve or a mismatched rerun is refused before the model loads.
        pre = pre_query_template(load_tokenizer(a.target), a.system_prompt)
        check_run(Path(a.output), magpie_settings(a.target, sampling, a.system_prompt, pre))
        device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = a.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        if a.backend == "llama-cpp":
            from dspark.data.regeneration.llama_cpp_backend import open_backend

            # a slot holds the pre-query prompt and the longest user message
            pre_len = len(load_tokenizer(a.target)(pre.text)["input_ids"])
            backend = open_backend(a.target, a.target_gguf, a.server_bin,
                                   a.num_threads or os.cpu_count() or 1, slots=a.batch_size,
                                   slot_ctx=pre_len + a.max_new_tokens + 16)  # fmt: skip
            tok = backend.tok
            cond = backend.conditions()
            generator = f"llama-cpp:{cond['target_gguf']}"
        else:
            model, tok = load_target(a.target, dtype="float32" if dtype == "auto" else dtype,
                                     device=device)  # fmt: skip
            if dtype == "auto":
                cast_to_fastest(model, job="plain", batch=a.batch_size, out_dir=a.output)
            backend = DecoderBackend(model, tok, batch_size=a.batch_size)
            cond = {**backend.conditions(), "threads": torch.get_num_threads()}
            generator = "decoder"
        filters = Filters(
            min_chars=a.min_chars,
            max_chars=a.max_chars,
            language=a.language,
            near_threshold=a.near_threshold,
        )
        summary = generate_prompts(
            backend,
            tok,
            a.output,
            num=a.num,
            target=a.target,
            sampling=sampling,
            chunk_rows=a.chunk_rows or 4 * a.batch_size,
            system_prompt=a.system_prompt,
            filters=filters,
            bench=bench,
            bench_dir=str(bench_dir) if bench_dir else None,
            log=None if a.quiet else print,
            stop_after_s=None if a.stop_after is None else 60 * a.stop_after,
            generator=generator,
            conditions=cond,
        )
        if hasattr(backend, "close"):
            backend.close()
    return 0 if summary["complete"] else EXIT_UNFINISHED


if __name__ == "__main__":
    sys.exit(main())
