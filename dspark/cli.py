"""Console entry points (`[project.scripts]` in pyproject.toml) and the scripts they stand for.

Parallels the command lines of two packages, which it calls: `dspark/data/cli.py` and
`dspark/export/cli.py`.

| console script          | the same command in the checkout |
|-------------------------|----------------------------------|
| `dspark-prepare-target` | `python data_scripts/prepare_target.py` |
| `dspark-regenerate`     | `python data_scripts/regenerate.py` |
| `dspark-tokenize`       | `python data_scripts/tokenize_data.py` |
| `dspark-export`         | `python data_scripts/export.py` |
| `dspark-distill`        | `python train/distill.py` (Hydra: `conf/` + `recipes/`) |
| `dspark-benchmark`      | `python eval/benchmark.py` (Hydra: `conf/benchmark/`) |

The scripts call these functions with their own checkout; the console scripts find `conf/`
and `recipes/` by `dspark.paths.find_dir`. Each main runs inside `user_errors()`, so an
expected mistake ends as one `error: ...` line and exit status 2 (`dspark/errors.py`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dspark.data.cli import regenerate_main
from dspark.data.tokenize_cli import tokenize_main
from dspark.errors import EXIT_UNFINISHED, StoppedWithWorkLeft, UserError, user_errors
from dspark.locking import exclusive_output
from dspark.overrides import check_overrides, check_sweep_outputs
from dspark.paths import find_dir

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _dir(checkout: Path | None, name: str) -> Path:
    """`conf` or `recipes` of `checkout`, or found by the documented search path."""
    if checkout is not None:
        return checkout / name

    return find_dir(name)


# -- data_scripts/ ---------------------------------------------------------------------------
def prepare_target(argv: list[str] | None = None) -> None:
    """Prepare the embedded target (SmolLM2-135M-Instruct from its PyPI GGUF), show it answering."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never wait on a hub
    from dspark.target.prepare import SAMPLE_PROMPT  # after argument parsing: --help stays instant

    ap = argparse.ArgumentParser(prog="prepare_target", description=prepare_target.__doc__)
    ap.add_argument(
        "--cache-dir",
        default=None,
        help="dspark cache root (default $DSPARK_CACHE or ~/.cache/dspark)",
    )
    ap.add_argument("--force", action="store_true", help="rebuild even if a prepared copy exists")
    ap.add_argument("--prompt", default=SAMPLE_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    with user_errors("prepare_target"):
        import torch  # after argument parsing: --help stays instant

        from dspark.target import load_target  # after argument parsing: --help stays instant
        from dspark.target.prepare import (  # after argument parsing: --help stays instant
            greedy_answer,
            prepare_embedded_target,
        )

        path = prepare_embedded_target(args.cache_dir, force=args.force)
        model, tok = load_target(str(path))
        text, n, secs = greedy_answer(model, tok, args.prompt, args.max_new_tokens)
    print(f"\nuser: {args.prompt}\nassistant: {text}")
    print(
        f"[greedy, float32, CPU threads={torch.get_num_threads()}: "
        f"{n} tokens in {secs:.2f}s = {n / secs:.1f} tokens/s]"
    )


def regenerate(argv: list[str] | None = None) -> None:
    with user_errors("regenerate"):
        sys.exit(regenerate_main(argv))


def tokenize(argv: list[str] | None = None) -> None:
    with user_errors("tokenize"):
        sys.exit(tokenize_main(argv))


def export(argv: list[str] | None = None) -> None:
    """Export a draft for serving engines (dspark/export/cli.py); a refusal is one
    `export: error: ...` line and exit status 2."""
    from dspark.export.cli import export_main  # after argument parsing: --help stays instant

    with user_errors("export"):
        sys.exit(export_main(argv))


# -- train/distill.py ------------------------------------------------------------------------
def _distill_job(cfg) -> float:
    from omegaconf import OmegaConf  # after argument parsing: --help stays instant

    from dspark.training.schema import check  # after argument parsing: --help stays instant

    with user_errors("distill"):
        check(cfg)
        from dspark.training.loop import run  # after argument parsing: --help stays instant

        if int(os.environ.get("RANK", "0")) == 0:
            print(OmegaConf.to_yaml(cfg, resolve=True))
        try:
            results = run(cfg)
        except StoppedWithWorkLeft as e:
            print(f"distill: {e}", file=sys.stderr)
            raise SystemExit(EXIT_UNFINISHED) from None
    return float(results["final_eval"].get("eval/loss", float("nan")))  # for sweepers


# The config groups of conf/config.yaml's defaults list (plus `recipe`), whose choices are files.
DISTILL_GROUPS = ("target", "draft", "data", "objective", "optim", "trainer", "tracking")


def check_distill_overrides(args: list[str], conf: Path, recipes: Path) -> None:
    """One `error:` line for a misspelt key, a mistyped value or an unknown group choice."""
    from dspark.objectives import (  # after argument parsing: --help stays instant
        OBJECTIVES,
        objective_keys,
    )
    from dspark.training.schema import DistillConfig  # after argument parsing: --help stays instant

    groups = {g: [p.stem for p in (conf / g).glob("*.yaml")] for g in DISTILL_GROUPS}
    groups["recipe"] = [p.stem for p in recipes.glob("*.yaml")]
    groups["objective"] += list(OBJECTIVES)  # each registered objective is an option
    # the objectives' own keys (`check` then refuses one the chosen objective lacks)
    extra = {f"objective.{k}" for name in OBJECTIVES for k in objective_keys(name)}
    check_overrides(args, DistillConfig, groups, extra_keys=sorted(extra))
    check_sweep_outputs(args, "trainer.output_dir")


def distill(checkout: Path | None = None) -> None:
    """Hydra main of `train/distill.py`: compose `conf/` + `recipe=NAME` + overrides, train."""
    import hydra  # after argument parsing: --help stays instant

    from dspark.training.schema import (  # after argument parsing: --help stays instant
        register_configs,
    )

    with user_errors("distill"):
        conf = _dir(checkout, "conf")
        recipes = _dir(checkout, "recipes")
        register_configs(recipes)
        check_distill_overrides(sys.argv[1:], conf, recipes)
    hydra.main(version_base=None, config_path=str(conf.resolve()), config_name="config")(
        _distill_job
    )()


# -- eval/benchmark.py -----------------------------------------------------------------------
def _benchmark_job(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig  # after argument parsing: --help stays instant
    from omegaconf import OmegaConf  # after argument parsing: --help stays instant

    with user_errors("benchmark"):
        if OmegaConf.is_missing(cfg, "draft"):
            raise UserError("pass draft=PATH, a DSpark draft directory (save_pretrained)")
        from dspark.eval.runner import run  # after argument parsing: --help stays instant

        out_dir = cfg.output_dir or HydraConfig.get().runtime.output_dir
        with exclusive_output(out_dir, "the benchmark output"):
            _, report = run(cfg, out_dir)
    print(report)
    print(f"results: {out_dir}/results.json")


def benchmark(checkout: Path | None = None) -> None:
    """Hydra main of `eval/benchmark.py`: `conf/benchmark/benchmark.yaml` + overrides."""
    import hydra  # after argument parsing: --help stays instant

    from dspark.eval.benchmark_config import (  # after argument parsing: --help stays instant
        check_overrides,
        register,
    )

    with user_errors("benchmark"):
        conf = _dir(checkout, "conf")
        register()
        check_overrides()
    hydra.main(
        version_base="1.3", config_path=str((conf / "benchmark").resolve()), config_name="benchmark"
    )(_benchmark_job)()
