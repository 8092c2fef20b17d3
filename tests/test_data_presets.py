"""Named public prompt presets: offline errors that name the fix, and local copies."""

import json

import pytest

from dspark.data.prompts.presets import PRESETS, describe, parse_preset
from dspark.data.prompts.sources import PresetUnavailable, load_prompts


def test_the_presets_drafts_are_trained_on_exist():
    assert {"sharegpt", "ultrachat", "magpie", "opencodeinstruct", "math"} <= set(PRESETS)
    table = describe()
    for p in PRESETS.values():
        assert p.hub_id in table and "train" in p.splits


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_offline_a_preset_fails_naming_itself_and_the_local_copy_syntax(name):
    """The suite runs with HF_DATASETS_OFFLINE=1 and an empty cache: every preset must fail
    fast with the preset, its dataset id and `NAME=DIR` in the message."""
    with pytest.raises(PresetUnavailable) as err:
        load_prompts(name, split="train", limit=2)
    msg = str(err.value)
    assert f"prompt preset {name!r}" in msg and PRESETS[name].hub_id in msg
    assert f"`{name}=DIR`" in msg


def test_a_local_copy_keeps_the_presets_column_mapping(tmp_path):
    rows = [
        {"id": "a", "input": "Write fizzbuzz in Python.", "output": "def f(): ..."},
        {"id": "b", "input": "Reverse a list.", "output": "xs[::-1]"},
    ]
    path = tmp_path / "oci.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_prompts(f"opencodeinstruct={path}", split="train")
    assert [r["messages"] for r in got.rows] == [
        [{"role": "user", "content": "Write fizzbuzz in Python."}],
        [{"role": "user", "content": "Reverse a list."}],
    ]  # the preset's own answers are dropped: the target regenerates them
    assert "preset:opencodeinstruct" in got.source


def test_local_copy_errors_and_names_that_are_not_presets(tmp_path):
    with pytest.raises(PresetUnavailable, match="ultrachat.*does not exist"):
        load_prompts(f"ultrachat={tmp_path / 'missing'}", split="train")
    with pytest.raises(ValueError, match="no 'test' split"):
        load_prompts(f"sharegpt={tmp_path}", split="test")
    with pytest.raises(ValueError, match="unknown prompt preset 'ultrachatt'"):
        parse_preset("ultrachatt=/x")
    assert parse_preset(str(tmp_path)) is None  # an existing path is never a preset
    assert parse_preset("some/hub-dataset") is None
