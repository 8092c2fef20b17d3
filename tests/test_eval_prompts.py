"""Benchmark prompt loading: `{"turns": ...}` files, the embedded held-out set, chat rendering."""

import json

import pytest

from dspark.errors import MissingPathError
from dspark.eval.prompts import find_bench_dir, load_dataset, load_turns, render


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


def test_bench_dir_search_order(tmp_path, monkeypatch):
    """argument, then $DSPARK_BENCH_DIR; no folder beside the checkout or the current
    directory is ever looked in (a user's machine has none)."""
    monkeypatch.delenv("DSPARK_BENCH_DIR", raising=False)
    cwd = tmp_path / "runs" / "checkout"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    (tmp_path / "runs" / "shared" / "data" / "bench").mkdir(parents=True)  # ../shared/...
    with pytest.raises(MissingPathError, match="DSPARK_BENCH_DIR") as e:
        find_bench_dir()
    # the message names the fixes: a folder, or a public set by name (from the hub)
    assert "gsm8k" in str(e.value) and "hub" in str(e.value) and "shared" not in str(e.value)
    env = tmp_path / "env_bench"
    env.mkdir()
    monkeypatch.setenv("DSPARK_BENCH_DIR", str(env))
    assert find_bench_dir() == env
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    assert find_bench_dir(explicit) == explicit
    assert find_bench_dir(str(explicit)) == explicit
    # an explicit folder that does not exist is an error, not a fall-through
    with pytest.raises(MissingPathError, match="bench_dir="):
        find_bench_dir(tmp_path / "missing")
    monkeypatch.setenv("DSPARK_BENCH_DIR", str(tmp_path / "missing"))
    with pytest.raises(MissingPathError, match="DSPARK_BENCH_DIR="):
        find_bench_dir()
    # load_dataset searches the same way
    (env / "tiny.jsonl").write_text('{"turns": ["hi"]}\n')
    monkeypatch.setenv("DSPARK_BENCH_DIR", str(env))
    assert load_dataset("tiny", None, None) == [["hi"]]


def test_a_public_set_no_folder_holds_comes_from_the_hub(tmp_path, monkeypatch):
    """No bench folder anywhere: gsm8k is read through the hub reader (stubbed here: no
    network), an unknown name is refused with the names there are, and a local copy wins."""
    import dspark.data.prompts.named_sets as named_sets
    from dspark.eval.prompts import check_datasets

    monkeypatch.delenv("DSPARK_BENCH_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    asked = []

    def hub_rows(spec):
        asked.append(spec.hub_id)
        return [{"turns": ["hub q1"]}, {"turns": ["hub q2"]}]

    monkeypatch.setattr(named_sets, "hub_rows", hub_rows)
    check_datasets(["gsm8k", "embedded"], None)  # no folder: still a known name
    assert load_dataset("gsm8k", None, 1) == [["hub q1"]] and asked == ["openai/gsm8k"]
    with pytest.raises(MissingPathError, match="no prompt set 'nope'.*humaneval"):
        check_datasets(["nope"], None)
    local = tmp_path / "bench"
    local.mkdir()
    (local / "gsm8k.jsonl").write_text('{"turns": ["local q"]}\n')
    assert load_dataset("gsm8k", local, None) == [["local q"]] and len(asked) == 1
