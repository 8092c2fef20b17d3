"""What a draft costs inside llama.cpp, per export: its tensors by part, read from the GGUF
itself, against the draft's work per round fitted to modes measured in llama.cpp.

Parts (llama.cpp's tensor names, `dspark/export/gguf_names.py`):
- `features in`: `fc` and its norm, which fold the target's hidden states of each accepted
  token into the draft's width (once per context token, not per drafted slot);
- `backbone`: the draft's decoder layers and final norm (every slot of the block);
- `lm_head`: `output.weight` over the kept ids (every slot);
- `markov`: the Markov head, `markov_w1` a table looked up by the previous token and
  `markov_w2` a matmul into the kept ids (every slot);
- `confidence`: the confidence head (every slot);
- `embedding`: `token_embd`, a lookup.
A slot's matmul work is about two flops per weight of the parts it multiplies through
(backbone, lm_head, `markov_w2`, confidence): `slot_share` says which part dominates it.

Measured work: per export, llama.cpp runs plain decoding and the probe modes of a cost fit
(`llama_cpp_tune.tune_modes(..., "model")`) on the same prompts, interleaved, and
`llama_cpp_flags.fit_round_cost` splits a round into the plain step, the draft's work (`base`
+ `per_slot * n_max`) and the target's verify work per drafted token. The choice is the export
with the least draft work per round among those whose tau at `n_max` 1 is within
`TAU_TOLERANCE` of the best (equal acceptance, cheaper round).

llama.cpp also times the draft's block decode itself (`NativeServer.draft_timer`, its own
statistics read from the server's log): a direct measure beside the fit. The fit's `base +
per_slot` holds whatever a round costs beyond llama-bench's verify curve, the target's share
too: the server's verify pass outputs logits for every drafted row, llama-bench's pass for the
last row only.
"""

from __future__ import annotations

import os
from typing import Any

from dspark.bench import llama_cpp_flags as flags
from dspark.bench.llama_cpp import Mode, ModeRun, pooled

PARTS = ("features in", "backbone", "lm_head", "markov", "confidence", "embedding")
# parts every drafted slot multiplies through (lookups and the per-context-token fc excluded)
SLOT_MATMUL = {"backbone", "lm_head", "confidence"}
TAU_TOLERANCE = 0.02  # relative: exports whose tau at n_max 1 is this close count as equal


def part_of(name: str) -> str | None:
    """The part a draft GGUF tensor belongs to, or None for non-weights (`d2t`)."""
    if name.startswith(("fc.", "enc.")):
        return "features in"
    if name.startswith("blk.") or name == "output_norm.weight":
        return "backbone"
    if name == "output.weight":
        return "lm_head"
    if name.startswith("markov_"):
        return "markov"
    if name.startswith("conf_"):
        return "confidence"
    if name == "token_embd.weight":
        return "embedding"
    return None


def tensor_parts(gguf_path: str | os.PathLike) -> dict[str, dict]:
    """`{part: {params, bytes, slot_matmul_params}}` of a draft GGUF, and its file types."""
    import gguf  # optional: gguf

    reader = gguf.GGUFReader(str(gguf_path))
    out: dict[str, dict[str, Any]] = {
        p: {"params": 0, "bytes": 0, "slot_matmul_params": 0, "types": set()} for p in PARTS
    }
    for t in reader.tensors:
        part = part_of(t.name)
        if part is None:
            continue
        row = out[part]
        row["params"] += int(t.n_elements)
        row["bytes"] += int(t.n_bytes)
        row["types"].add(t.tensor_type.name)
        # markov_w1 is looked up by the previous token; markov_w2 is multiplied per slot
        if part in SLOT_MATMUL or t.name.startswith("markov_w2"):
            if len(t.shape) > 1:  # a weight matrix (norms and biases are elementwise)
                row["slot_matmul_params"] += int(t.n_elements)
    total = sum(r["slot_matmul_params"] for r in out.values()) or 1
    for r in out.values():
        r["slot_share"] = r["slot_matmul_params"] / total
        r["types"] = sorted(r["types"])
    return out


def add_timers(total: dict[str, dict], timers: dict[str, dict]) -> None:
    """Sum llama.cpp's draft timers (`run_modes(draft_timers=...)`) of one pass into `total`."""
    for name, t in timers.items():
        row = total.setdefault(name, {"draft_calls": 0, "draft_ms": 0.0})
        row["draft_calls"] += t["draft_calls"]
        row["draft_ms"] += t["draft_ms"]


def timed_block_ms(timers: dict[str, dict], mode: Mode) -> float | None:
    """llama.cpp's own milliseconds per block draft of `mode`, if it was timed."""
    t = timers.get(mode.name)
    return t["draft_ms"] / t["draft_calls"] if t and t["draft_calls"] else None


def measured_row(name: str, parts: dict, runs: dict[str, dict[str, ModeRun]],
                 probes: list[Mode], timers: dict[str, dict] | None = None) -> dict:  # fmt: skip
    """One export: its modes' figures, the fitted round cost, llama.cpp's own timer of the
    block draft per mode (with `timers`), and the draft's share of a round at `n_max` 1 with
    that mode's measured drafts per round."""
    plain = pooled(runs, Mode("none"))
    step_ms = 1e3 * plain.seconds / plain.tokens
    grid = []
    for mode in probes:
        run = pooled(runs, mode)
        s = run.summary(plain)
        block_ms = timed_block_ms(timers or {}, mode)
        share = block_ms / s["round_ms"] if block_ms is not None and s["round_ms"] else None
        grid.append({"n_max": mode.n_max, "p_min": mode.p_min, "rounds": run.rounds,
                     "drafted": run.drafted, "decode_ms": 1e3 * run.seconds,
                     "tau": s["tau"], "tokens_per_s": s["tokens_per_s"],
                     "speedup": s.get("speedup_vs_plain"), "round_ms": s["round_ms"],
                     "timed_block_ms": block_ms, "timed_block_share": share})  # fmt: skip
    cost = flags.fit_round_cost(grid, step_ms)
    one = min(grid, key=lambda g: (g["n_max"], g["p_min"]))  # n_max 1, p_min 0 where probed
    drafted = one["drafted"] / max(one["rounds"], 1)
    draft_ms = cost.base_ms + cost.per_slot_ms * one["n_max"]
    round_ms = cost.round_ms(one["n_max"], drafted)
    return {
        "export": name,
        "parts": parts,
        "draft_bytes": sum(p["bytes"] for p in parts.values()),
        "plain_tokens_per_s": plain.tokens / plain.seconds,
        "plain_step_ms": step_ms,
        "grid": grid,
        "cost": cost.as_dict(),
        "n_max_1": {
            "n_max": one["n_max"],
            "p_min": one["p_min"],
            "tau": one["tau"],
            "drafted_per_round": drafted,
            "draft_ms": draft_ms,
            "round_ms": round_ms,
            "draft_share": draft_ms / round_ms,
            "break_even_tau": round_ms / step_ms,
            "speedup": one["speedup"],
        },
    }


def choose(rows: list[dict], tolerance: float = TAU_TOLERANCE) -> dict:
    """The export with the least draft work per round among those of near-best tau."""
    best_tau = max(r["n_max_1"]["tau"] or 0.0 for r in rows)
    equal = [r for r in rows if (r["n_max_1"]["tau"] or 0.0) >= (1 - tolerance) * best_tau]
    return min(equal, key=lambda r: r["n_max_1"]["draft_ms"])


def _x(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def render(rows: list[dict], chosen: dict, conditions: dict) -> str:
    """The Markdown report: parts per export, then the measured round split and the choice."""
    cond = ", ".join(f"{k} {v}" for k, v in conditions.items())
    lines = ["# The draft's work per round in llama.cpp, per export", "", cond, "",
             "| export | part | params | bytes | types | share of a slot's matmuls |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for part, p in r["parts"].items():
            if p["params"]:
                lines.append(f"| {r['export']} | {part} | {p['params']:,} | {p['bytes']:,} | "
                             f"{'/'.join(p['types'])} | {p['slot_share']:.0%} |")  # fmt: skip
    lines += ["", "| export | draft MB | plain tok/s | base ms | per slot ms | verify ms per draft "
              "| draft work at n_max 1 (ms) | draft share of a round | tau at n_max 1 | break-even "
              "tau | speedup at n_max 1 |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        c, one = r["cost"], r["n_max_1"]
        lines.append(
            f"| {r['export']} | {r['draft_bytes'] / 1e6:.1f} | {r['plain_tokens_per_s']:.1f} | "
            f"{c['base_ms']:.2f} | {c['per_slot_ms']:.2f} | {c['per_draft_ms']:.2f} | "
            f"{one['draft_ms']:.2f} | {one['draft_share']:.0%} | {one['tau']:.2f} | "
            f"{one['break_even_tau']:.2f} | {_x(one['speedup'])} |"
        )
    timed = [(r["export"], g) for r in rows for g in r["grid"] if g.get("timed_block_ms")]
    if timed:
        lines += ["", "llama.cpp's own timer of the draft's block decode (and its sampling) per "
                  "round, against the measured round (the draft's other decode each round, of "
                  "the accepted tokens' features into its cache, has no timer in llama.cpp):",
                  "", "| export | n_max | p_min | tau | round ms | block draft ms | share of the "
                  "round |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for export, g in timed:
            lines.append(f"| {export} | {g['n_max']} | {g['p_min']:g} | {g['tau']:.2f} | "
                         f"{g['round_ms']:.2f} | {g['timed_block_ms']:.2f} | "
                         f"{g['timed_block_share']:.0%} |")  # fmt: skip
    lines += ["", f"Choice: **{chosen['export']}**, the least draft work per round "
              f"({chosen['n_max_1']['draft_ms']:.2f} ms, {chosen['n_max_1']['draft_share']:.0%} "
              f"of a round at n_max 1) among exports whose tau at n_max 1 is within "
              f"{TAU_TOLERANCE:.0%} of the best."]  # fmt: skip
    return "\n".join(lines) + "\n"
