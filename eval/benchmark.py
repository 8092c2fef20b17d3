"""Benchmark a DSpark draft: acceptance, speed vs autoregressive and vs transformers, calibration.

    python eval/benchmark.py draft=PATH [target=SPEC] datasets=[gsm8k,humaneval,mt-bench,embedded] \
        num_prompts=40 max_new_tokens=256 temperature=0 batch_size=1 output_dir=DIR
    python eval/benchmark.py draft=PATH dtype=auto verify_length=auto \
        baseline_dtypes=[float32,bfloat16]   # measured dtype and verify length, fastest plain

Keys and defaults: dspark/eval/benchmark_config.py (BenchmarkConfig). Writes results.json, report.md and
PNG plots into output_dir (default: Hydra's run directory) and prints the report.
Console script: `dspark-benchmark`; the Hydra main: dspark/cli.py (`benchmark`).
"""

from pathlib import Path

from dspark.cli import benchmark

if __name__ == "__main__":
    benchmark(Path(__file__).resolve().parents[1])
