"""Benchmark a DSpark draft: acceptance, speed vs autoregressive and vs transformers, calibration.

    python eval/benchmark.py draft=PATH [target=SPEC] datasets=[gsm8k,humaneval,mt-bench,embedded] \
        num_prompts=40 max_new_tokens=256 temperature=0 batch_size=1 output_dir=DIR

Keys and defaults: dspark/eval/config.py (BenchmarkConfig). Writes results.json, report.md and
PNG plots into output_dir (default: Hydra's run directory) and prints the report.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dspark.eval.config import check_overrides, register

register()


@hydra.main(version_base="1.3", config_path="../conf/benchmark", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    if OmegaConf.is_missing(cfg, "draft"):
        raise SystemExit("benchmark: pass draft=PATH, a DSpark draft directory (save_pretrained)")
    from dspark.eval.runner import run

    out_dir = cfg.output_dir or HydraConfig.get().runtime.output_dir
    _, report = run(cfg, out_dir)
    print(report)
    print(f"results: {out_dir}/results.json")


if __name__ == "__main__":
    check_overrides()
    main()
