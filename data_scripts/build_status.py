"""Where a long data build stands and the time left to N answered rows, step by step: the
prompt samples and answers done, what the mix's first N rows need of each, each step's pace
from its runs.jsonl (dspark/data/build_status.py).

    python data_scripts/build_status.py $DSPARK_CACHE/data/smollm2-large/answers --rows 24000
    python data_scripts/build_status.py ... --features POINT/features --run runs/curve/n24000
    make smollm2-large-status   # the same for the larger SmolLM2 build (LARGE_ROWS)

--features and --run add a draft's stages after the answers: its feature cache (rows and
shards done), the target head's pass over it at the training's start (shards summarized) and
its training (the last checkpoint's step of the total), each with its pace and time left
(dspark/data/features/cache_progress.py, summary_cache.py, dspark/training/run_status.py).

Read-only: it may run beside the build. --json also writes the figures as JSON.
"""

import argparse
from pathlib import Path

from dspark.data.build_status import build_status, render
from dspark.data.features.cache_progress import cache_progress
from dspark.data.features.summary_cache import summary_progress
from dspark.errors import BadInputError, user_errors
from dspark.fileio import dumps_strict, write_text_atomic
from dspark.training.run_status import render_training, run_status

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("answers", help="the answering step's --output folder (regenerate.py's)")
    ap.add_argument("--rows", type=int, required=True, help="answered rows wanted (N)")
    ap.add_argument("--features", default=None, help="the draft's feature cache (--output)")
    ap.add_argument("--run", default=None, help="the draft's training run (trainer.output_dir)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the figures here")
    a = ap.parse_args()
    with user_errors("build_status"):
        if a.features and not a.run:
            raise BadInputError("--features needs --run: pass the draft's trainer.output_dir too")
        status = build_status(Path(a.answers), a.rows)
        text = render(status)
        if a.run:
            status["features"] = cache_progress(a.features) if a.features else None
            status["head_pass"] = summary_progress(a.features) if a.features else None
            status["training"] = run_status(a.run)
            text += f"\n## The draft: {a.run}\n\n"
            text += render_training(status["features"], status["training"], status["head_pass"])
        if a.json:
            write_text_atomic(a.json, dumps_strict(status, indent=2) + "\n")
    print(text, end="")
