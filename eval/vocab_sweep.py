"""Reduced draft vocabularies side by side: runs trained with draft.vocab_size=K (and one at the
full vocabulary) on the same data, steps and seed.

python eval/vocab_sweep.py runs/quickstart runs/qs_v8k runs/qs_v4k \
    --llama-cpp qs_v8k=runs/llama_cpp_v8k/results.json --output-dir runs/vocab_sweep

Per run: K, the share of the target's greedy tokens its ids cover, the logged training step
time, held-out tau_greedy, decoder tau (full-block verification) per set and temperature, the
draft round's time in the bundled decoder, and the fastest llama.cpp mode of a given
llama.cpp benchmark (eval/llama_cpp_bench.py) of that run's draft. Writes results.json,
report.md and a PNG.
"""

import argparse
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import BadInputError, user_errors


def parse(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", help="training run directories (each with draft/)")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--datasets", default="gsm8k,humaneval,mt-bench")
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="0,1", help="comma-separated, e.g. 0,1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-cpp", nargs="*", default=[], metavar="RUN=RESULTS_JSON",
                    help="a llama.cpp benchmark of a run's draft, by the run dir's name")  # fmt: skip
    ap.add_argument("--output-dir", default="runs/vocab_sweep")
    a = ap.parse_args(argv)
    for run in a.runs:
        for need in ("run_config.json", "metrics.jsonl", "draft"):
            if not (Path(run) / need).exists():
                raise BadInputError(f"{run} has no {need}: pass training run directories")
    try:
        a.temps = [float(t) for t in a.temperatures.split(",") if t.strip()]
    except ValueError:
        raise BadInputError(f"--temperatures {a.temperatures!r}: give numbers, e.g. 0,1") from None
    if any(t < 0 for t in a.temps) or a.num_prompts < 1 or a.max_new_tokens < 1:
        raise BadInputError("temperatures must be >= 0, --num-prompts and --max-new-tokens >= 1")
    a.llama = {}
    for item in a.llama_cpp:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise BadInputError(f"--llama-cpp {item!r}: give RUN_NAME=an existing results.json")
        a.llama[name] = path
    return a


def main(argv=None) -> None:
    with user_errors("vocab_sweep"):
        a = parse(argv)
        import torch

        from dspark.bench import vocab_sweep as vs
        from dspark.eval.prompts import check_datasets, load_dataset, render
        from dspark.target import load_tokenizer

        torch.set_num_threads(a.threads)
        datasets = [d.strip() for d in a.datasets.split(",") if d.strip()]
        check_datasets(datasets, a.bench_dir)
        tok = load_tokenizer(a.target)
        prompts = {
            name: [
                list(render(tok, c[:1], [])) for c in load_dataset(name, a.bench_dir, a.num_prompts)
            ]
            for name in datasets
        }
        res = vs.sweep(a.runs, target_spec=a.target, prompt_sets=prompts,
                       max_new_tokens=a.max_new_tokens, temperatures=a.temps,
                       llama_cpp=a.llama)  # fmt: skip
        report = vs.write(res, Path(a.output_dir))
    print(report.read_text())


if __name__ == "__main__":
    main()
