"""One prompt list from several sources, proportional at every prefix: the first N rows of a
mix hold each source's weighted share of N (within one row), so a data build that answers the
mix in order can stop, or be cut for a smaller point of a data-size curve, anywhere and still
be the same mix.

`interleave` is a weighted round robin by deficit: row k goes to the source furthest behind its
share (`weight * k - taken`, ties to the earlier source); a source that runs out leaves, and the
rest share its place by their weights. Deterministic: no randomness, the sources' own orders
kept.

A source still being built (`growing`: a Magpie set that only grows at its end) may not run out:
when it does, the shares of every later row depend on how long it will grow, so the mix stops
there. Built again once the source has grown, it extends the earlier mix at its end.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def interleave(
    sources: Sequence[tuple[str, Sequence[dict], float]], growing: Collection[str] = ()
) -> list[dict]:
    """`[(name, rows, weight)]` -> rows tagged `{"mix_source": name, "mix_row": i}`; it stops
    where a source named in `growing` runs out."""
    if not sources or any(w <= 0 for _, _, w in sources):
        raise ValueError("interleave needs sources with positive weights")
    total = {name: float(w) for name, _, w in sources}
    rows = {name: list(r) for name, r, _ in sources}
    taken = {name: 0 for name in rows}
    out: list[dict] = []
    while True:
        live = [n for n in rows if taken[n] < len(rows[n])]
        if not live or any(n in growing and taken[n] == len(rows[n]) for n in rows):
            return out
        norm = sum(total[n] for n in live)
        k = len(out) + 1
        # the live source furthest behind its share of the rows so far
        name = max(live, key=lambda n: total[n] / norm * k - taken[n])
        row = rows[name][taken[name]]
        out.append({**row, "mix_source": name, "mix_row": taken[name]})
        taken[name] += 1
