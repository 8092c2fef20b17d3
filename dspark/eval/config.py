"""The benchmark's run config: the one place its keys and defaults live.

`conf/benchmark.yaml` only names this schema; Hydra merges command-line overrides onto it
and rejects keys it does not declare. `check_overrides` adds a "did you mean" to that.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field, fields, is_dataclass

from omegaconf import MISSING

from dspark.errors import UserError

SCHEMA_NAME = "benchmark_schema"


@dataclass
class BaselinesConfig:
    # which of transformers' own decoders to time on the same prompts (greedy, batch 1):
    # hf_generate (plain), hf_assisted (truncated self-draft), hf_prompt_lookup; [] for none
    run: list[str] = field(
        default_factory=lambda: ["hf_generate", "hf_assisted", "hf_prompt_lookup"]
    )
    # decoder layers kept by the truncated self-draft (first k layers + final norm + lm_head);
    # null: a quarter of the target's layers, at least 1
    assistant_layers: int | None = None
    # drafts per assisted round; null: transformers' own default
    num_assistant_tokens: int | None = None
    prompt_lookup_num_tokens: int = 10
    prompt_lookup_max_ngram: int = 2


@dataclass
class CalibrationConfig:
    bins: int = 20  # equal-width bins for ECE and the reliability diagram
    survival: bool = True  # also score a_k = prod c_i against prefix acceptance
    sts: bool = True  # fit Sequential Temperature Scaling on half the requests, score the rest


@dataclass
class BenchmarkConfig:
    draft: str = MISSING  # a DSpark draft directory (save_pretrained)
    target: str | None = None  # null: the draft config's target_name_or_path
    # bench file stems in bench_dir (gsm8k, humaneval, mbpp, math500, mt-bench) or `embedded`
    datasets: list[str] = field(
        default_factory=lambda: ["gsm8k", "humaneval", "mt-bench", "embedded"]
    )
    bench_dir: str | None = None  # null: $DSPARK_BENCH_DIR, ../shared/data/bench (eval/prompts.py)
    num_prompts: int = 40  # conversations per dataset (the first N)
    all_turns: bool = False  # every user turn, the target's own answers fed back
    system_prompt: str | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    confidence_threshold: float | None = None  # with verify_policy=threshold (or null policy)
    # full | threshold | scheduler; null: threshold when confidence_threshold is set, else full
    verify_policy: str | None = None
    scheduler_batch: str = "padded"  # padded | ragged: how the scheduler prices a verify pass
    calibrate: bool = True  # apply the draft's confidence_temperatures (STS) when it has them
    batch_size: int = 1  # requests per decoder call (transformers baselines are always 1)
    warmup: int = 1  # untimed warm-up calls per decoder before the first dataset
    seed: int = 0
    device: str = "auto"  # auto: cuda if available, else cpu
    dtype: str = "float32"
    draft_dtype: str | None = None  # null: the target's dtype; bfloat16 drafts faster on AMX CPUs
    num_threads: int | None = None  # torch CPU threads; null: torch's default
    compile: bool = False  # torch.compile dspark's target forward (both of its decoders)
    output_dir: str | None = None  # null: Hydra's run directory
    plots: bool = True
    baselines: BaselinesConfig = field(default_factory=BaselinesConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)


def register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=BenchmarkConfig)


def _keys(cls, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for f in fields(cls):
        out[prefix + f.name] = f
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            out.update(_keys(type(default), prefix + f.name + "."))
    return out


def check_overrides(argv: list[str] | None = None) -> None:
    """Raise a `UserError` with a 'did you mean' for a `key=value` argument naming no key.

    Hydra rejects such keys too; this only makes the message point at the likely spelling.
    """
    known = _keys(BenchmarkConfig)
    for arg in sys.argv[1:] if argv is None else argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra.") or key == "hydra" or key in known:
            continue
        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"unknown config key '{key}' in '{arg}'.{hint} Known keys: {', '.join(sorted(known))}"
        )
