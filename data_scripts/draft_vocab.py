"""Choose a reduced draft vocabulary: the K target ids the target writes most often.

    python data_scripts/draft_vocab.py --data runs/data/embedded/train/tokenized --size 8192
    python data_scripts/export.py runs/quickstart/draft exports/q-8k --format gguf \
        --draft-vocab runs/data/embedded/train/tokenized/draft_vocab_8192.json

Counts the supervised tokens (the answers) of a tokenized set, writes draft_vocab_<K>.json
beside it (sorted ids, ties to the lower id, and the share of answer tokens they cover) and
prints that coverage. dspark/data/draft_vocab.py says what the file holds.
"""

import argparse
import json
import sys
from pathlib import Path

from dspark.errors import BadInputError, user_errors


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True, help="a tokenized set (tokenize / regenerate output)")
    p.add_argument("--size", type=int, required=True, nargs="+", help="K, one or more")
    p.add_argument("--target", default="embedded", help="the target whose vocabulary K is of")
    a = p.parse_args(argv)
    with user_errors("draft_vocab"):
        from transformers import AutoConfig

        from dspark.data.draft_vocab import write_draft_vocab
        from dspark.errors import require_dir
        from dspark.target.loading import resolve_target

        data = require_dir(a.data, "--data", "pass a tokenized set (OUTPUT/tokenized)")
        if not (Path(data) / "state.json").is_file():
            raise BadInputError(f"--data {data} is not a tokenized set (no state.json)")
        vocab = int(AutoConfig.from_pretrained(resolve_target(a.target)).vocab_size)
        for k in a.size:
            path = write_draft_vocab(data, k, vocab)
            doc = json.loads(path.read_text())
            print(f"{path}: {k} of {vocab} ids cover {100 * doc['coverage']:.2f}% of "
                  f"{doc['supervised_tokens']} answer tokens ({doc['seen_ids']} ids seen)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
