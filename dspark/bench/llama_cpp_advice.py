"""What to serve with on this machine, from an engine benchmark's results: the draft's best
mode when it beats plain decoding, else n-gram speculation when that does, else plain decoding,
with the numbers that say why. Pure functions over `llama_cpp_report.bench`'s results.
"""

from __future__ import annotations


def recommendation(results: dict) -> dict:
    """What to serve with on this machine: the draft-dspark mode with the best mean speedup
    over the sets when it beats plain decoding; else n-gram speculation when that does, else
    plain decoding, with the numbers that say why (the draft's tau against the tau its round
    needs to break even, which is what a better draft must reach)."""

    def mean(rows_by_set, name, key):
        vals = [r.get(key) for rows in rows_by_set for r in rows if r["name"] == name]
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if len(vals) == len(rows_by_set) and vals else None

    sets = list(results["datasets"].values())
    names = {r["name"]: r["mode"]["spec"] for rows in sets for r in rows}
    scored = {n: mean(sets, n, "speedup_vs_plain") for n, spec in names.items() if spec != "none"}
    dspark = [n for n in scored if names[n] == "draft-dspark" and scored[n] is not None]
    ngram = [n for n in scored if names[n] == "ngram-mod" and scored[n] is not None]
    best = max(dspark, key=lambda n: scored[n] or 0.0) if dspark else None
    out: dict = {"best_dspark": best, "best_dspark_speedup": scored.get(best) if best else None}
    if best:
        out["tau"] = mean(sets, best, "tau")
        out["break_even_tau"] = mean(sets, best, "break_even_tau")
    top_ngram = max(ngram, key=lambda n: scored[n] or 0.0) if ngram else None
    if best and (scored[best] or 0.0) > 1.0:
        out["serve"] = best
        out["why"] = f"{best} is {scored[best]:.2f}x plain decoding (mean over the sets)"
    elif top_ngram and (scored[top_ngram] or 0.0) > 1.0:
        out["serve"] = top_ngram
        out["why"] = f"{top_ngram} is {scored[top_ngram]:.2f}x plain decoding; the draft loses"
    else:
        out["serve"] = "plain"
        out["why"] = "no speculative mode beat plain decoding here"
    if best and out["serve"] != best and out.get("tau") and out.get("break_even_tau"):
        out["why"] += (
            f": the draft's best mode ({best}) reaches tau {out['tau']:.2f}, and its round costs "
            f"{out['break_even_tau']:.2f} plain steps, the tau it needs to break even"
        )
    return out
