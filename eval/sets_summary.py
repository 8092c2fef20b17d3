"""One table of a draft benchmarked one bench set a run (`make smollm2-large`: DIR/<set>/ per
set, each an `eval/benchmark.py` output_dir): per set, tau, the speedup against the fastest
plain decoding its run measured, plain and DSpark tok/s, the dtype and verify length the run
decoded with, how many outputs equal plain greedy decoding, and the machine.

    python eval/sets_summary.py runs/smollm2-large/n24000

Writes DIR/summary.json and DIR/summary.md (each set's conditions as its run recorded them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import BadInputError, user_errors
from dspark.fileio import dumps_strict, write_text_atomic


def set_row(name: str, results: dict) -> dict:
    """The figures of one set's run (`results.json` of eval/benchmark.py)."""
    c = results.get("conditions") or {}
    ds = results["datasets"][name]
    speed, fastest = ds["speed"], ds["speed"].get("fastest_plain") or {}
    plain = fastest.get("plain_by_dtype") or {}
    plain_dtype = fastest.get("fastest_plain_dtype")
    match = speed.get("greedy_match")
    return {
        "set": name,
        "prompts": c.get("num_prompts"),
        "max_new_tokens": c.get("max_new_tokens"),
        "tau": ds["acceptance"]["tau"],
        "speedup": fastest.get("speedup_vs_fastest_plain", speed.get("speedup")),
        "plain_tok_s": plain.get(plain_dtype) if plain_dtype else None,
        "plain_dtype": plain_dtype,
        "dspark_tok_s": speed["speculative"]["tokens_per_s"],
        "dtype": c.get("dtype"),
        "verify_length": c.get("verify_length"),
        "equal": None if match is None else round(match * ds["requests"]),
        "requests": ds["requests"],
        "machine": c.get("device_name"),
        "threads": c.get("cpu_threads"),
    }


def read_sets(root: Path) -> list[dict]:
    rows = []
    for path in sorted(root.glob("*/results.json")):
        results = json.loads(path.read_text(encoding="utf-8"))
        if path.parent.name not in results.get("datasets", {}):
            raise BadInputError(f"{path} holds no set named {path.parent.name!r}: each folder "
                                "is one set's run (eval/benchmark.py datasets=[SET] "
                                "output_dir=DIR/SET)")  # fmt: skip
        rows.append(set_row(path.parent.name, results))
    if not rows:
        raise BadInputError(f"{root} holds no <set>/results.json: benchmark each set into its "
                            "own folder first (make smollm2-large)")  # fmt: skip
    return rows


def render(rows: list[dict]) -> str:
    def f(v, spec: str) -> str:
        return "" if v is None else format(v, spec)

    lines = ["| set | prompts x new tokens | tau | speedup | plain tok/s (dtype) | DSpark tok/s "
             "| dtype, L | equal to plain | machine, threads |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        equal = "" if r["equal"] is None else f"{r['equal']} of {r['requests']}"
        lines.append(
            f"| {r['set']} | {r['prompts']} x {r['max_new_tokens']} | {f(r['tau'], '.2f')} | "
            f"{f(r['speedup'], '.2f')}x | {f(r['plain_tok_s'], '.1f')} ({r['plain_dtype']}) | "
            f"{f(r['dspark_tok_s'], '.1f')} | {r['dtype']}, {r['verify_length']} | {equal} | "
            f"{r['machine']}, {r['threads']} |"
        )
    lines += ["", "speedup: DSpark tok/s over the fastest plain decoding its run measured (each "
              "dtype it tried); T=0, batch 1. L: the drafts a round verifies."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder holding one <set>/results.json per bench set")
    a = ap.parse_args(argv)
    with user_errors("sets_summary"):
        root = Path(a.root)
        rows = read_sets(root)
        write_text_atomic(root / "summary.json", dumps_strict({"sets": rows}, indent=2) + "\n")
        report = write_text_atomic(root / "summary.md", render(rows))
    print(report.read_text())


if __name__ == "__main__":
    main()
