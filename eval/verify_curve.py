"""What a target pass of 1..N tokens costs in llama.cpp on this machine, per target quant
(dspark/bench/llama_cpp_curve.py): the curve the flag tuner prices verification with.

    python eval/verify_curve.py --bench-bin $DSPARK_CACHE/llama_cpp/build-native/bin/llama-bench \
        --target-quant q4_1,q4_0,q4_k_m,q8_0

Writes OUTPUT/curve.json, curve.md (ms and single-token passes) and curve.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import user_errors


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench-bin", required=True, help="llama-bench (built by make llama-server)")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--target-quant", default="q4_1,q4_0,q4_k_m,q8_0")
    ap.add_argument("--depth", type=int, default=128, help="context tokens before each pass")
    ap.add_argument("--max-n", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output-dir", default="runs/verify_curve")
    a = ap.parse_args(argv)
    with user_errors("verify_curve"):
        from dspark.bench.llama_cpp_curve import measure_curve, relative
        from dspark.bench.llama_cpp_quants import target_gguf_for
        from dspark.bench.target_quants import make_quants, parse_quants
        from dspark.export.gguf import default_llama_cpp_dir
        from dspark.fileio import dumps_strict, write_text_atomic
        from dspark.machine import cpu_name
        from dspark.paths import cache_root
        from dspark.plotting import plt
        from dspark.target import resolve_target

        quants = parse_quants(a.target_quant)
        need = [q for q in quants if not (a.target == "embedded" and q == "q4_1")]
        made = {}
        if need:
            model_dir = Path(resolve_target(a.target))
            made = make_quants(model_dir, cache_root() / "targets" / "gguf" / model_dir.name, need,
                               tree=default_llama_cpp_dir(),
                               quantize_bin=Path(a.bench_bin).parent / "llama-quantize",
                               threads=a.threads)  # fmt: skip
        curves = {}
        for q in quants:
            gguf = target_gguf_for(q, a.target, made)
            curves[q] = measure_curve(a.bench_bin, gguf, a.threads, a.depth, a.max_n, a.reps)
            print(f"{q}: {curves[q][1]:.2f} ms a token; passes {relative(curves[q])}", flush=True)
        out = Path(a.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        cond = {"cpu": cpu_name(), "threads": a.threads, "depth": a.depth, "reps": a.reps,
                "target": a.target, "engine": "llama.cpp (llama-bench)"}  # fmt: skip
        write_text_atomic(out / "curve.json", dumps_strict(
            {"conditions": cond, "ms": curves}, indent=2) + "\n")  # fmt: skip
        ns = sorted({n for c in curves.values() for n in c})
        lines = [f"# Target pass cost by tokens, {cond['cpu']}, {a.threads} threads, after "
                 f"{a.depth} tokens of context (llama-bench, {a.reps} repetitions)", "",
                 "| quant | 1 token (ms) | " + " | ".join(str(n) for n in ns[1:]) + " |",
                 "|---|---|" + "---|" * (len(ns) - 1)]  # fmt: skip
        for q, c in curves.items():
            rel = relative(c)
            lines.append(
                f"| {q} | {c[1]:.2f} | " + " | ".join(f"{rel[n]:.2f}" for n in ns[1:]) + " |"
            )
        report = write_text_atomic(out / "curve.md", "\n".join(lines) + "\n")
        fig, ax = plt.subplots(figsize=(6, 4))
        for q, c in curves.items():
            ax.plot(list(c), list(relative(c).values()), marker="o", label=q)
        ax.plot(ns, ns, "k:", label="n single steps")
        ax.set_xlabel("tokens in the pass")
        ax.set_ylabel("cost in single-token passes")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "curve.png", dpi=110)
    print(report.read_text())


if __name__ == "__main__":
    main()
