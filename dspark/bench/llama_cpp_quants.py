"""The engine benchmark across target quantizations (`eval/llama_cpp_bench.py --target-quant`):
one run of plain, DSpark and n-gram decoding per GGUF of the same target, and one table.

Per quant: llama.cpp's plain tok/s, the best draft-dspark mode's speedup against that quant's
own plain decoding (its tau, and the tau a round of it needs to break even), n-gram's speedup,
how often the draft mode's output equals the quant's plain output, and how often the quant's
plain output equals the bundled target's greedy output (`reference`, decoded once with
transformers: what the quantization changes). Pure functions over the per-quant results of
`llama_cpp_report.bench`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from dspark.bench.llama_cpp import target_gguf_of
from dspark.data.regeneration.llama_cpp_backend import agreement as sequence_agreement
from dspark.engines.llama_server import weight_mix
from dspark.fileio import dumps_strict, write_text_atomic
from dspark.paths import cache_root


def agreement(texts: list[str], reference: list[str]) -> dict:
    """`{"equal": share of equal texts, "prefix": mean share of the reference's characters
    before the first difference}` over the pairs."""
    if not texts or not reference:
        return {"equal": None, "prefix": None}
    n = min(len(texts), len(reference))
    same = sequence_agreement(texts[:n], reference[:n])
    return {"equal": same["rows_equal_share"], "prefix": same["common_prefix_share"]}


def _best(rows: list[dict], spec: str) -> dict | None:
    cands = [r for r in rows if r["mode"]["spec"] == spec and r.get("speedup_vs_plain")]
    return max(cands, key=lambda r: r["speedup_vs_plain"]) if cands else None


def quant_rows(by_quant: dict[str, dict], reference: dict[str, list[str]] | None = None) -> list:
    """One row per (quant, set) of the per-quant `bench` results."""
    out = []
    for quant, res in by_quant.items():
        for name, rows in res["datasets"].items():
            plain = next(r for r in rows if r["mode"]["spec"] == "none")
            dspark, ngram = _best(rows, "draft-dspark"), _best(rows, "ngram-mod")
            texts = (res.get("plain_texts") or {}).get(name)
            ref = (reference or {}).get(name)
            out.append({
                "quant": quant,
                "target_weight_types": (res.get("conditions") or {}).get("target_weight_types"),
                "set": name,
                "plain_tokens_per_s": plain["tokens_per_s"],
                "dspark_mode": dspark["name"] if dspark else None,
                "dspark_speedup": dspark["speedup_vs_plain"] if dspark else None,
                "dspark_tau": dspark["tau"] if dspark else None,
                "break_even_tau": dspark.get("break_even_tau") if dspark else None,
                "dspark_output_equals_plain": dspark.get("output_equals_plain") if dspark else None,
                "ngram_speedup": ngram["speedup_vs_plain"] if ngram else None,
                "plain_vs_bundled_greedy": agreement(texts, ref) if texts and ref else None,
            })  # fmt: skip
    return out


def _f(v, nd=2, suffix="") -> str:
    return "" if v is None else f"{v:.{nd}f}{suffix}"


def _pct(share) -> str:
    return "" if share is None else f"{100 * share:.0f}%"


def render(rows: list[dict], conditions: dict) -> str:
    """The Markdown table of `quant_rows`, under a line of the run's conditions."""
    c = conditions
    head = (f"# llama.cpp across target quantizations\n\n{c.get('cpu')}, {c.get('threads')} "
            f"threads, {c.get('engine')}; T=0, batch 1; {c.get('prompts_per_set')} prompts a set, "
            f"{c.get('max_new_tokens')} new tokens; block {c.get('block_size')}.\n\n")  # fmt: skip
    lines = [
        "| quant | set | plain tok/s | best DSpark mode | speedup | tau | break-even tau | "
        "DSpark == plain | n-gram | plain == bundled greedy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        agree = r["plain_vs_bundled_greedy"] or {}
        mix = weight_mix(r.get("target_weight_types"))
        quant = f"{r['quant']} ({mix})" if mix else r["quant"]
        lines.append(
            f"| {quant} | {r['set']} | {_f(r['plain_tokens_per_s'], 1)} | "
            f"{r['dspark_mode'] or ''} | {_f(r['dspark_speedup'], 2, 'x')} | "
            f"{_f(r['dspark_tau'])} | {_f(r['break_even_tau'])} | "
            f"{_pct(r['dspark_output_equals_plain'])} | {_f(r['ngram_speedup'], 2, 'x')} | "
            f"{_pct(agree.get('equal'))} |"
        )
    return head + "\n".join(lines) + "\n"


def target_gguf_for(quant: str, target: str, made: dict[str, os.PathLike] | None = None) -> str:
    """The GGUF to serve for `quant`: the embedded target's own Q4_1 file for `q4_1` of
    `embedded` (the shipped weights, not a requantization of them), else `made[quant]`."""
    if target == "embedded" and quant == "q4_1":
        return target_gguf_of(target, None)
    if not made or quant not in made:
        raise KeyError(f"no GGUF made for {quant}")
    return str(made[quant])


REFERENCE_DIR = "bench_reference"  # under $DSPARK_CACHE: one JSON per (target, prompt, length)


def reference_key(identity: dict, ids: list[int], max_new_tokens: int, versions: dict) -> str:
    """sha256 naming one reference answer: the target (`target_identity`), the prompt's ids, the
    new-token budget and the library versions that decode it (fp32 greedy, batch 1)."""
    blob = {"version": 1, "target": identity, "prompt_ids": list(ids),
            "max_new_tokens": int(max_new_tokens), "libraries": versions}  # fmt: skip
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def reference_texts(target: str, prompt_ids: dict[str, list[list[int]]], max_new_tokens: int,
                    tokenizer, cache_dir: os.PathLike | None = None) -> dict[str, list[str]]:  # fmt: skip
    """The bundled target's greedy answers (fp32, transformers' `generate`, batch 1) to the same
    prompt ids, as text: what every quant's plain llama.cpp output is compared with.

    Each answer is kept under `cache_dir` (default `$DSPARK_CACHE/bench_reference`) by
    `reference_key`, so a rerun of the benchmark, or a killed one resumed, decodes only the
    prompts it has not answered yet: batch-1 decoding is the slowest step of a quant run."""
    import torch  # light module: defers torch
    import transformers  # light module: defers transformers

    from dspark.data.features.feature_cache import target_identity  # light module: imports torch
    from dspark.target import load_target  # light module: defers torch

    model, _ = load_target(target)
    identity = target_identity(model)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    root = Path(cache_dir) if cache_dir is not None else cache_root() / REFERENCE_DIR
    out: dict[str, list[str]] = {}
    with torch.no_grad():
        for name, prompts in prompt_ids.items():
            texts, cached = [], 0
            for i, ids in enumerate(prompts):
                path = root / f"{reference_key(identity, ids, max_new_tokens, versions)}.json"
                if path.exists():
                    texts.append(json.loads(path.read_text())["text"])
                    cached += 1
                    continue
                x = torch.tensor([ids])
                y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,  # type: ignore[operator]
                                   max_new_tokens=max_new_tokens)  # fmt: skip
                texts.append(tokenizer.decode(y[0, len(ids) :], skip_special_tokens=True))
                write_text_atomic(path, dumps_strict({"text": texts[-1]}) + "\n")
                print(f"reference {name}: {i + 1}/{len(prompts)} ({cached} kept)", flush=True)
            print(
                f"reference {name}: {len(prompts)} answers, {cached} kept from {root}", flush=True
            )
            out[name] = texts
    return out
