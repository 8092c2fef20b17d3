"""Benchmark prompt sets: `{"turns": [...]}` JSONL files and the embedded held-out split.

A prompt set is a list of conversations; a conversation is its list of user turns. The
benchmark renders them through the target's chat template (`add_generation_prompt=True`),
either the first turn only or every turn with the target's own earlier answers fed back.

A bench set is read from a local folder when one holds `<name>.jsonl`, found in this order
(`find_bench_dir`):
1. the explicit argument (`bench_dir=` of the benchmark config, `--bench-dir` of the scripts);
2. `$DSPARK_BENCH_DIR`.
An explicit folder (1, 2) must exist. A public set (gsm8k, humaneval, mbpp, math500, mt-bench:
`dspark.data.prompts.public_sets.BENCH_SETS`, docs/datasets.md) that no folder holds comes from
the hub through `datasets`, converted to the same turns.
"""

from __future__ import annotations

from pathlib import Path

from dspark.data.prompts.embedded import embedded_prompts
from dspark.data.prompts.named_sets import bench_turns, read_prompt_file
from dspark.data.prompts.public_sets import BENCH_SETS
from dspark.errors import BadInputError, MissingPathError
from dspark.paths import BENCH_ENV, bench_dir_or_none

EMBEDDED = "embedded"  # the name of the project's own held-out prompt set in `datasets`


def find_bench_dir(bench_dir: str | Path | None = None) -> Path:
    """The bench-set folder by the search order of the module docstring
    (`dspark.paths.bench_dir_or_none`), or a `MissingPathError` that names
    `$DSPARK_BENCH_DIR` and the places searched."""
    path = bench_dir_or_none(bench_dir, "bench_dir")
    if path is not None:
        return path
    raise MissingPathError(
        "no bench-set folder found: set $DSPARK_BENCH_DIR (or bench_dir= / --bench-dir) to the "
        f"folder of the bench sets (gsm8k.jsonl, mt-bench.jsonl, ...), or name a public set "
        f"({', '.join(BENCH_SETS)}) to read it from the hub"
    )


def _local_bench_dir(bench_dir: str | Path | None) -> Path | None:
    """The bench folder when one is given or found (an explicit one must exist), else None."""
    return bench_dir_or_none(bench_dir, "bench_dir")


def load_turns(path: str | Path, limit: int | None = None) -> list[list[str]]:
    """Read a `{"turns": ["user turn", ...]}` JSONL file into a list of turn lists."""
    return [list(row["turns"]) for row in read_prompt_file(path, limit=limit)]


def load_embedded(limit: int | None = None) -> list[list[str]]:
    """The project's embedded default prompt set, held-out (test) split, as turn lists."""
    rows = embedded_prompts(split="test", n=limit)
    return [_as_turns(row) for row in rows]


def _as_turns(row) -> list[str]:
    """Accept the shapes a prompt row comes in: a string, a turn list, or a dict."""
    if isinstance(row, str):
        return [row]
    if isinstance(row, dict):
        if "turns" in row:
            return list(row["turns"])
        if "messages" in row:
            return [m["content"] for m in row["messages"] if m.get("role") == "user"]
        if "prompt" in row:
            return [row["prompt"]]
    if isinstance(row, (list, tuple)) and all(isinstance(t, str) for t in row):
        return list(row)
    raise ValueError(f"cannot read user turns from prompt row {str(row)[:120]!r}")


def dataset_path(name: str, bench_dir: str | Path | None) -> Path | None:
    """The local JSONL file of the prompt set `name` (not `embedded`); None for a public set
    that no folder holds (it comes from the hub); else a `UserError` that lists the names."""
    root = _local_bench_dir(bench_dir)
    path = root / f"{name}.jsonl" if root is not None else None
    if path is not None and path.is_file():
        return path
    if name in BENCH_SETS:
        return None
    found = sorted(p.stem for p in root.glob("*.jsonl")) if root is not None else []
    known = sorted(set(found) | set(BENCH_SETS)) + [EMBEDDED]
    raise MissingPathError(
        f"datasets: no prompt set {name!r}. Known names: {', '.join(known)}; or set "
        f"bench_dir= (or ${BENCH_ENV}) to the folder that holds {name}.jsonl."
    )


def check_datasets(names: list[str], bench_dir: str | Path | None) -> None:
    """Refuse an empty `datasets`, a repeated name or one with no prompt set (before any
    model is loaded)."""
    if not names:
        raise BadInputError(
            f"datasets is empty; name at least one, e.g. datasets=[gsm8k] or [{EMBEDDED}]"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BadInputError(f"datasets names {repeated} more than once; list each set once")
    for name in names:
        if name != EMBEDDED:
            dataset_path(name, bench_dir)


def load_dataset(name: str, bench_dir: str | Path | None, limit: int | None) -> list[list[str]]:
    """`embedded`, the stem of a JSONL file in the bench folder, or a public set from the hub."""
    if name == EMBEDDED:
        return load_embedded(limit)
    path = dataset_path(name, bench_dir)
    if path is None:
        return bench_turns(name, bench_dir, limit)
    return load_turns(path, limit)


def render(tokenizer, turns: list[str], answers: list[str], system_prompt: str | None = None):
    """Token ids of the chat up to user turn `len(answers)`, ending in the generation prompt.

    `answers[i]` is the assistant's reply to `turns[i]`; the prompt asks for the reply to
    `turns[len(answers)]`.
    """
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for user, assistant in zip(turns, answers):
        messages += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": assistant},
        ]
    messages.append({"role": "user", "content": turns[len(answers)]})
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if hasattr(ids, "keys"):  # some versions return a BatchEncoding regardless
        ids = ids["input_ids"]
    return [int(t) for t in ids]
