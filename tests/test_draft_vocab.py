"""The reduced draft vocabulary: the most frequent supervised ids, by hand."""

import json

import numpy as np
import pytest

from dspark.data.draft_vocab import count_supervised, top_ids, write_draft_vocab
from dspark.errors import BadInputError


def _set(tmp_path, rows):
    from datasets import Dataset

    ds = Dataset.from_list([{"input_ids": i, "loss_mask": m} for i, m in rows])
    ds.save_to_disk(str(tmp_path / "tok"))
    return tmp_path / "tok"


def test_counts_only_supervised_tokens_and_ties_go_to_the_lower_id(tmp_path):
    data = _set(tmp_path, [([5, 1, 1, 2], [0, 1, 1, 1]), ([5, 3, 2, 9], [1, 0, 1, 0])])
    counts = count_supervised(data, 10)
    # supervised: 1, 1, 2 | 5, 2  -> 1:2, 2:2, 5:1 (3 and 9 and the first 5 are prompt tokens)
    assert counts.tolist() == [0, 2, 2, 0, 0, 1, 0, 0, 0, 0]
    assert top_ids(counts, 2).tolist() == [1, 2]
    assert top_ids(counts, 3).tolist() == [1, 2, 5]
    assert top_ids(counts, 4).tolist() == [0, 1, 2, 5]  # unseen ids: the lowest first
    doc = json.loads(write_draft_vocab(data, 2, 10).read_text())
    assert doc["ids"] == [1, 2] and doc["coverage"] == pytest.approx(4 / 5)
    with pytest.raises(BadInputError, match="token id 9 >= vocab size 8"):
        count_supervised(data, 8)
    with pytest.raises(BadInputError, match=r"must be in \[1, 10\]"):
        top_ids(np.zeros(10, dtype=np.int64), 11)


def test_the_export_reads_the_file(tmp_path):
    from dspark.export.vocab import read_vocab_file

    data = _set(tmp_path, [([1, 2, 3], [1, 1, 1])])
    assert read_vocab_file(write_draft_vocab(data, 2, 10), 10).tolist() == [1, 2]
