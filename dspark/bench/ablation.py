"""Ablation table: drafts trained at equal budget, compared by their training runs' held-out
tau_probabilistic, tau_greedy and first-slot greedy acceptance, and by decoder tau (bonus
counted) on benchmark prompts at T=0 and T=1.

Its command line is `eval/ablation.py`, a thin entry script of the same name.

Decoder tau needs no timing, so only the speculative decoder runs (batch 1, first turn, the
first `num_prompts` prompts of each set, `max_new_tokens`); T>0 decoding is lossless sampling
with a fixed seed. Every draft of a table shares these conditions, written beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark.decoding import DecoderOptions, Sampling, SpeculativeDecoder
from dspark.decoding.output import GenerationOutput


def training_summary(run_dir: Path) -> dict:
    """Final held-out metrics of a distill run dir (tau, losses, per-slot acceptance) and its
    optimizer steps."""
    res = json.loads((run_dir / "results.json").read_text())
    final = res.get("final_eval") or res.get("eval") or {}
    out = {k: v for k, v in final.items() if "tau" in k or "loss" in k or "accept" in k}
    out["steps"] = res.get("steps")
    return out


@torch.inference_mode()
def decoder_tau(target, tokenizer, draft, prompts, *, temperature, max_new_tokens, seed=0) -> dict:
    """Pooled decoder tau and per-position acceptance over `prompts` (token-id lists)."""

    dec = SpeculativeDecoder(target, draft, DecoderOptions(Sampling(temperature), max_length=4096))
    eos = tokenizer.eos_token_id
    outs = [
        dec.generate([p], max_new_tokens, eos_token_id=eos, seed=seed + i)
        for i, p in enumerate(prompts)
    ]
    pooled = GenerationOutput(
        sequences=[s for o in outs for s in o.sequences],
        accept_lengths=[a for o in outs for a in o.accept_lengths],
        verify_lengths=[v for o in outs for v in o.verify_lengths],
    )
    return {
        "tau": pooled.tau,
        "accept_by_position": pooled.acceptance_by_position(),
        "rounds": sum(map(len, pooled.accept_lengths)),
    }


HELD_OUT_COLUMNS = (  # (header, final_eval key) of the training run's held-out metrics
    ("held-out tau_prob", "eval/tau_probabilistic"),
    ("held-out tau_greedy", "eval/tau_greedy"),
    ("held-out greedy accept@1", "eval/greedy_accept@1"),
)


def render_table(rows: list[dict], sets: list[str], temps: list[float]) -> str:
    head = ["draft", "steps"] + [h for h, _ in HELD_OUT_COLUMNS]
    head += [f"{s} T={t:g}" for t in temps for s in sets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        train = r["train"]
        cells = [r["label"], str(train.get("steps", "n/a"))]
        cells += [_num(train.get(key)) for _, key in HELD_OUT_COLUMNS]
        cells += [f"{r['decoder'][f'{s}@{t:g}']['tau']:.2f}" for t in temps for s in sets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
