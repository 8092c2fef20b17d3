"""The benchmark's run config: the one place its keys and defaults live.

`conf/benchmark/benchmark.yaml` only names this schema; Hydra merges command-line overrides
onto it and rejects keys it does not declare. `check_overrides` adds a "did you mean" to that;
`check` refuses values the run cannot use (a count below 1, a policy or dataset that does not
exist), before any model is loaded.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field, fields, is_dataclass

from omegaconf import MISSING, OmegaConf

from dspark.errors import BadInputError, UserError
from dspark.eval.prompts import check_datasets
from dspark.overrides import check_overrides as check_types
from dspark.overrides import check_sweep_outputs

SCHEMA_NAME = "benchmark_schema"
VERIFY_POLICIES = ("full", "threshold", "scheduler")  # SpeculativeDecoder's verify_policy
SCHEDULER_BATCHES = ("padded", "ragged")
DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")


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
    bench_dir: str | None = None  # null: $DSPARK_BENCH_DIR, else the hub (eval/prompts.py)
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
    # the target's dtype; auto: a short probe (AR step, verify, draft round per dtype at this
    # batch, cached per device and target: dspark/dtype_probe.py) picks the fastest speculative
    # decoding; the report shows the figures and the choice
    dtype: str = "float32"
    draft_dtype: str | None = None  # null: the target's dtype; bfloat16 drafts faster on AMX CPUs
    # plain decoding also timed in these dtypes (e.g. [float32,bfloat16]), so the report gives
    # the speedup against the fastest plain decoding on this machine; []: the decoding dtype only
    baseline_dtypes: list[str] = field(default_factory=list)
    # with dtype=auto: a baseline dtype whose probed AR step is over this many times the fastest
    # candidate's is not decoded end to end (the report says so, with the probe's figures);
    # 0: decode every one
    baseline_probe_margin: float = 0.0
    # drafts verified per round: auto (from the draft's held-out acceptance per position and
    # this machine's measured verify-cost curve; the full block without them), full, or 1..gamma
    verify_length: str = "auto"
    # T=0 verify passes attend one query row at a time, as the 1-token step does, so greedy
    # output equals plain greedy in bf16 too (dspark/decoding/row_attention.py; batch 1);
    # null: on for CPUs (its measured cost is in docs/results.md), off elsewhere
    exact_rows: bool | None = None
    probe_repeats: int = 5  # timed calls per figure of the dtype / verify-cost probe (medians)
    probe_refresh: bool = False  # measure again instead of reading the cached probe
    num_threads: int | None = None  # torch CPU threads; null: torch's default
    compile: bool = False  # torch.compile dspark's target forward (both of its decoders)
    output_dir: str | None = None  # null: Hydra's run directory
    plots: bool = True
    baselines: BaselinesConfig = field(default_factory=BaselinesConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)


def register() -> None:
    from hydra.core.config_store import ConfigStore  # light module: defers hydra

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
    """Raise a `UserError` with a 'did you mean' for a `key=value` argument naming no key, and
    one for a value its key's type rejects (`num_prompts=abc`).

    Hydra rejects both too, but in a multi-line block; this makes it one line with the fix.
    """
    args = sys.argv[1:] if argv is None else argv
    known = _keys(BenchmarkConfig)
    for arg in args:
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
    check_types(args, BenchmarkConfig)
    check_sweep_outputs(args, "output_dir")


def _at_least(cfg, key: str, low: int, fix: str, optional: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None and optional:
        return
    if value is None or value < low:
        raise BadInputError(f"{key}={value} must be >= {low}: {fix}")


def _one_of(cfg, key: str, choices: tuple[str, ...], optional: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None and optional:
        return
    if value not in choices:
        none = " or null" if optional else ""
        raise BadInputError(f"{key}={value!r} is not one of {', '.join(choices)}{none}")


def check(cfg) -> None:
    """Raise a `BadInputError` naming the key and its allowed values for a value the run
    cannot use; cheap (no model is loaded), so it runs before anything else."""
    import torch  # light module: defers torch

    from dspark.eval.baselines import BASELINES  # light module: defers torch

    _at_least(cfg, "num_prompts", 1, "the number of conversations per dataset, e.g. 40")
    _at_least(cfg, "max_new_tokens", 1, "the tokens generated per request, e.g. 256")
    _at_least(cfg, "batch_size", 1, "requests per decoder call, e.g. 1")
    _at_least(cfg, "warmup", 0, "untimed warm-up calls per decoder, e.g. 1")
    _at_least(cfg, "top_k", 0, "0 disables the top-k filter")
    _at_least(cfg, "num_threads", 1, "a CPU thread count, or null for torch's default", True)
    _at_least(cfg, "probe_repeats", 1, "timed calls per probe figure, e.g. 5")
    _at_least(cfg, "calibration.bins", 1, "the bins of the reliability diagram, e.g. 20")
    _at_least(cfg, "baselines.assistant_layers", 1, "or null for a quarter of the target's", True)
    _at_least(cfg, "baselines.num_assistant_tokens", 1, "or null for transformers' default", True)
    _at_least(cfg, "baselines.prompt_lookup_num_tokens", 1, "e.g. 10")
    _at_least(cfg, "baselines.prompt_lookup_max_ngram", 1, "e.g. 2")
    if not cfg.temperature >= 0:
        raise BadInputError(
            f"temperature={cfg.temperature} must be >= 0 (0: greedy; e.g. temperature=0.8)"
        )
    if not 0 < cfg.top_p <= 1:
        raise BadInputError(f"top_p={cfg.top_p} must be in (0, 1] (1: no nucleus filter)")
    threshold = cfg.confidence_threshold
    if threshold is not None and not 0 <= threshold <= 1:
        raise BadInputError(
            f"confidence_threshold={threshold} must be in [0, 1] (or null: verify every draft)"
        )
    _one_of(cfg, "verify_policy", VERIFY_POLICIES, optional=True)
    if cfg.verify_policy == "threshold" and threshold is None:
        raise BadInputError(
            "verify_policy=threshold needs confidence_threshold=<0..1>, e.g. "
            "confidence_threshold=0.5"
        )
    _one_of(cfg, "scheduler_batch", SCHEDULER_BATCHES)
    _one_of(cfg, "dtype", DTYPES)
    _one_of(cfg, "draft_dtype", DTYPES, optional=True)
    bad = [d for d in cfg.baseline_dtypes if d not in DTYPES or d == "auto"]
    if bad:
        raise BadInputError(
            f"baseline_dtypes={list(cfg.baseline_dtypes)}: {bad} not a dtype; use float32, "
            "bfloat16 or float16, e.g. baseline_dtypes=[float32,bfloat16]"
        )
    if not cfg.baseline_probe_margin == 0 and not cfg.baseline_probe_margin >= 1:
        raise BadInputError(
            f"baseline_probe_margin={cfg.baseline_probe_margin} must be 0 (decode every baseline "
            "dtype) or >= 1, e.g. baseline_probe_margin=1.25"
        )
    if str(cfg.verify_length).strip().lower() not in ("auto", "full"):
        if not str(cfg.verify_length).strip().isdigit() or int(cfg.verify_length) < 1:
            raise BadInputError(
                f"verify_length={cfg.verify_length!r} must be auto, full or an integer >= 1 "
                "(at most the draft's block size), e.g. verify_length=auto"
            )
    unknown = [b for b in cfg.baselines.run if b not in BASELINES]
    if unknown:
        raise BadInputError(
            f"baselines.run={list(cfg.baselines.run)}: unknown {unknown}; choose from "
            f"{', '.join(BASELINES)}, or baselines.run=[] for none"
        )
    if cfg.device != "auto":
        try:
            device = torch.device(cfg.device)
        except RuntimeError:
            raise BadInputError(
                f"device={cfg.device!r} is not a device; use auto, cpu, cuda or cuda:N"
            ) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BadInputError(
                f"device={cfg.device} but no CUDA device is visible here; use device=cpu (or auto)"
            )
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise BadInputError(
                f"device={cfg.device}: only {torch.cuda.device_count()} CUDA device(s) are "
                "visible; use cuda:0 .. cuda:N-1 (or auto)"
            )
    check_datasets(list(cfg.datasets), cfg.bench_dir)
