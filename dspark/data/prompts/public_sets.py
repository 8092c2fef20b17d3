"""The named public prompt sets: the bench sets and the training sets, by one short name.

Plain data and pure converters (no I/O; `named_sets` loads them). Each set is a hub dataset
(id, config, split) whose rows `convert` turns into the project's prompt rows
`{"turns": ["user turn", ...]}`, exactly as the local copies are written, so a benchmark on
the hub set and one on a local copy give the same prompts (the maths sets end in the same
"reason step by step" instruction, HumanEval problems sit in the same code fence).

- bench sets (what `datasets=[...]` of the benchmark names): gsm8k, humaneval, mbpp, math500,
  mt-bench; a local folder holds them as `<name>.jsonl`;
- training sets (what `--input` names): gsm8k-train, self-instruct-seed; a
  local folder holds them as `<name>.jsonl`, or as the rows of `train_mix.jsonl` whose
  `source` is the name. `train_mix` itself (those two plus prompts of T0 task templates) is
  local only: its T0 part is a sample of P3 that the hub does not serve in this form.

docs/datasets.md lists each set with its licence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The instruction the maths sets end in (the reference evaluator's prompt format).
REASON_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
# HumanEval's problem goes in a python code fence after this line.
HUMANEVAL_PREFIX = (
    "Write a solution to the following problem and make sure that it passes the tests:"
)
TRAIN_MIX = "train_mix"  # the local mixed training file, train_mix.jsonl


class HubRowError(ValueError):
    """A hub row without the fields its set's converter reads (the hub schema changed)."""


def _text(row: dict, key: str, name: str) -> str:
    value = row.get(key) if isinstance(row, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise HubRowError(f"{name}: a row has no text under {key!r} (got {str(row)[:120]!r})")
    return value


def gsm8k_turns(row: dict) -> list[str]:
    """openai/gsm8k (main): `question` + the reasoning instruction."""
    return [_text(row, "question", "gsm8k") + REASON_SUFFIX]


def math500_turns(row: dict) -> list[str]:
    """HuggingFaceH4/MATH-500: `problem` + the reasoning instruction."""
    return [_text(row, "problem", "math500") + REASON_SUFFIX]


def humaneval_turns(row: dict) -> list[str]:
    """openai/openai_humaneval: the function `prompt` (signature + docstring) in a code fence."""
    return [f"{HUMANEVAL_PREFIX}\n```python\n{_text(row, 'prompt', 'humaneval')}\n```"]


def mbpp_turns(row: dict) -> list[str]:
    """google-research-datasets/mbpp (sanitized): the task description `prompt` (the full
    config's rows call it `text`)."""
    key = "prompt" if isinstance(row, dict) and "prompt" in row else "text"
    return [_text(row, key, "mbpp")]


def mt_bench_turns(row: dict) -> list[str]:
    """HuggingFaceH4/mt_bench_prompts: both user turns under `prompt` (FastChat's
    question.jsonl and its copies call them `turns`)."""
    turns = row.get("prompt", row.get("turns")) if isinstance(row, dict) else None
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise HubRowError(f"mt-bench: a row has no list of turns (got {str(row)[:120]!r})")
    return list(turns)


def self_instruct_turns(row: dict) -> list[str]:
    """HuggingFaceH4/self-instruct-seed: the `instruction`, then its first instance's `input`
    after a blank line when there is one (the Alpaca join of `rows.normalize_row`)."""
    instruction = _text(row, "instruction", "self-instruct-seed")
    instances = row.get("instances") or []
    extra = instances[0].get("input") if instances and isinstance(instances[0], dict) else None
    if isinstance(extra, str) and extra.strip():
        return [f"{instruction}\n\n{extra}"]
    return [instruction]


@dataclass(frozen=True)
class PublicSet:
    name: str
    kind: str  # "bench" (the benchmark's datasets=[...]) | "train" (--input)
    hub_id: str
    split: str
    convert: Callable[[dict], list[str]]  # a hub row -> its user turns
    rows: int  # rows of the hub split (and of the local copy)
    licence: str
    about: str
    config: str | None = None

    @property
    def file(self) -> str:
        """The local copy's file name in a bench / prompts folder."""
        return f"{self.name}.jsonl"

    @property
    def hub(self) -> str:
        """`id (config) split`, as messages and docs name it."""
        return f"{self.hub_id}" + (f" ({self.config})" if self.config else "") + f" {self.split}"


PUBLIC_SETS: dict[str, PublicSet] = {
    s.name: s
    for s in (
        PublicSet(
            "gsm8k", "bench", "openai/gsm8k", "test", gsm8k_turns, 1319, "MIT",
            "grade-school maths word problems", config="main",
        ),
        PublicSet(
            "humaneval", "bench", "openai/openai_humaneval", "test", humaneval_turns, 164,
            "MIT", "Python functions from a signature and docstring",
        ),
        PublicSet(
            "mbpp", "bench", "google-research-datasets/mbpp", "test", mbpp_turns, 257,
            "CC-BY-4.0", "basic Python tasks (the hand-verified subset)", config="sanitized",
        ),
        PublicSet(
            "math500", "bench", "HuggingFaceH4/MATH-500", "test", math500_turns, 500, "MIT",
            "competition maths problems",
        ),
        PublicSet(
            "mt-bench", "bench", "HuggingFaceH4/mt_bench_prompts", "train", mt_bench_turns, 80,
            "Apache-2.0", "two-turn chats over 8 categories",
        ),
        PublicSet(
            "gsm8k-train", "train", "openai/gsm8k", "train", gsm8k_turns, 7473, "MIT",
            "GSM8K training questions", config="main",
        ),
        PublicSet(
            "self-instruct-seed", "train", "HuggingFaceH4/self-instruct-seed", "train",
            self_instruct_turns, 175, "Apache-2.0", "the 175 human-written self-instruct tasks",
        ),
    )
}  # fmt: skip

BENCH_SETS = tuple(n for n, s in PUBLIC_SETS.items() if s.kind == "bench")
TRAIN_SETS = tuple(n for n, s in PUBLIC_SETS.items() if s.kind == "train")


def to_prompt_row(spec: PublicSet, row: dict) -> dict:
    """A hub row as the project's prompt row `{"turns": [...]}`."""
    return {"turns": spec.convert(row)}
