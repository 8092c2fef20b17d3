"""How varied a prompt set is, in figures a reader can compare across sets and sizes.

- `first_words`: distinct first words (lower-cased) over rows, and the most common ten: a
  generator stuck in one register ("Write ...", "What ...") shows here first;
- `trigrams`: distinct word 3-grams over all 3-grams of the set (1.0: no phrase repeats);
- `words`: the length distribution in words (10th, 50th, 90th percentile, max) and
  `chars_p50`.
Words are the lower-cased runs of letters, digits and apostrophes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"[\w']+")


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    """The nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def prompt_diversity(texts: Sequence[str]) -> dict:
    """The figures of the module docstring for `texts` (one user turn each)."""
    words = [_WORD.findall(t.lower()) for t in texts]
    firsts = Counter(w[0] for w in words if w)
    grams = [tuple(w[i : i + 3]) for w in words for i in range(len(w) - 2)]
    lengths = sorted(len(w) for w in words)
    chars = sorted(len(t) for t in texts)
    return {
        "rows": len(texts),
        "first_words": {
            "distinct": len(firsts),
            "share": round(len(firsts) / max(len(texts), 1), 4),
            "top": dict(firsts.most_common(10)),
        },
        "trigrams": {
            "distinct": len(set(grams)),
            "total": len(grams),
            "share": round(len(set(grams)) / max(len(grams), 1), 4),
        },
        "words": {q: _percentile(lengths, p) for q, p in (("p10", 10), ("p50", 50), ("p90", 90))}
        | {"max": lengths[-1] if lengths else 0},
        "chars_p50": _percentile(chars, 50),
    }
