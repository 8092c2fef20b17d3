"""Tokenize regenerated conversations with the target's chat template and loss masks.

    python data_scripts/tokenize_data.py --target embedded \
        --input data/embedded-train/regenerated.jsonl --output data/embedded-train/tokenized
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark.data.cli import tokenize_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(tokenize_main())
