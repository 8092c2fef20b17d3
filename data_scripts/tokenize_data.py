"""Tokenize regenerated conversations with the target's chat template and loss masks.

    python data_scripts/tokenize_data.py --target embedded \
        --input data/embedded-train/regenerated.jsonl --output data/embedded-train/tokenized

Console script: `dspark-tokenize` (dspark/cli.py).
"""

from dspark.cli import tokenize

if __name__ == "__main__":
    tokenize()
