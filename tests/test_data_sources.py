"""Prompt sources: every input shape normalises to `messages`; bad rows are reported."""

import json

import pytest

from dspark.data.prompts.embedded import embedded_prompts
from dspark.data.prompts.rows import MalformedRow, normalize_row
from dspark.data.prompts.sources import load_prompts

U, A, S = "user", "assistant", "system"


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"turns": ["q1", "q2"]}, msgs((U, "q1"), (U, "q2"))),
        ({"turns": ["only"], "source": "gsm8k-train"}, msgs((U, "only"))),
        (
            {
                "conversations": [
                    {"from": "system", "value": "be brief"},
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hello"},
                ]
            },
            msgs((S, "be brief"), (U, "hi"), (A, "hello")),
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"},
                ]
            },
            msgs((U, "a"), (A, "b"), (U, "c")),
        ),
        (
            {"instruction": "Sum", "input": "2 and 3", "output": "5"},
            msgs((U, "Sum\n\n2 and 3"), (A, "5")),
        ),
        ({"instruction": "Say hi", "input": "", "output": ""}, msgs((U, "Say hi"))),
        # arrow fills a column absent from a row with None: that must count as absent
        ({"messages": None, "turns": ["x"], "instruction": None}, msgs((U, "x"))),
    ],
)
def test_each_shape_normalises(row, expected):
    assert normalize_row(row) == expected


@pytest.mark.parametrize(
    "row, reason",
    [
        ({"messages": [{"content": "no role"}]}, "missing role"),
        ({"messages": [{"role": "user", "content": "  "}]}, "empty content"),
        ({"messages": [{"role": "user", "content": 3}]}, "must be a string"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "unsupported role"),
        ({"messages": "hello"}, "must be a list"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "no user message"),
        ({"messages": msgs((U, "a"), (S, "late"))}, "system message is only allowed first"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "unknown speaker"),
        ({"conversations": [{"value": "x"}]}, "missing role"),
        ({"turns": "not a list"}, "list of strings"),
        ({"turns": []}, "no messages"),
        ({"prompt_text": "x"}, "unknown row shape"),
        ("just a string", "row must be an object"),
    ],
)
def test_malformed_rows_say_why(row, reason):
    with pytest.raises(MalformedRow, match=reason):
        normalize_row(row)


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_jsonl_with_bad_rows_is_reported_not_fatal(tmp_path):
    f = tmp_path / "p.jsonl"
    _write_jsonl(
        f,
        [
            {"messages": [{"role": "user", "content": "fine"}]},
            {"messages": [{"role": "user", "content": 7}]},  # wrong type: arrow cannot unify
            "{not json",
            {"messages": [{"content": "no role"}]},
            {"conversations": [{"from": "human", "value": "ok too"}]},
        ],
    )
    ps = load_prompts(str(f))
    assert [r["index"] for r in ps.rows] == [0, 4]
    assert ps.rows[1]["messages"] == msgs((U, "ok too"))
    assert [(r.index, r.reason.split(":")[0]) for r in ps.rejected] == [
        (1, "message 0"),
        (2, "invalid JSON"),
        (3, "message 0"),
    ]
    assert "must be a string" in ps.rejected[0].reason
    assert "missing role" in ps.rejected[2].reason
    ps.write_rejected(tmp_path / "rej.jsonl")
    report = [json.loads(x) for x in (tmp_path / "rej.jsonl").read_text().splitlines()]
    assert [r["index"] for r in report] == [1, 2, 3] and all(r["reason"] for r in report)


def test_parquet_json_arrow_and_shared_turns(tmp_path):
    import datasets

    rows = [{"instruction": f"task {i}", "input": "", "output": f"done {i}"} for i in range(3)]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "a.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "a.json").write_text(json.dumps(rows))
    for src in ("a.parquet", "saved", "a.json"):
        ps = load_prompts(str(tmp_path / src))
        assert len(ps) == 3 and not ps.rejected, src
        assert ps.rows[2]["messages"] == msgs((U, "task 2"), (A, "done 2"))
    ps = load_prompts(str(tmp_path / "a.parquet"), limit=2)
    assert len(ps) == 2


def test_shared_prompt_files_load(tmp_path):
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bench"
    if not (bench / "mt-bench.jsonl").exists():
        pytest.skip("shared data not present on this machine")
    ps = load_prompts(str(bench / "mt-bench.jsonl"), limit=5)
    assert len(ps) == 5 and not ps.rejected
    assert [m["role"] for m in ps.rows[0]["messages"]] == [U, U]


def test_embedded_prompts_are_deterministic_and_split():
    train, test = embedded_prompts("train"), embedded_prompts("test")
    assert 300 <= len(train) <= 1000 and len(test) >= 40
    assert embedded_prompts("train") == train  # same process: cached pool, same sample
    train_fns = {(r["meta"]["module"], r["meta"]["function"]) for r in train}
    test_fns = {(r["meta"]["module"], r["meta"]["function"]) for r in test}
    assert not train_fns & test_fns
    kinds = {r["meta"]["kind"] for r in train}
    assert kinds == {"write", "explain", "complete"}
    for r in train + test:
        assert normalize_row(r) == r["messages"]
        assert len(r["messages"][0]["content"]) < 2000  # a few hundred tokens at most
    assert embedded_prompts("test", n=5) == embedded_prompts("test", n=5)
    with pytest.raises(ValueError, match="split"):
        embedded_prompts("validation")


def test_embedded_prompts_same_in_a_fresh_process():
    import subprocess
    import sys

    code = "from dspark.data.prompts.embedded import embedded_fingerprint as f;print(f('train'), f('test'))"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1] and len(runs[0].split()) == 2
    ps = load_prompts("embedded", split="test")
    assert len(ps) == len(embedded_prompts("test")) and ps.source == "embedded:test"


@pytest.mark.parametrize("source", ["missing.jsonl", "./missing", "/no/such/file.parquet"])
def test_missing_files_are_named_not_sent_to_the_hub(source):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts(source)


def test_row_selection_skips_filters_and_keeps_source_row_numbers(tmp_path):
    from dspark.data.prompts.prompt_set import RowSelection
    from dspark.errors import BadInputError

    src = ["gsm8k-train", "t0:x", "gsm8k-train", "t0:y", "gsm8k-train", "gsm8k-train"]
    rows = [{"turns": [f"q{i}"], "source": s} for i, s in enumerate(src)]
    rows[4] = {"turns": [], "source": "gsm8k-train"}  # matches the filter, then is rejected
    f = tmp_path / "mix.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for path in (str(f), str(tmp_path / "saved")):
        if path.endswith("saved"):
            import datasets

            datasets.Dataset.from_list(rows).save_to_disk(path)
        sel = RowSelection.parse(limit=2, skip=1, where=["source=gsm8k-train"])
        ps = load_prompts(path, selection=sel)
        # rows 2 and 4 match after row 1; row 4 is rejected and still counts toward the limit
        assert [r["index"] for r in ps.rows] == [2] and [r.index for r in ps.rejected] == [4]
        assert ps.source.endswith("from row 1 where source=gsm8k-train")
        everything = load_prompts(path, selection=RowSelection.parse(where=["source=t0:y"]))
        assert [r["index"] for r in everything.rows] == [3]
        assert load_prompts(path, limit=3).source == load_prompts(path).source  # plain limit
        with pytest.raises(BadInputError, match="no row .* has a field 'kind'"):
            load_prompts(path, selection=RowSelection.parse(where=["kind=math"]))
    with pytest.raises(BadInputError, match="--skip 6: .* has only 6 rows"):
        load_prompts(str(f), selection=RowSelection.parse(skip=6, where=["source=t0:x"]))
    with pytest.raises(BadInputError, match="KEY=VALUE"):
        RowSelection.parse(where=["source"])
