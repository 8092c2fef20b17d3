"""Where a long data build stands and the time left to N answered rows, step by step: the
prompt samples and answers done, what the mix's first N rows need of each, each step's pace
from its runs.jsonl (dspark/data/build_status.py).

    python data_scripts/build_status.py $DSPARK_CACHE/data/smollm2-large/answers --rows 24000
    make smollm2-large-status   # the same for the larger SmolLM2 build (LARGE_ROWS)

Read-only: it may run beside the build. --json also writes the figures as JSON.
"""

import argparse
from pathlib import Path

from dspark.data.build_status import build_status, render
from dspark.errors import user_errors
from dspark.fileio import dumps_strict, write_text_atomic

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("answers", help="the answering step's --output folder (regenerate.py's)")
    ap.add_argument("--rows", type=int, required=True, help="answered rows wanted (N)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the figures here")
    a = ap.parse_args()
    with user_errors("build_status"):
        status = build_status(Path(a.answers), a.rows)
        if a.json:
            write_text_atomic(a.json, dumps_strict(status, indent=2) + "\n")
    print(render(status), end="")
