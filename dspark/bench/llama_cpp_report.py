"""The llama.cpp engine benchmark: prompts, flag tuning, and its report (JSON, Markdown, PNG).

`bench(...)` decodes the first `num_prompts` conversations of each set (first user turn,
rendered by the target's chat template into token ids, as eval/benchmark.py does) in
llama.cpp: plain, `draft-dspark` for each (n_max, p_min) asked for, and n-gram speculation.
With tuning, it first measures (n_max, p_min) modes on the prompts after those
(llama_cpp_tune.py) and adds its choice to the measured modes. With `ours` (eval/benchmark.py's
`results.json` on the same draft and prompts) the report sets the bundled decoder's figures
beside llama.cpp's; its "Serve with" line comes from llama_cpp_advice.py."""

from __future__ import annotations

import json
from pathlib import Path

from dspark.bench import llama_cpp_flags as flags
from dspark.bench.llama_cpp import (
    EngineSettings,
    Mode,
    engine_conditions,
    run_modes,
    server_args,
)
from dspark.bench.llama_cpp_advice import recommendation
from dspark.bench.llama_cpp_rounds import decoder_rounds
from dspark.bench.llama_cpp_tune import tune
from dspark.engines.llama_server import weight_mix
from dspark.eval.prompts import load_dataset, render
from dspark.fileio import dumps_strict, write_text_atomic
from dspark.machine import cpu_kind
from dspark.plotting import plt


def prompt_sets(tokenizer, names, bench_dir, lo: int, hi: int) -> dict[str, list[list[int]]]:
    """Token ids of conversations lo..hi-1 of each set (first user turn)."""
    out = {}
    for name in names:
        convs = load_dataset(name, bench_dir, hi)[lo:hi]
        out[name] = [list(render(tokenizer, c[:1], [])) for c in convs]
    return out


def bench(
    settings: EngineSettings,
    *,
    tokenizer,
    datasets: list[str],
    bench_dir,
    num_prompts: int,
    max_new_tokens: int,
    draft_modes: list[Mode],
    ngram_n_max: int | None,
    block_size: int,
    has_confidence: bool,
    tune_prompts: int = 0,
    tune_how: str = "grid",
    draft_dir=None,
    target_spec: str = "embedded",
    ours: dict | None = None,
    progress=print,
) -> dict:
    """Plain, `draft_modes`, the tuned mode and n-gram speculation on the first `num_prompts`
    of each set. Tuning (`tune_prompts` > 0) runs on the prompts after those; with `draft_dir`
    (the draft's HF dir) the bundled decoder's rounds on them feed the cost model
    (`llama_cpp_flags`), whose choice `tune_how="model"` takes."""
    results: dict = {"tuning": None}
    modes = [Mode("none"), *draft_modes]
    if tune_prompts > 0 and settings.draft_gguf:
        held = prompt_sets(tokenizer, datasets, bench_dir, num_prompts, num_prompts + tune_prompts)
        held = {k: v for k, v in held.items() if v}
        if held:
            rounds = None
            if draft_dir is not None:
                progress(f"bundled decoder rounds on the tuning prompts ({draft_dir})")

                rounds = decoder_rounds(draft_dir, target_spec, held, max_new_tokens)
            best, tuning = tune(settings, block_size, has_confidence, held, max_new_tokens,
                                progress, how=tune_how, rounds=rounds)  # fmt: skip
            results["tuning"] = {"prompts": {k: len(v) for k, v in held.items()}, **tuning,
                                 "best": {"n_max": best.n_max, "p_min": best.p_min}}  # fmt: skip
            if best not in modes:
                modes.append(best)
    if ngram_n_max:
        modes.append(Mode("ngram-mod", ngram_n_max))
    if not settings.draft_gguf:
        modes = [m for m in modes if m.spec != "draft-dspark"]
    measured = prompt_sets(tokenizer, datasets, bench_dir, 0, num_prompts)
    runs = run_modes(settings, modes, measured, max_new_tokens, progress=progress)
    results["datasets"] = {
        name: [r.summary(by_mode["plain"]) for r in by_mode.values()]
        for name, by_mode in runs.items()
    }
    # what the quantization changes, against the bundled target's greedy text (llama_cpp_quants)
    results["plain_texts"] = {
        name: [c.text for c in by_mode["plain"].completions] for name, by_mode in runs.items()
    }
    best_dspark = (results["tuning"] or {}).get("best")
    tuned = (
        Mode("draft-dspark", best_dspark["n_max"], best_dspark["p_min"]) if best_dspark else None
    )
    results["tuned_command"] = (
        "llama-server " + " ".join(server_args(settings, tuned)) if tuned else None
    )
    results["conditions"] = {
        "cpu": cpu_kind(),
        **engine_conditions(settings),
        "datasets": datasets,
        "prompts_per_set": num_prompts,
        "max_new_tokens": max_new_tokens,
        "temperature": 0.0,
        "batch": 1,
        "block_size": block_size,
    }
    if ours:
        results["ours"] = ours_rows(ours)
    return results


def ours_rows(ours: dict) -> dict:
    """The bundled decoder's figures per set from eval/benchmark.py's results.json."""
    out = {}
    for name, ds in (ours.get("datasets") or {}).items():
        speed = ds.get("speed") or {}
        out[name] = {
            "ar_tokens_per_s": (speed.get("autoregressive") or {}).get("tokens_per_s"),
            "spec_tokens_per_s": (speed.get("speculative") or {}).get("tokens_per_s"),
            "tau": (ds.get("acceptance") or {}).get("tau"),
            "greedy_match": speed.get("greedy_match"),
            "accepted": (ds.get("acceptance") or {}).get("accepted"),
            "drafted": (ds.get("acceptance") or {}).get("drafted"),
            "dtype": (ours.get("conditions") or {}).get("dtype"),
        }
    return out


def round_trip(results: dict) -> dict:
    """Per set, llama.cpp's accepted drafts at full blocks against the bundled decoder's: the
    same draft through the export should accept the same tokens (up to float rounding)."""
    block = results["conditions"]["block_size"]
    out = {}
    for name, rows in results["datasets"].items():
        ours = (results.get("ours") or {}).get(name) or {}
        full = [r for r in rows if r["mode"]["spec"] == "draft-dspark" and
                r["mode"]["n_max"] == block and r["mode"]["p_min"] == 0]  # fmt: skip
        if full and ours.get("accepted"):
            a, b = full[0]["accepted"], ours["accepted"]
            out[name] = {"llama_cpp": a, "ours": b, "difference_pct": 100 * abs(a - b) / b}
    return out


def fastest(results: dict) -> dict[str, list[tuple[str, float]]]:
    """Per set, every way of decoding measured (llama.cpp's modes, and the bundled decoder's
    plain and speculative figures when given), fastest first: `[(name, tok/s)]`."""
    out = {}
    for name, rows in results["datasets"].items():
        ways = [(f"llama.cpp {r['name']}", r["tokens_per_s"]) for r in rows if r["tokens_per_s"]]
        ours = (results.get("ours") or {}).get(name) or {}
        dtype = ours.get("dtype") or "?"
        for key, label in (("ar_tokens_per_s", "plain"), ("spec_tokens_per_s", "DSpark")):
            if ours.get(key):
                ways.append((f"bundled decoder {label} ({dtype})", ours[key]))
        out[name] = sorted(ways, key=lambda w: -w[1])
    return out


def _f(x, d: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def render_markdown(results: dict, png: str | None) -> str:
    c = results["conditions"]
    mix = weight_mix(c.get("target_weight_types"))  # a quant's name is not its tensors' types
    lines = [
        "# llama.cpp engine benchmark",
        "",
        f"Conditions: {c['cpu']}, {c['engine']} ({c.get('xllamacpp', 'native build')}), "
        f"{c['threads']} threads, target `{c['target_gguf']}` ({c['target_file_type']}"
        f"{': ' + mix if mix else ''}), draft "
        f"`{c['draft_gguf']}` ({c['draft_file_type']}), block size {c['block_size']}, T=0, "
        f"batch 1, first {c['prompts_per_set']} prompts of each set (first turn), "
        f"{c['max_new_tokens']} new tokens at most. tok/s is llama.cpp's decode phase "
        "(prefill excluded); tau = tokens / target passes (bonus counted); a round's cost in "
        "plain steps is the tau it needs to break even.",
        "",
    ]
    if c.get("llama_cpp_system_info"):
        lines += [f"llama.cpp CPU features: `{c['llama_cpp_system_info']}`", ""]
    rec = recommendation(results)
    lines += [f"**Serve with: {rec['serve']}** ({rec['why']}).", ""]
    lines += ["Fastest on this machine, per set (every engine and setting measured here):", ""]
    for name, ways in fastest(results).items():
        top = ", ".join(f"{w} {t:.1f} tok/s" for w, t in ways[:3])
        lines.append(f"- {name}: {top}")
    lines.append("")
    lines += [
        "| set | mode | tok/s | speedup vs llama.cpp plain | tau | ms/round | round cost "
        "(plain steps) | output == plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results["datasets"].items():
        for r in rows:
            eq = r.get("output_equals_plain")
            lines.append(
                f"| {name} | {r['name']} | {_f(r['tokens_per_s'])} | "
                f"{_f(r.get('speedup_vs_plain'), 2)}x | {_f(r['tau'], 2)} | "
                f"{_f(r['round_ms'], 2)} | {_f(r.get('break_even_tau'), 2)} | "
                f"{'n/a' if eq is None else f'{100 * eq:.0f}%'} |"
            )
    if results.get("ours"):
        lines += [
            "",
            "The bundled decoder on the same draft and prompts (eval/benchmark.py, its own "
            "conditions in its report):",
            "",
            "| set | dtype | plain tok/s | speculative tok/s | tau | output == plain |",
            "|---|---|---|---|---|---|",
        ]
        for name, o in results["ours"].items():
            match = o["greedy_match"]
            lines.append(
                f"| {name} | {o['dtype']} | {_f(o['ar_tokens_per_s'])} | "
                f"{_f(o['spec_tokens_per_s'])} | {_f(o['tau'], 2)} | "
                f"{'n/a' if match is None else f'{100 * match:.0f}%'} |"
            )
    trip = round_trip(results)
    if trip:
        lines += ["", "Round trip (full blocks: llama.cpp n_max = block size, p_min 0, against the "
                  "bundled decoder's full-block verification on the same prompts):", ""]  # fmt: skip
        lines += [f"- {name}: llama.cpp accepted {t['llama_cpp']} drafted tokens, the bundled "
                  f"decoder {t['ours']} ({_f(t['difference_pct'], 1)}% apart)"
                  for name, t in trip.items()]  # fmt: skip
    tuning = results.get("tuning")
    if tuning:
        b = tuning["best"]
        lines += [
            "",
            f"Flags tuned on held-out prompts ({tuning['prompts']}, after the measured ones): "
            f"fastest `--spec-draft-n-max {b['n_max']} --spec-draft-p-min {b['p_min']:g}`.",
            "",
            "The cost curve behind it: a round's time in plain llama.cpp steps (the tau it needs "
            "to break even) against the tau it reached.",
            "",
            "| n_max | p_min | tok/s | tau | ms/round | round cost (plain steps) "
            "| predicted tok/s | predicted tau |",
            "|---|---|---|---|---|---|---|---|",
            *[
                f"| {g['n_max']} | {g['p_min']:g} | {_f(g['tokens_per_s'])} | {_f(g['tau'], 2)} "
                f"| {_f(g['round_ms'], 2)} | {_f(g['break_even_tau'], 2)} "
                f"| {_f((g.get('predicted') or {}).get('tokens_per_s'))} "
                f"| {_f((g.get('predicted') or {}).get('tau'), 2)} |"
                for g in tuning["grid"]
            ],
            "",
            *cost_model_lines(tuning),
            f"Tuned server: `{results['tuned_command']}`",
        ]
    if png:
        lines += ["", f"![tok/s]({png})"]
    return "\n".join(lines) + "\n"


def cost_model_lines(tuning: dict) -> list[str]:
    """The fitted llama.cpp round cost and the flags it chooses (Markdown lines)."""
    cost, pick = tuning.get("cost"), tuning.get("model_choice")
    if not cost or not pick:
        return []
    s = cost["plain_step_ms"]
    r = tuning["rounds"]
    curve = cost.get("verify_ms")
    rc = flags.RoundCost(**{**cost, "verify_ms": {int(k): v for k, v in curve.items()}
                            if curve else None})  # fmt: skip
    verify = (
        "the target's verify work from its measured pass curve (llama-bench: "
        + ", ".join(
            f"{k} tokens {float(v):.2f} ms"
            for k, v in sorted(curve.items(), key=lambda kv: int(kv[0]))
        )
        + ")"
        if curve
        else f"{cost['per_draft_ms']:.2f} ms of verify per drafted token"
    )
    return [
        f"Cost model fitted to those runs (llama_cpp_flags): plain step {s:.2f} ms; a round adds "
        f"{cost['base_ms']:.2f} ms whatever it drafts, {cost['per_slot_ms']:.2f} ms per n_max "
        f"slot (the draft's decodes, and what a measured verify curve misses) and {verify}, "
        f"so even n_max 1 (one draft kept) needs tau >= "
        f"{rc.round_ms(1, 1) / s:.2f} to break even. Acceptance from the bundled decoder's rounds "
        f"on the same prompts ({r['count']} rounds, {r['decoder']}, "
        f"{'STS-calibrated' if r['calibrated'] else 'uncalibrated'} confidence)"
        + (
            f", each slot's moved by {sh['logits']:+.2f} logits to what llama.cpp accepted on the "
            f"probes (their tau {sh['tau_llama_cpp']:.2f}; the rounds as recorded predict "
            f"{sh['tau_bundled']:.2f})."
            if (sh := tuning.get("acceptance_shift"))
            else "."
        ),
        "",
        f"Its choice: `--spec-draft-n-max {pick['n_max']} --spec-draft-p-min {pick['p_min']:g}`, "
        f"predicted {pick['tokens_per_s']:.1f} tok/s (tau {pick['tau']:.2f}) against plain "
        f"{pick['plain_tokens_per_s']:.1f}"
        + (" (tuning by the model)." if tuning.get("how") == "model" else " (the grid decides)."),
        "",
    ]


def plot(results: dict, path: Path) -> Path:
    sets = list(results["datasets"])
    names = [r["name"] for r in results["datasets"][sets[0]]]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(sets) * max(1, len(names)) / 3, 3.6))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        vals = [
            next((r["tokens_per_s"] or 0 for r in results["datasets"][s] if r["name"] == name), 0)
            for s in sets
        ]
        ax.bar([j + i * width for j in range(len(sets))], vals, width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
    ax.set_ylabel("decode tokens/s (llama.cpp)")
    ax.set_title(f"{results['conditions']['cpu']}, {results['conditions']['threads']} threads")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot(results, out_dir / "llama_cpp_tokens_per_s.png")
    results["recommendation"] = recommendation(results)
    write_text_atomic(out_dir / "results.json", dumps_strict(results, indent=2) + "\n")
    md = render_markdown(results, png.name)
    write_text_atomic(out_dir / "report.md", md)
    return out_dir / "report.md"


def draft_gguf_shape(path: str) -> tuple[int, bool]:
    """(block size, has a confidence head) from a draft GGUF's `dflash.*` metadata."""
    import gguf  # optional: gguf

    fields = gguf.GGUFReader(path).fields

    def scalar(key: str, default):
        f = fields.get(key)
        return default if f is None else f.parts[f.data[0]][0].item()

    return int(scalar("dflash.block_size", 7)), bool(scalar("dflash.has_confidence_head", False))


def load_ours(path: str | None) -> dict | None:
    return json.loads(Path(path).read_text()) if path else None
