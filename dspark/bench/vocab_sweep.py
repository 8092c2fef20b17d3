"""What a reduced draft vocabulary buys and costs: trained runs with `draft.vocab_size` K side
by side (eval/vocab_sweep.py).

Its command line is `eval/vocab_sweep.py`, a thin entry script of the same name.

Per run: K and the share of the target's greedy tokens the K ids cover (on the bench prompts'
T=0 outputs, which equal the target's greedy output); the run's training step time (median of
its logged intervals: valid only for a run trained with nothing else on the machine) and
held-out `tau_greedy`; decoder tau with full-block verification per set and temperature; the
draft round's time in the bundled decoder (all drafts timed in one process against the same
target and context, `dspark.bench.cost_model`); and, where a llama.cpp benchmark of the run's
draft is given, its fastest draft-dspark mode there.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from dspark.bench.cost_model import _measure
from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder, VerifyPolicy
from dspark.export.load import load_draft
from dspark.fileio import dumps_strict, write_text_atomic
from dspark.machine import cpu_kind
from dspark.plotting import plt
from dspark.target import load_target


def run_facts(run_dir: Path) -> dict:
    """K, its file and training-set coverage, step time and the last held-out metrics."""
    cfg = json.loads((run_dir / "run_config.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    steps = [
        (b["time"] - a["time"]) / (b["step"] - a["step"])
        for a, b in zip(train, train[1:])
        if b["step"] > a["step"]
    ]
    evals = [r for r in rows if "eval/tau_greedy" in r]
    last = evals[-1] if evals else {}
    vocab = cfg.get("draft_vocab") or {}
    return {
        "run": str(run_dir),
        "K": vocab.get("size"),
        "train_coverage": vocab.get("coverage", 1.0),
        "steps": max((r["step"] for r in train), default=0),
        "step_s": statistics.median(steps) if steps else None,
        "eval_tau_greedy": last.get("eval/tau_greedy"),
        "eval_tau_probabilistic": last.get("eval/tau_probabilistic"),
        "eval_out_of_vocab_labels": last.get("eval/out_of_vocab_labels"),
    }


def decode_taus(target, tokenizer, draft, prompt_sets, max_new_tokens, temperatures, seed=0):
    """`{T: {set: tau}}` with full-block verification, and the T=0 outputs' token ids."""

    eos = tokenizer.eos_token_id
    out: dict = {}
    greedy_tokens: list[int] = []
    for t in temperatures:
        full = VerifyPolicy("full", calibrate=False)
        opts = DecoderOptions(Sampling(float(t)), full, max_length=4096)
        dec = SpeculativeDecoder(target, draft, opts)
        out[str(t)] = {}
        for name, prompts in prompt_sets.items():
            acc = rounds = 0
            for i, p in enumerate(prompts):
                res = dec.generate([p], max_new_tokens, eos_token_id=eos, seed=seed + i)
                acc += sum(res.accept_lengths[0])
                rounds += len(res.accept_lengths[0])
                if float(t) == 0.0:
                    greedy_tokens += list(res.sequences[0])
            out[str(t)][name] = (acc + rounds) / rounds if rounds else None
    return out, greedy_tokens


def coverage(tokens: list[int], kept: torch.Tensor | None) -> float:
    if kept is None or not tokens:
        return 1.0
    return float(torch.isin(torch.tensor(tokens), kept.cpu()).float().mean())


def best_llama_cpp(path: str | None, dataset: str = "gsm8k") -> dict | None:
    """The fastest draft-dspark row of a llama.cpp benchmark on `dataset` (with its plain)."""
    if not path:
        return None
    res = json.loads(Path(path).read_text())
    rows = res["datasets"].get(dataset) or next(iter(res["datasets"].values()))
    spec = [r for r in rows if r["mode"]["spec"] == "draft-dspark"]
    if not spec:
        return None
    best = max(spec, key=lambda r: r["tokens_per_s"] or 0.0)
    return {"mode": best["name"], "round_ms": best["round_ms"], "tau": best["tau"],
            "round_cost_plain_steps": best.get("break_even_tau"),
            "speedup_vs_plain": best.get("speedup_vs_plain"),
            "draft_file_type": res["conditions"].get("draft_file_type")}  # fmt: skip


def sweep(runs, *, target_spec, prompt_sets, max_new_tokens, temperatures, llama_cpp=None,
          repeats: int = 15) -> dict:  # fmt: skip

    target, tokenizer = load_target(target_spec, dtype=torch.float32)
    rows, drafts = [], {}
    for run in map(Path, runs):
        facts = run_facts(run)
        draft = load_draft(run / "draft").eval().requires_grad_(False)
        kept = getattr(draft, "kept_target_ids", None)
        facts["K"] = facts["K"] or int(draft.config.vocab_size)
        taus, greedy = decode_taus(target, tokenizer, draft, prompt_sets, max_new_tokens,
                                   temperatures)  # fmt: skip
        facts["decoder_tau"] = taus
        facts["greedy_coverage"] = coverage(greedy, kept)
        facts["llama_cpp"] = best_llama_cpp((llama_cpp or {}).get(run.name))
        drafts[run.name] = draft
        rows.append(facts)
    g = int(next(iter(drafts.values())).config.block_size)
    costs = _measure(target, drafts, g, 256, repeats, 0)  # each draft's own mask id
    for r in rows:
        r["draft_round_ms"] = 1e3 * costs["t_draft"][Path(r["run"]).name]
    return {
        "rows": rows,
        "bundled_costs_ms": {
            "ar_step": 1e3 * costs["t_ar"],
            "verify_full_block": 1e3 * costs["t_verify"][g + 1],
        },  # fmt: skip
        "conditions": {
            "cpu": cpu_kind(),
            "threads": torch.get_num_threads(),
            "target": target_spec,
            "dtype": "float32",
            "block_size": g,
            "batch": 1,
            "datasets": {k: len(v) for k, v in prompt_sets.items()},
            "max_new_tokens": max_new_tokens,
            "temperatures": list(temperatures),
            "verification": "full block",
            "round_timing": f"context 256, median of {repeats}, all drafts in one process",
        },
    }


def _f(x, d: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def render_markdown(res: dict, png: str | None) -> str:
    c = res["conditions"]
    temps = c["temperatures"]
    sets = list(c["datasets"])
    head = ["K", "coverage (greedy)", "step s", "held-out tau_greedy"]
    head += [f"tau {s} T={t}" for t in temps for s in sets]
    head += ["draft round ms (bundled)", "llama.cpp best", "llama.cpp round (plain steps)",
             "llama.cpp speedup"]  # fmt: skip
    lines = [
        "# Reduced draft vocabulary",
        "",
        f"Conditions: {c['cpu']}, {c['threads']} threads, target {c['target']} {c['dtype']}, "
        f"block size {c['block_size']}, batch 1, first {c['datasets']} prompts (first turn), "
        f"{c['max_new_tokens']} new tokens, {c['verification']} verification. Draft rounds: "
        f"{c['round_timing']}; AR step {res['bundled_costs_ms']['ar_step']:.1f} ms, full-block "
        f"verify {res['bundled_costs_ms']['verify_full_block']:.1f} ms. Step time: the median "
        "logged interval of each run (comparable only between runs trained alone).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in res["rows"]:
        ll = r.get("llama_cpp") or {}
        cells = [str(r["K"]), f"{100 * r['greedy_coverage']:.1f}%", _f(r["step_s"]),
                 _f(r["eval_tau_greedy"], 3)]  # fmt: skip
        cells += [_f(r["decoder_tau"][str(t)].get(s), 3) for t in temps for s in sets]
        cells += [_f(r["draft_round_ms"]),
                  f"{ll.get('mode', 'n/a')} {ll.get('draft_file_type') or ''}".strip(),
                  _f(ll.get("round_cost_plain_steps")), _f(ll.get("speedup_vs_plain"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if png:
        lines += ["", f"![sweep]({png})"]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> Path:
    rows = res["rows"]
    labels = [str(r["K"]) for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    sets = list(res["conditions"]["datasets"])
    w = 0.8 / max(1, len(sets))
    for i, s in enumerate(sets):
        a.bar([j + i * w for j in range(len(rows))],
              [r["decoder_tau"]["0"].get(s) or 0 for r in rows] if "0" in rows[0]["decoder_tau"]
              else [next(iter(r["decoder_tau"].values())).get(s) or 0 for r in rows],
              w, label=s)  # fmt: skip
    a.set_xticks([j + 0.4 - w / 2 for j in range(len(rows))], labels)
    a.set_xlabel("draft vocabulary K")
    a.set_ylabel("decoder tau (T=0, full block)")
    a.legend(fontsize=7)
    b.bar(labels, [r["draft_round_ms"] for r in rows])
    b.set_xlabel("draft vocabulary K")
    b.set_ylabel("draft round ms (bundled, T=0)")
    fig.suptitle(f"{res['conditions']['cpu']}, {res['conditions']['threads']} threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(res: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    png = plot(res, out / "vocab_sweep.png")
    write_text_atomic(out / "results.json", dumps_strict(res, indent=2) + "\n")
    write_text_atomic(out / "report.md", render_markdown(res, png.name))
    return out / "report.md"
