"""The benchmark's measured choices: the target's dtype (`dtype=auto`) and how many drafts a
round verifies (`verify_length=auto`), from this machine's probe and the draft's acceptance.

- The draft's conditional acceptance per position comes from its training run's held-out eval
  (`results.json` beside the draft directory, `final_eval`): `eval/greedy_accept@k` at T = 0
  (what greedy verification accepts), `eval/accept_rate@k` (mean c*) when sampling.
- `dtype=auto`: `dspark.dtype_probe.choose(job="speculative")` at the benchmark's batch: the
  dtype whose best round (draft + verify, over tau) costs least per committed token.
- `verify_length=auto`: `dspark.dtype_choice.best_verify_length` on the decoding dtype's
  measured curve. Verifying fewer drafts is lossless: which drafts are verified never depends
  on the target, so T = 0 output stays plain greedy (tests/test_dtype_choice.py).
Without an acceptance profile the full block is verified and the report says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark import dtype_probe
from dspark.dtype_choice import best_verify_length
from dspark.errors import BadInputError

RESULTS_NAME = "results.json"


def draft_acceptance(draft_dir: str, temperature: float, block_size: int) -> dict:
    """{"accept": [P(draft k accepted | drafts < k accepted)] or None, "source": why/where}."""
    key = "eval/greedy_accept@{}" if temperature <= 0 else "eval/accept_rate@{}"
    for path in (Path(draft_dir) / RESULTS_NAME, Path(draft_dir).resolve().parent / RESULTS_NAME):
        try:
            final = json.loads(path.read_text()).get("final_eval") or {}
        except (OSError, ValueError):
            continue
        accept = [final.get(key.format(k)) for k in range(1, block_size + 1)]
        got = [float(a) for a in accept if isinstance(a, (int, float))]
        if len(got) == block_size:
            return {"accept": got, "source": f"{path} {key.format('k')}"}
    return {"accept": None, "source": f"no {RESULTS_NAME} with final_eval {key.format('k')} "
            f"in {draft_dir} or its parent (a training run's draft has one)"}  # fmt: skip


def parse_verify_length(value, block_size: int) -> int | str:
    """`auto`, `full` or an int 1..block_size (the config's string form)."""
    text = str(value).strip().lower()
    if text in ("auto", "full"):
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= block_size:
        raise BadInputError(
            f"verify_length={value!r} must be auto, full or an integer 1..{block_size} "
            "(the draft's block size), e.g. verify_length=auto"
        )
    return n


def choose(cfg, target, draft) -> dict:
    """Decide dtype and verify length; casts `target` / `draft` to the chosen dtype (auto only).

    Returns the "auto_settings" block of the results: what was measured and what was chosen."""
    block = int(draft.config.block_size)
    wanted_length = parse_verify_length(cfg.verify_length, block)
    acc = draft_acceptance(cfg.draft, cfg.temperature, block)
    out: dict = {"acceptance": acc, "batch": cfg.batch_size}
    probe_kw = dict(
        batch=cfg.batch_size,
        repeats=cfg.probe_repeats,
        refresh=cfg.probe_refresh,
        exact_rows=cfg.exact_rows,
    )
    measured = None
    if cfg.dtype == "auto":
        d = dtype_probe.choose(target, draft, job="speculative", accept=acc["accept"], **probe_kw)
        dtype = getattr(torch, d["dtype"])
        target.to(dtype)
        if cfg.draft_dtype in (None, "auto"):  # else the draft keeps its explicit dtype
            draft.to(dtype)
        out["dtype"] = d
        measured = d["measured"][d["dtype"]]
    decode = str(next(target.parameters()).dtype).replace("torch.", "")
    if wanted_length == "auto" and acc["accept"]:
        if measured is None:  # an explicit dtype: measure its curve alone
            one = dtype_probe.choose(
                target, draft, job="speculative", candidates=[decode], **probe_kw
            )
            measured = one["measured"][decode]
            out["curve_probe"] = {k: one[k] for k in ("cache_path", "cached", "conditions")}
        best = best_verify_length(measured, acc["accept"])
        out["verify_length"] = {"chosen": best["L"], "from": "measured curve", "dtype": decode,
                                "best": {k: v for k, v in best.items() if k != "curve"},
                                "curve": best["curve"]}  # fmt: skip
    elif wanted_length == "auto":
        out["verify_length"] = {"chosen": block, "from": "full block: " + acc["source"]}
    else:
        n = block if wanted_length == "full" else int(wanted_length)
        out["verify_length"] = {"chosen": n, "from": f"verify_length={cfg.verify_length}"}
    return out


def report_lines(auto: dict | None) -> list[str]:
    """The Markdown section: the probe's figures, the chosen dtype and verify length."""
    if not auto:
        return []
    ms = lambda s: "n/a" if s is None else f"{1e3 * s:.1f} ms"  # noqa: E731
    out = ["## Measured choices (dtype, verify length)", ""]
    acc = auto["acceptance"]
    if acc["accept"]:
        out.append("Draft acceptance per position (" + acc["source"] + "): "
                   + ", ".join(f"{a:.3f}" for a in acc["accept"]))  # fmt: skip
    else:
        out.append(f"Draft acceptance per position: none ({acc['source']}).")
    out.append("")
    d = auto.get("dtype")
    if d:
        c = d["conditions"]
        out += [
            f"Conditions: dtype=auto probe on `{c['device']}`, {c['threads']} threads, batch {c['batch']}"
            f" ({'read from' if d['cached'] else 'measured, cached in'} `{d['cache_path']}`):",
            "",
            "| dtype | AR step | verify (tokens: ms, fitted non-decreasing) | draft round (drafts: ms) | job cost | from |",
            "|---|---|---|---|---|---|",
        ]
        for name, p in d["measured"].items():
            raw = {int(n): t for n, t in (p.get("t_verify_measured") or {}).items()}
            curve = ", ".join(
                f"{n}: {1e3 * t:.1f}"
                + (f" (measured {1e3 * raw[int(n)]:.1f})" if int(n) in raw and
                   abs(raw[int(n)] - t) > 5e-5 else "")
                for n, t in p["t_verify"].items()
            )  # fmt: skip
            steps = p.get("t_draft_steps") or {}
            drafts = ", ".join(f"{n}: {1e3 * t:.1f}" for n, t in steps.items()) or ms(p["t_draft"])
            cost = d["costs"][name]
            out.append(f"| {name} | {ms(p['t_ar'])} | {curve} | {drafts} | "
                       f"{ms(cost['cost_s'])} | {cost['from']} |")  # fmt: skip
        out += ["", f"**Chosen dtype: {d['dtype']}** (lowest {d['job']} cost per token).", ""]
    v = auto["verify_length"]
    out.append(f"**Verify length: {v['chosen']}** ({v['from']}).")
    if "curve" in v:
        out += ["", f"Conditions: predicted from the {v['dtype']} verify-cost curve measured "
                f"at batch {auto.get('batch', '?')} and the acceptance above:", "",
                "| L | tau | round | ms / token | speedup vs plain | break-even tau |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for r in v["curve"]:
            out.append(f"| {r['L']} | {r['tau']:.3f} | {ms(r['round_s'])} | "
                       f"{1e3 * r['s_per_token']:.2f} | {r['speedup']:.3f}x | "
                       f"{r['break_even_tau']:.2f} |")  # fmt: skip
    return out + [""]
