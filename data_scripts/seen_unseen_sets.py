"""Two bench sets from a data build's answers: prompts a draft trained on (`seen`, the build's
first rows) and prompts of the same mix it never saw (`unseen`, the rows after the draft's N),
so its decoder tau on each says whether more rows would lift it
(dspark/data/prompts/seen_unseen.py):

    python data_scripts/seen_unseen_sets.py $DSPARK_CACHE/data/smollm2-large/answers \
        --trained-rows 24000 --prompts 40 --output runs/curve/n24000/seen_unseen/sets
    python eval/benchmark.py draft=runs/curve/n24000/draft datasets=[unseen] \
        bench_dir=runs/curve/n24000/seen_unseen/sets ...
    make smollm2-seen-unseen N=24000    # both sets and both benchmarks for a curve point

Prints one path a set. A set already written with the same prompts is kept.
"""

import argparse
from pathlib import Path

from dspark.data.prompts.seen_unseen import seen_unseen_turns, write_sets
from dspark.errors import user_errors

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("answers", help="the answering step's --output folder, or its .jsonl file")
    ap.add_argument("--trained-rows", type=int, required=True,
                    help="N: the draft trained on the first N rows")  # fmt: skip
    ap.add_argument("--prompts", type=int, default=40, help="prompts in each set")
    ap.add_argument("--output", required=True, help="folder for seen.jsonl and unseen.jsonl")
    a = ap.parse_args()
    with user_errors("seen_unseen_sets"):
        answers = Path(a.answers)
        answers = answers / "regenerated.jsonl" if answers.is_dir() else answers
        sets = seen_unseen_turns(answers, a.trained_rows, a.prompts)
        for name, path in write_sets(sets, a.output).items():
            print(f"{name}\t{path}")
