"""The command line behind data_scripts/tokenize_data.py, and the tokenize options
regenerate.py's `--tokenize` shares (dspark/data/cli.py)."""

from __future__ import annotations

import argparse
import json

from dspark.data.tokenize import tokenize_file


def json_arg(text):
    """An argparse type: a JSON object (e.g. chat template kwargs)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            "expected a JSON object, e.g. '{\"enable_thinking\": false}'"
        )
    return value


def tokenize_args(p):
    p.add_argument("--max-length", type=int, default=2048, help="truncate sequences (tokens)")
    p.add_argument(
        "--mask-method",
        default="auto",
        choices=("auto", "markers", "offsets"),
        help="loss-mask method: template {%% generation %%} markers or offsets",
    )


def print_tokenized(stats, where):
    print(
        f"tokenized: {stats['rows']} rows, {stats['tokens']} tokens, assistant share "
        f"{stats['assistant_share']:.3f} (mask method {stats['mask_method']}; "
        f"{stats['truncated']} truncated, {stats['truncated_away']} dropped by max_length, "
        f"{stats['no_assistant']} without assistant turns) -> {where}"
    )


def tokenize_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Tokenize conversations with the target's chat template and loss masks."
    )
    p.add_argument("--target", default="embedded", help="whose tokenizer / chat template")
    p.add_argument(
        "--input",
        required=True,
        help="regenerated.jsonl (or any prompt source whose rows have assistant turns); "
        "several joined by commas become one set, in that order",
    )
    p.add_argument("--output", required=True, help="directory for save_to_disk + manifest.json")
    p.add_argument("--chat-template-kwargs", type=json_arg, default=None)
    p.add_argument(
        "--partial",
        action="store_true",
        help="tokenize an unfinished regeneration's rows done so far (refused otherwise)",
    )
    p.add_argument("--limit", type=int, default=None, help="the first N rows of the input(s)")
    tokenize_args(p)
    a = p.parse_args(argv)
    if a.max_length < 1:
        p.error(f"--max-length {a.max_length}: must be >= 1")

    stats = tokenize_file(
        a.input,
        a.output,
        target=a.target,
        max_length=a.max_length,
        method=a.mask_method,
        chat_template_kwargs=a.chat_template_kwargs,
        partial=a.partial,
        limit=a.limit,
    )
    print_tokenized(stats, a.output)
    return 0
