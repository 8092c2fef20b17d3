"""Regenerate assistant turns with the target (on-policy data), optionally tokenize them.

    python data_scripts/regenerate.py --target embedded --input embedded --split train \
        --output data/embedded-train --max-new-tokens 256 --tokenize

Backends: `--backend decoder` (default; dspark's static-cache decoder, `--batch-size` rows
per batch, 32, grouped by prompt length), `--backend hf` (HF generate, the fallback),
`--server URL` (vLLM / SGLang via the openai client). Rerun the same command to resume after
a kill. See dspark/data/regenerate.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark.data.cli import regenerate_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(regenerate_main())
