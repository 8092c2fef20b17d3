"""Pure checks on generated user prompts: junk filters, deduplication, benchmark overlap.

Nothing here loads a model; every function is a deterministic function of its texts, so a
prompt set rebuilt from the same samples keeps and rejects the same rows.

- `junk_reason(text, ...)`: why a sampled prompt is junk (None when it is fine): empty, too
  short / long, unfinished (no end-of-turn), chat-template tokens left in it, non-printable
  characters, repeated lines or a looping word sequence, optionally not English.
- `normalize(text)`: the exact-duplicate key (NFKC, casefolded, words only, one space).
- `shingles(text)`: word 5-grams (a text under 5 words is one shingle of all its words).
- `NearDuplicateIndex`: exact Jaccard >= threshold among texts added so far, candidates from
  an inverted index over each text's rarest shingles (prefix filtering: two sets with
  Jaccard >= t share one of the first `n - ceil(t * n) + 1` shingles of each in a fixed global
  order), so no near duplicate is missed and none is claimed without the exact measure.
- `BenchOverlap`: a generated prompt that equals a bench prompt after `normalize`, or whose
  shingles overlap one by Jaccard or containment >= threshold, is contamination.
- `read_bench_texts(dir)`: every user turn of the `{"turns": [...]}` JSONL files of a bench
  folder (dspark/data must not import dspark/eval, so this small reader lives here).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from dspark.data.prompts.named_sets import read_prompt_file
from dspark.errors import BadInputError, MissingPathError
from dspark.paths import bench_dir_or_none

SHINGLE = 5
NEAR_THRESHOLD = 0.7
_WORD = re.compile(r"\w+")
_ALLOWED_CONTROL = {"\n", "\t", "\r"}
# Unicode categories that never belong in a user's message: controls, private use,
# unassigned code points, lone surrogates; U+FFFD marks bytes the tokenizer could not decode.
_BAD_CATEGORIES = {"Cc", "Co", "Cn", "Cs"}


def words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def normalize(text: str) -> str:
    """The exact-duplicate key: case, punctuation and spacing do not make a prompt new."""
    return " ".join(words(text))


def shingles(text: str, n: int = SHINGLE) -> frozenset[str]:
    w = words(text)
    if not w:
        return frozenset()
    if len(w) < n:
        return frozenset([" ".join(w)])
    return frozenset(" ".join(w[i : i + n]) for i in range(len(w) - n + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def _repetitive(text: str) -> bool:
    """Repeated lines (a line three times, or a third of the lines copies) or a word loop
    (under half the word 3-grams distinct in a text of 24+ words): sampling at T ~ 1 from a
    small model degenerates this way, and such a prompt teaches the draft nothing."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines:
        counts = Counter(lines)
        if max(counts.values()) >= 3 or (len(lines) >= 3 and len(counts) / len(lines) < 0.67):
            return True
    w = words(text)
    if len(w) >= 24:
        grams = [tuple(w[i : i + 3]) for i in range(len(w) - 2)]
        if len(set(grams)) / len(grams) < 0.5:
            return True
    return False


def _non_printable(text: str) -> bool:
    return "\ufffd" in text or any(
        unicodedata.category(c) in _BAD_CATEGORIES and c not in _ALLOWED_CONTROL for c in text
    )


def _latin_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 1.0
    return sum(c.isascii() for c in letters) / len(letters)


def junk_reason(
    text: str,
    *,
    finished: bool = True,
    markers: Iterable[str] = (),
    min_chars: int = 12,
    max_chars: int = 4000,
    min_words: int = 3,
    language: str | None = None,
) -> str | None:
    """The first reason `text` is unusable as a prompt, or None.

    `finished`: the sample ended at the end-of-turn token (a cut-off question is half a
    question); `markers`: the chat template's special-token strings, none of which may be
    left in a user message; `language="en"`: at least 80% of the letters are ASCII (a cheap
    heuristic, off by default)."""
    body = text.strip()
    if not body:
        return "empty"
    if not finished:
        return "unfinished"
    if any(m and m in body for m in markers):
        return "template_token"
    if _non_printable(body):
        return "non_printable"
    if len(body) < min_chars or len(words(body)) < min_words:
        return "too_short"
    if len(body) > max_chars:
        return "too_long"
    if _repetitive(body):
        return "repetitive"
    if language is not None:
        if language != "en":
            raise BadInputError(f"--language {language!r}: only `en` has a heuristic; omit it")
        if _latin_share(body) < 0.8:
            return "not_english"
    return None


class NearDuplicateIndex:
    """Texts added so far, queried for one with Jaccard >= `threshold` (word shingles).

    The global shingle order (rarest first, ties by the shingle) comes from `frequencies`,
    the document frequency of each shingle over every text that will be queried: prefix
    filtering is exact only when all sets are sorted the same way."""

    def __init__(self, frequencies: Counter, threshold: float = NEAR_THRESHOLD):
        if not 0 < threshold <= 1:
            raise BadInputError(f"near-duplicate threshold {threshold}: must be in (0, 1]")
        self.freq, self.t = frequencies, threshold
        self.sets: list[frozenset[str]] = []
        self.postings: dict[str, list[int]] = defaultdict(list)

    def _prefix(self, s: frozenset[str]) -> list[str]:
        ordered = sorted(s, key=lambda g: (self.freq.get(g, 0), g))
        return ordered[: len(s) - math.ceil(self.t * len(s)) + 1]

    def find(self, s: frozenset[str]) -> tuple[int, float] | None:
        """`(id, jaccard)` of the most similar indexed text at or above the threshold."""
        best: tuple[int, float] | None = None
        seen: set[int] = set()
        for g in self._prefix(s):
            for i in self.postings.get(g, ()):
                if i in seen:
                    continue
                seen.add(i)
                j = jaccard(s, self.sets[i])
                if j >= self.t and (best is None or j > best[1]):
                    best = (i, j)
        return best

    def add(self, s: frozenset[str]) -> int:
        i = len(self.sets)
        self.sets.append(s)
        for g in self._prefix(s):
            self.postings[g].append(i)
        return i


class BenchOverlap:
    """Which bench prompt (if any) a text copies: exact after `normalize`, or shingle
    Jaccard >= threshold, or containment >= threshold of the smaller in the larger (a bench
    question without its "reason step by step" suffix, or one pasted into a longer message;
    only sets of 3+ shingles, so a short common phrase is not contamination)."""

    def __init__(self, texts: Iterable[tuple[str, str]], threshold: float = NEAR_THRESHOLD):
        self.t = threshold
        self.names: list[str] = []
        self.sets: list[frozenset[str]] = []
        self.exact: dict[str, int] = {}
        self.postings: dict[str, list[int]] = defaultdict(list)
        for name, text in texts:
            i = len(self.names)
            self.names.append(name)
            s = shingles(text)
            self.sets.append(s)
            self.exact.setdefault(normalize(text), i)
            for g in s:
                self.postings[g].append(i)

    def __len__(self) -> int:
        return len(self.names)

    def match(self, text: str) -> tuple[str, str, float] | None:
        """`(bench set, "exact" | "jaccard" | "containment", score)` or None."""
        key = normalize(text)
        if key in self.exact:
            return self.names[self.exact[key]], "exact", 1.0
        s = shingles(text)
        shared: Counter = Counter()
        for g in s:
            shared.update(self.postings.get(g, ()))
        best: tuple[str, str, float] | None = None
        for i, inter in shared.items():
            b = self.sets[i]
            scores = [("jaccard", inter / (len(s) + len(b) - inter))]
            small = min(len(s), len(b))
            if small >= 3:
                scores.append(("containment", inter / small))
            for kind, score in scores:
                if score >= self.t and (best is None or score > best[2]):
                    best = (self.names[i], kind, score)
        return best


def read_bench_texts(bench_dir: str | Path) -> list[tuple[str, str]]:
    """`(set name, user turn)` for every turn of every `*.jsonl` bench set in `bench_dir`."""
    root = Path(bench_dir).expanduser()
    if not root.is_dir():
        raise MissingPathError(
            f"--bench-dir {bench_dir}: no such directory; point it (or $DSPARK_BENCH_DIR) at "
            "the folder of the bench sets (gsm8k.jsonl, mt-bench.jsonl, ...)"
        )
    files = sorted(root.glob("*.jsonl"))
    if not files:
        raise BadInputError(
            f"--bench-dir {bench_dir} holds no *.jsonl bench set; point it at the folder of "
            "the bench sets (gsm8k.jsonl, mt-bench.jsonl, ...)"
        )

    return [
        (path.stem, t) for path in files for row in read_prompt_file(path) for t in row["turns"]
    ]


def find_bench_dir(given: str | None = None) -> Path | None:
    """The bench folder to check against: `given` (`--bench-dir`), else `$DSPARK_BENCH_DIR`
    (both must exist), else `../shared/data/bench` from the current directory or beside the
    checkout when one exists, else None (a fresh machine holds no bench sets to copy)."""
    return bench_dir_or_none(given, "--bench-dir")
