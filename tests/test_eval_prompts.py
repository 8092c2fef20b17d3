"""Benchmark prompt loading: `{"turns": ...}` files, the embedded held-out set, chat rendering."""

import json

import pytest

from dspark.eval.prompts import default_bench_dir, load_dataset, load_turns, render


@pytest.fixture
def bench_dir(tmp_path):
    rows = [{"turns": ["What is 2 + 3?", "And times 4?"]}, {"turns": ["Say hi."]}]
    (tmp_path / "tiny.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return tmp_path


def test_load_turns_and_limit(bench_dir):
    assert load_turns(bench_dir / "tiny.jsonl") == [["What is 2 + 3?", "And times 4?"], ["Say hi."]]
    assert load_dataset("tiny", bench_dir, 1) == [["What is 2 + 3?", "And times 4?"]]


def test_bad_rows_and_missing_sets_fail_clearly(tmp_path, bench_dir):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match='bad.jsonl:1: .*"turns"'):
        load_turns(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError, match="tiny"):  # lists what is there
        load_dataset("gsm9k", bench_dir, None)


def test_render_first_turn_and_later_turns_with_answers(bench_dir, tiny_target):
    _, tok = tiny_target("qwen3")
    turns = load_dataset("tiny", bench_dir, None)[0]
    first = tok.decode(render(tok, turns, []))
    assert "What is 2 + 3?" in first and "And times 4?" not in first
    assert first.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # generation prompt
    second = tok.decode(render(tok, turns, ["It is 5."], system_prompt="Be brief."))
    assert second.index("Be brief.") < second.index("What is 2 + 3?") < second.index("It is 5.")
    assert second.index("It is 5.") < second.index("And times 4?")
    assert second.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_embedded_held_out_set():
    convs = load_dataset("embedded", None, 3)
    assert len(convs) == 3 and all(len(c) == 1 and c[0] for c in convs)


def test_default_bench_dir_is_beside_the_repo():
    assert default_bench_dir().parts[-3:] == ("shared", "data", "bench")
