"""Padding share of training batches with and without sequence packing.

    python eval/padding_share.py                      # embedded set + train_mix.jsonl
    python eval/padding_share.py --sources embedded --answer-tokens 128 --max-length 512
    python eval/padding_share.py --tokenized runs/data/embedded/train/tokenized

Padding share = pad tokens / all tokens of one epoch of batches, as the training loader builds
them (`dspark.data.packing.padding_stats`): `batch-size` rows per batch in a seeded random order,
each batch right-padded to its longest row, rows truncated to `max-length`; packed rows are
conversations first-fit into `max-length` tokens. Prompt sources are measured as conversations
whose every assistant turn is a fixed answer of `answer-tokens` tokens (regenerated answers are
not needed for this measure; a `--tokenized` set is measured as it is).
Writes runs/padding_share/padding_share.{json,md}.
"""

import argparse
import json
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.data.packing import padding_stats, row_lengths

TRAIN_MIX = "train_mix"  # the named set: $DSPARK_PROMPTS_DIR's train_mix.jsonl


def prompt_lengths(source: str, tokenizer, answer_tokens: int) -> tuple[list[int], int]:
    """Token counts of the source's conversations rendered with the chat template, every user
    turn answered by a fixed answer; returns (lengths, tokens of that answer)."""
    from dspark.data.prompts.fixed_answers import filler_answer, with_fixed_answers
    from dspark.data.prompts.sources import load_prompts

    answer, n_answer = filler_answer(tokenizer, answer_tokens)
    rows = with_fixed_answers(load_prompts(source, split="train").rows, answer)
    texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in rows]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(x) for x in ids], n_answer


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", default="embedded", help="whose tokenizer and chat template")
    ap.add_argument("--sources", nargs="*", default=["embedded", TRAIN_MIX])
    ap.add_argument("--tokenized", nargs="*", default=[], help="tokenized dataset dirs")
    ap.add_argument("--answer-tokens", type=int, nargs="+", default=[128])
    ap.add_argument("--max-length", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/padding_share")
    args = ap.parse_args()

    sets = {}  # name -> (lengths, how they were measured)
    if args.sources:
        from dspark.target import load_tokenizer

        tok = load_tokenizer(args.target)
        for src in args.sources:
            for a in args.answer_tokens:
                lengths, n = prompt_lengths(src, tok, a)
                sets[f"{Path(src).name} (answers {n} tok)"] = (
                    lengths,
                    f"prompts + {n}-token answers",
                )
    for d in args.tokenized:
        from datasets import load_from_disk

        sets[str(d).rstrip("/")] = (row_lengths(load_from_disk(d)), "tokenized set as is")

    results = []
    for name, (lengths, how) in sets.items():
        for L in args.max_length:
            for packing in (False, True):
                s = padding_stats(lengths, args.batch_size, L, packing, args.seed)
                results.append({"set": name, "measured": how, "max_length": L, **s})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    conditions = {k: getattr(args, k) for k in ("target", "batch_size", "seed")}
    (out / "padding_share.json").write_text(
        json.dumps({"conditions": conditions, "results": results}, indent=2)
    )
    md = [
        "# Padding share with and without packing\n",
        f"Tokenizer and chat template of `{args.target}`; batch {args.batch_size} rows; "
        f"seed {args.seed}; one epoch; padding share = pad tokens / all batch tokens.\n",
        "| set | max_length | conversations | packing | rows | conv/row | batches "
        "| tokens/batch | padding share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        md.append(
            f"| {r['set']} | {r['max_length']} | {r['conversations']} | "
            f"{'yes' if r['packing'] else 'no'} | {r['rows']} | {r['conversations_per_row']:.2f} | "
            f"{r['batches']} | {r['mean_tokens_per_batch']:.0f} | {100 * r['pad_share']:.1f}% |"
        )
    text = "\n".join(md) + "\n"
    (out / "padding_share.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
