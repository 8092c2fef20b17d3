"""A prompt mix is proportional at every prefix, deterministic, and loses no row."""

import pytest

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
