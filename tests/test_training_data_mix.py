"""data.train joining several tokenized sets: rows of both, in order, nothing dropped."""

from helpers import debug_cfg


def test_comma_joined_train_sets_concatenate(tmp_path, debug_data):
    from datasets import load_from_disk

    from dspark.target import load_target
    from dspark.training.build import load_datasets

    one = load_from_disk(str(debug_data))
    # on the command line a comma needs quotes (Hydra would read a sweep): data.train="a,b"
    cfg = debug_cfg(tmp_path, f"'{debug_data},{debug_data}'", f"data.eval={debug_data}")
    _, tok = load_target(cfg.target.name)
    train, held_out = load_datasets(cfg, tok)
    assert len(train) == 2 * len(one) and len(held_out) == min(len(one), cfg.data.max_eval_rows)
    assert train[len(one)]["input_ids"] == one[0]["input_ids"]
    assert train[len(one) - 1]["loss_mask"] == one[len(one) - 1]["loss_mask"]
