"""A prompt mix is proportional at every prefix, deterministic, and loses no row."""

import pytest

from dspark.data.build_status import mix_sources_path
from dspark.data.prompts.mix import interleave


def _rows(name, n):
    return [{"turns": [f"{name}{i}"]} for i in range(n)]


def test_every_prefix_holds_each_share_within_one_row():
    mix = interleave([("chat", _rows("c", 600), 3.0), ("math", _rows("m", 400), 2.0),
                      ("code", _rows("k", 200), 1.0)])  # fmt: skip
    for n in range(1, 1201):
        head = mix[:n]
        for name, share in (("chat", 0.5), ("math", 1 / 3), ("code", 1 / 6)):
            got = sum(r["mix_source"] == name for r in head)
            assert abs(got - share * n) <= 1, (n, name, got)
    # each source's rows in their own order, none lost, none twice
    for name, prefix in (("chat", "c"), ("math", "m"), ("code", "k")):
        mine = [r for r in mix if r["mix_source"] == name]
        assert [r["turns"][0] for r in mine] == [f"{prefix}{i}" for i in range(len(mine))]
    assert len(mix) == 1200
    assert mix[:6] == interleave([("chat", _rows("c", 600), 3.0), ("math", _rows("m", 400), 2.0),
                                  ("code", _rows("k", 200), 1.0)])[:6]  # fmt: skip


def test_a_source_that_runs_out_leaves_its_place_to_the_rest():
    mix = interleave([("a", _rows("a", 2), 1.0), ("b", _rows("b", 10), 1.0)])
    assert [r["mix_source"] for r in mix] == ["a", "b", "a"] + ["b"] * 9
    with pytest.raises(ValueError, match="positive weights"):
        interleave([("a", _rows("a", 2), 0.0)])


def test_the_script_grows_a_mix_at_its_end_and_refuses_to_change_it(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    for name, n in (("a", 50), ("b", 50)):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"turns": [f"{name}{i}"]}) + "\n" for i in range(n))
        )
    out = tmp_path / "mix.jsonl"

    def mix(*sources):
        args = [a for s in sources for a in ("--source", s)]
        return subprocess.run(
            [sys.executable, str(repo / "data_scripts" / "mix_prompts.py"), *args, "--output",
             str(out)], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(repo)},
        )  # fmt: skip

    a, b = f"a={tmp_path / 'a.jsonl'}", f"b={tmp_path / 'b.jsonl'}"
    assert mix(f"{a}:1:10", f"{b}:1:10").returncode == 0
    first = out.read_text()
    assert mix(f"{a}:1:20", f"{b}:1:20").returncode == 0  # both longer: the old mix is a prefix
    assert out.read_text().startswith(first) and len(out.read_text().splitlines()) == 40
    res = mix(f"{a}:2:20", f"{b}:1:20")  # other weights: rows would move
    assert res.returncode == 2 and "holds another mix" in res.stderr
    assert len(out.read_text().splitlines()) == 40  # untouched


def test_a_growing_source_stops_the_mix_where_it_runs_out_and_the_grown_mix_extends_it():
    def mix(chat_rows, growing=("chat",)):
        return interleave([("chat", _rows("c", chat_rows), 3.0), ("math", _rows("m", 50), 1.0)],
                          growing)  # fmt: skip

    short = mix(12)
    assert sum(r["mix_source"] == "chat" for r in short) == 12  # every chat row it had
    assert len(short) == 12 + 4  # and stopped before the rows that need more chat
    for n in (20, 40, 75):
        assert mix(n)[: len(short)] == short  # grown: the earlier mix is a prefix
    assert mix(40, growing=())[: len(mix(40))] == mix(40)
    # a finished source runs out and the rest take its place (the mix is final)
    assert len(mix(12, growing=())) == 62


def test_the_script_treats_an_unfinished_magpie_set_as_growing(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    chat = tmp_path / "magpie" / "prompts.jsonl"
    chat.parent.mkdir()
    math = tmp_path / "math.jsonl"
    math.write_text("".join(json.dumps({"turns": [f"m{i}"]}) + "\n" for i in range(50)))
    out = tmp_path / "mix.jsonl"

    def build(n: int, complete: bool) -> list[str]:
        chat.write_text("".join(json.dumps({"turns": [f"c{i}"]}) + "\n" for i in range(n)))
        (chat.parent / "summary.json").write_text(json.dumps({"complete": complete}))
        res = subprocess.run(
            [sys.executable, str(repo / "data_scripts" / "mix_prompts.py"), "--source",
             f"chat={chat}:1", "--source", f"math={math}:1", "--output", str(out)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo)},
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        return out.read_text().splitlines()

    first = build(5, complete=False)
    assert len(first) == 9  # c0 m0 ... m3 c4: the next row would need to know chat's length
    # the sources it mixed, listed for build_status.py's projection of the mix
    listed = json.loads(mix_sources_path(out).read_text())
    assert listed["rows"] == 9
    chat_src, math_src = listed["sources"]
    assert chat_src["growing"] and chat_src["rows"] == 5 and chat_src["weight"] == 1.0
    assert chat_src["prompt_set"] == str(chat.parent.resolve())
    assert not math_src["growing"] and math_src["rows"] == 50 and math_src["prompt_set"] is None
    grown = build(20, complete=False)
    assert grown[:9] == first and len(grown) == 39
    final = build(20, complete=True)
    assert final[:39] == grown and len(final) == 70  # finished: math fills the rest
