"""Named public prompt sets (dspark/data/prompts/public_sets.py, named_sets.py): hub rows ->
`{"turns": [...]}` in each hub schema, the local-folder-first order, the offline error.

No network: the hub is `datasets.load_dataset`, replaced here by a function that returns
hand-written rows (or raises as `datasets` does offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark.data.prompts import named_sets
from dspark.data.prompts.named_sets import bench_turns, load_named_set
from dspark.data.prompts.public_sets import (
    HUMANEVAL_PREFIX,
    PUBLIC_SETS,
    REASON_SUFFIX,
    HubRowError,
    to_prompt_row,
)
from dspark.data.prompts.sources import load_prompts
from dspark.errors import MissingPathError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

# One row of each hub schema, as `datasets` yields it.
HUB_ROWS = {
    "gsm8k": {"question": "Tom has 3 apples and buys 2 more. How many now?", "answer": "#### 5"},
    "gsm8k-train": {"question": "Ann reads 4 pages a day. Pages in 3 days?", "answer": "#### 12"},
    "math500": {
        "problem": "What is $1+1$?",
        "solution": "$2$",
        "answer": "2",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/algebra/1.json",
    },
    "humaneval": {
        "task_id": "HumanEval/0",
        "prompt": 'def add(a: int, b: int) -> int:\n    """ Add two numbers.\n    >>> add(1, 2)\n    3\n    """\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    },
    "mbpp": {
        "source_file": "Benchmark Questions Verification V2.ipynb",
        "task_id": 11,
        "prompt": "Write a python function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_imports": [],
        "test_list": ["assert add(1, 2) == 3"],
    },
    "mt-bench": {
        "prompt": ["Write a haiku about the sea.", "Now make it rhyme."],
        "prompt_id": 12345678,
        "category": "writing",
        "reference": [],
    },
    "self-instruct-seed": {
        "id": "seed_task_1",
        "name": "antonym",
        "instruction": "Give the antonym of the word.",
        "instances": [{"input": "happy", "output": "sad"}],
        "is_classification": False,
    },
}
EXPECTED = {
    "gsm8k": ["Tom has 3 apples and buys 2 more. How many now?" + REASON_SUFFIX],
    "gsm8k-train": ["Ann reads 4 pages a day. Pages in 3 days?" + REASON_SUFFIX],
    "math500": ["What is $1+1$?" + REASON_SUFFIX],
    "humaneval": [HUMANEVAL_PREFIX + "\n```python\n" + HUB_ROWS["humaneval"]["prompt"] + "\n```"],
    "mbpp": ["Write a python function to add two numbers."],
    "mt-bench": ["Write a haiku about the sea.", "Now make it rhyme."],
    "self-instruct-seed": ["Give the antonym of the word.\n\nhappy"],
}


@pytest.fixture
def no_sibling_data(tmp_path, monkeypatch):
    """No implicit data folder (a user's fresh clone): only what a test sets is local."""
    for env in ("DSPARK_BENCH_DIR", "DSPARK_PROMPTS_DIR"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.chdir(tmp_path)


def fake_hub(monkeypatch, rows=None, error=None):
    """`datasets.load_dataset` returning `rows[hub_id]` (or raising `error`); the calls made."""
    import datasets

    calls = []

    def load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        if error is not None:
            raise error
        return rows[path]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_every_set_has_a_hand_written_row_and_licence():
    assert set(HUB_ROWS) == set(PUBLIC_SETS) == set(EXPECTED)
    for spec in PUBLIC_SETS.values():
        assert spec.licence and spec.hub_id.count("/") == 1 and spec.rows > 0


@pytest.mark.parametrize("name", sorted(PUBLIC_SETS))
def test_hub_rows_convert_to_the_local_format(name):
    assert to_prompt_row(PUBLIC_SETS[name], HUB_ROWS[name]) == {"turns": EXPECTED[name]}


def test_converters_read_the_other_schemas_and_refuse_rows_without_text():
    # FastChat's question.jsonl (and copies such as lighteval/mt-bench) say `turns`.
    fastchat = {"question_id": 81, "category": "writing", "turns": ["a", "b"]}
    assert PUBLIC_SETS["mt-bench"].convert(fastchat) == ["a", "b"]
    # MBPP's full config calls the description `text`.
    assert PUBLIC_SETS["mbpp"].convert({"task_id": 1, "text": "Write x."}) == ["Write x."]
    # A seed task without an input is its instruction alone.
    seed = {"instruction": "Tell a joke.", "instances": [{"input": "", "output": "..."}]}
    assert PUBLIC_SETS["self-instruct-seed"].convert(seed) == ["Tell a joke."]
    with pytest.raises(HubRowError, match="gsm8k.*'question'"):
        PUBLIC_SETS["gsm8k"].convert({"problem": "x"})
    with pytest.raises(HubRowError, match="mt-bench"):
        PUBLIC_SETS["mt-bench"].convert({"prompt": "one string"})


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared data folder beside the checkout")
def test_the_local_copies_have_the_converters_format():
    """The local bench copies are what the converters write: same suffix, same fence, same
    number of rows as the hub split."""
    for name in ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench"):
        rows = [json.loads(x) for x in (SHARED / "bench" / f"{name}.jsonl").open()]
        assert len(rows) == PUBLIC_SETS[name].rows, name
        first = rows[0]["turns"]
        if name in ("gsm8k", "math500"):
            assert first[0].endswith(REASON_SUFFIX)
        if name == "humaneval":
            assert first[0].startswith(HUMANEVAL_PREFIX + "\n```python\n")
            assert first[0].endswith("\n```")
        if name == "mt-bench":
            assert len(first) == 2
    mix = [json.loads(x) for x in (SHARED / "prompts" / "train_mix.jsonl").open()]
    for name in ("gsm8k-train", "self-instruct-seed"):
        assert sum(r["source"] == name for r in mix) == PUBLIC_SETS[name].rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_local_folder_comes_first_then_the_hub(tmp_path, monkeypatch, no_sibling_data):
    calls = fake_hub(monkeypatch, {"openai/gsm8k": [HUB_ROWS["gsm8k"]] * 3})
    env, given = tmp_path / "env", tmp_path / "given"
    _write(env / "gsm8k.jsonl", [{"turns": ["from env"]}])
    _write(given / "gsm8k.jsonl", [{"turns": ["from the argument"]}])
    monkeypatch.setenv("DSPARK_BENCH_DIR", str(env))
    assert bench_turns("gsm8k", given) == [["from the argument"]]  # the config's folder
    assert bench_turns("gsm8k") == [["from env"]]  # then $DSPARK_BENCH_DIR
    assert calls == []
    # A folder without the set: the hub, converted, `limit` rows.
    (env / "gsm8k.jsonl").unlink()
    got = load_named_set("gsm8k", limit=2)
    assert got.rows == [{"turns": EXPECTED["gsm8k"]}] * 2 and got.origin == "hub:openai/gsm8k"
    assert calls == [("openai/gsm8k", "main", "test")]


def test_training_sets_by_name_local_mix_or_hub(tmp_path, monkeypatch, no_sibling_data):
    seed_rows = [HUB_ROWS["self-instruct-seed"]]
    calls = fake_hub(monkeypatch, {"HuggingFaceH4/self-instruct-seed": seed_rows})
    # Hub: the seed tasks, normalised like any prompt source.
    ps = load_prompts("self-instruct-seed")
    assert [r["messages"][0]["content"] for r in ps.rows] == EXPECTED["self-instruct-seed"]
    assert ps.source == "public:self-instruct-seed (hub:HuggingFaceH4/self-instruct-seed)"
    assert calls == [("HuggingFaceH4/self-instruct-seed", None, "train")]
    # Local: the rows of train_mix.jsonl whose source is the name, in file order.
    folder = tmp_path / "prompts"
    _write(
        folder / "train_mix.jsonl",
        [
            {"turns": ["q1"], "source": "gsm8k-train"},
            {"turns": ["t0 row"], "source": "t0:x"},
            {"turns": ["q2"], "source": "gsm8k-train"},
        ],
    )
    monkeypatch.setenv("DSPARK_PROMPTS_DIR", str(folder))
    ps = load_prompts("gsm8k-train", limit=5)
    assert [r["messages"][0]["content"] for r in ps.rows] == ["q1", "q2"]
    assert [r["index"] for r in ps.rows] == [0, 1]
    # The whole mix by name, with --where on its `source` field.
    from dspark.data.prompts.prompt_set import RowSelection

    sel = RowSelection.parse(where=["source=t0:x"])
    assert [r["messages"][0]["content"] for r in load_prompts("train_mix", selection=sel).rows] == [
        "t0 row"
    ]
    assert len(calls) == 1  # the local sets never asked the hub
    with pytest.raises(ValueError, match="only a train split"):
        load_prompts("gsm8k-train", split="test")


def test_offline_without_a_local_copy_is_one_error_line(monkeypatch, no_sibling_data):
    fake_hub(
        monkeypatch, error=ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub\n(offline)")
    )
    with pytest.raises(MissingPathError) as e:
        bench_turns("gsm8k")
    msg = str(e.value)
    assert "\n" not in msg
    assert "'gsm8k'" in msg and "DSPARK_BENCH_DIR" in msg and "online" in msg
    with pytest.raises(MissingPathError, match="DSPARK_PROMPTS_DIR.*online"):
        load_prompts("gsm8k-train")
    with pytest.raises(MissingPathError, match="train_mix.*DSPARK_PROMPTS_DIR"):
        load_prompts("train_mix")


def test_the_real_offline_hub_gives_the_error_and_the_script_exits_2(
    tmp_path, monkeypatch, capsys, no_sibling_data
):
    """`datasets` itself, offline (HF_DATASETS_OFFLINE=1) and without a cached copy."""
    import datasets

    # `datasets` reads these at import: set them where it looks, so a machine that has the
    # set cached still sees an empty cache, offline.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty_cache")
    from dspark.cli import regenerate

    with pytest.raises(SystemExit) as e:
        regenerate(["--input", "self-instruct-seed", "--output", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("regenerate: error: prompt set 'self-instruct-seed'")
    assert "DSPARK_PROMPTS_DIR" in err[0] and "shared" not in err[0]


def test_unknown_names_list_the_sets():
    with pytest.raises(ValueError, match="bench sets: .*gsm8k"):
        bench_turns("gsm8k-train")
    with pytest.raises(ValueError, match="known: .*self-instruct-seed"):
        load_named_set("nope")
    assert named_sets.PROMPTS_ENV == "DSPARK_PROMPTS_DIR"
