"""The run config of `train/distill.py`: dataclass schemas, each default written here once.

Hydra merges `conf/` group files and a `recipes/` experiment onto `DistillConfig`, so an
unknown or misspelt key, or a value of the wrong type, is an error before anything runs.
Model fields that travel with the weights (`config.json`) are built from `DraftConfig` once,
at draft creation; this run config is never shipped with a checkpoint. Their defaults are not
written here: `DraftConfig` reads `DSparkConfig`'s (dspark/config.py), and the `objective`
section is the chosen objective's own settings dataclass (registered beside it,
dspark/objectives/registry.py; DSpark's, dspark/objectives/dspark_settings.py, read
`LOSS_WEIGHTS`), so they cannot drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from dspark.config import NUM_TARGET_FEATURES, DSparkConfig
from dspark.errors import BadInputError
from dspark.modeling.heads import markov_head_types
from dspark.objectives import OBJECTIVES, objective_defaults, objective_settings
from dspark.paths import find_dir


@dataclass
class TargetConfig:
    name: str = "embedded"  # HF id, local dir, embedded (SmolLM2-135M) or tiny-{llama,qwen2,qwen3}
    dtype: str = "float32"  # the frozen target's own dtype: float32 | bfloat16 | float16
    shard: bool = False  # FSDP2-shard the frozen target over all ranks (training/sharding.py)


@dataclass
class LoraSettings:
    """LoRA fine-tuning of an existing draft (modeling/lora.py); merged whenever it is saved.
    `r=0` (the default) trains every draft weight instead (full fine-tuning)."""

    r: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )


@dataclass
class DraftConfig:
    init_from: str | None = None  # an existing draft dir to fine-tune; None builds a fresh one
    lora: LoraSettings = field(default_factory=LoraSettings)  # draft.lora.r=16 turns LoRA on
    # A fresh draft's init: target_layers copies target decoder layers (modeling/warm_start.py)
    init: str = "target_layers"
    init_layers: list[int] | None = None  # target layers to copy; None: the last num_hidden_layers
    num_hidden_layers: int = DSparkConfig.num_hidden_layers
    block_size: int = DSparkConfig.block_size
    target_layer_ids: list[int] | None = None  # None: spread evenly over 1..N-3
    num_target_layers_tapped: int = NUM_TARGET_FEATURES
    mask_token_id: int | None = None  # None: an unused special token of the tokenizer
    num_anchors: int = DSparkConfig.num_anchors
    markov_rank: int = DSparkConfig.markov_rank  # 0: no Markov head (pure DFlash)
    markov_head_type: str = DSparkConfig.markov_head_type  # one of markov_head_types()
    enable_confidence_head: bool = DSparkConfig.enable_confidence_head
    confidence_head_with_markov: bool = DSparkConfig.confidence_head_with_markov
    # K < the target's vocabulary: the draft scores the K most frequent supervised tokens of
    # data.train (draft_vocab_<K>.json, training/draft_vocab.py); null: all of them
    vocab_size: int | None = DSparkConfig.draft_vocab_size


@dataclass
class DataConfig:
    # a tokenized dataset dir (regenerate.py --tokenize), or several: a,b (CLI: 'data.train="a,b"')
    train: str = MISSING
    eval: str | None = None  # held-out tokenized dir; None: carve eval_fraction off train
    # Offline target features (data_scripts/cache_features.py): a cache of `train` made for this
    # target and draft.target_layer_ids; training then runs no target forward. `eval_features`
    # is the cache of `eval` (needed when `eval` is set; held-out rows carved off `train` read
    # `features`).
    features: str | None = None
    eval_features: str | None = None
    eval_fraction: float = 0.05
    max_eval_rows: int = 256
    max_length: int = 4096
    # Pack several conversations per row (first-fit into rows of max_length, per-document
    # attention and positions in target and draft): batch_size then counts packed rows.
    # Off by default: it changes what a step holds (quickstart shape: 1.6x the tokens per batch
    # for padding 18% -> 9%, eval/padding_share.py), hence step counts and lr schedules of the
    # existing recipes, and on the SDPA path the draft's dense block mask grows with the square
    # of the anchors per row; turn it on for long max_length (train_mix, 4096: padding 40% -> 1%).
    packing: bool = False
    batch_size: int = 4  # sequences (packed rows with packing) per device per micro-step
    num_workers: int = 0
    shuffle: bool = True


@dataclass
class OptimConfig:
    # adamw: AdamW on every trainable parameter. muon: torch.optim.Muon on the draft's hidden
    # matrices (fc, layers.*) and AdamW (lr, weight_decay, betas below) on the rest
    # (training/muon.py); the muon_* keys apply to muon only.
    name: str = "adamw"
    lr: float = 6e-4  # AdamW's lr; Muon's is lr * muon_lr_ratio; the schedule scales both
    weight_decay: float = 0.0
    # torch's AdamW default, which DeepSpec's reference training uses
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0
    # speculators' Muon settings for DFlash / DSpark drafts (torch.optim.Muon's own defaults
    # for momentum (Nesterov), weight decay and Newton-Schulz steps)
    muon_lr_ratio: float = 10.0
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.1  # decoupled: p *= 1 - (Muon lr) * muon_weight_decay a step
    muon_ns_steps: int = 5


@dataclass
class TrainerConfig:
    output_dir: str = "${hydra:runtime.output_dir}"  # runs/<recipe>, or a sweep job's own dir
    epochs: float = 10.0
    max_steps: int | None = None  # overrides epochs when set
    gradient_accumulation_steps: int = 1
    # no (fp32) | bf16 | fp16 (Accelerate's autocast, draft only: the target stays in its dtype)
    # | auto (bf16 on CUDA with bf16 or a CPU with AVX-512-BF16 / AMX, else no)
    mixed_precision: str = "no"
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200  # optimizer steps; 0 disables periodic eval (a final eval still runs)
    save_every: int = 200  # optimizer steps; 0 saves only at the end
    keep_last: int = 2
    # Stop (with an error naming the last good checkpoint) when the loss exceeds this multiple
    # of the first step's loss: a healthy run never climbs 100x above its start. 0: off. A
    # non-finite loss or gradient always stops the run, before the update.
    divergence_factor: float = 100.0
    resume: bool = True  # continue from the newest checkpoint in output_dir when there is one
    # > 0: a long run in bounded chunks. At the first optimizer step past this many minutes of
    # training in this job, save a checkpoint and exit 75 (EX_TEMPFAIL); the same command
    # resumes from it. 0: train to the end.
    stop_after_min: float = 0.0
    attention: str = "auto"  # auto | sdpa | flex (flex needs CUDA)
    threads: int | None = None  # torch CPU threads; None keeps torch's default
    # > 0: at the end, fit STS confidence temperatures on this many held-out prompts decoded by
    # the published draft and ship them in its config.json (dspark/training/calibrate.py)
    calibrate_prompts: int = 0
    calibrate_max_new_tokens: int = 64


@dataclass
class TrackingConfig:
    # wandb | tensorboard | trackio | mlflow | none, through Accelerate's trackers; the local
    # metrics.jsonl is always written (dspark/training/tracking.py)
    backend: str = "wandb"
    project: str = "dspark"  # W&B / Trackio project, MLflow experiment, TensorBoard subfolder
    run_name: str | None = None
    mode: str = "auto"  # W&B only: auto (online if WANDB_API_KEY, else offline), online, offline


@dataclass
class DistillConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # The objective's own keys beside its name (objective=NAME picks one and its defaults): each
    # objective declares them (dspark/objectives/registry.py); `check` refuses a key the chosen
    # one lacks and fills the defaults of those not set.
    objective: dict[str, Any] = field(default_factory=lambda: {"name": "dspark"})
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


# Each key's allowed values (a function: read when checked, e.g. the registered heads).
_CHOICES: dict[tuple[str, str], Any] = {
    ("draft", "markov_head_type"): markov_head_types,
    ("draft", "init"): ("random", "target_layers"),
    ("trainer", "mixed_precision"): ("no", "bf16", "fp16", "auto"),
    ("trainer", "attention"): ("auto", "sdpa", "flex"),
    ("tracking", "backend"): ("wandb", "tensorboard", "trackio", "mlflow", "none"),
    ("tracking", "mode"): ("auto", "online", "offline"),
    ("target", "dtype"): ("float32", "bfloat16", "float16", "auto"),
    ("optim", "name"): ("adamw", "muon"),
}


# (section, key) -> (lowest allowed, whether the bound itself is allowed, what the key means).
# A value outside its range is never what a user meant (epochs=-1 used to train one step).
_BOUNDS: dict[tuple[str, str], tuple[float, bool, str]] = {
    ("draft", "num_hidden_layers"): (1, True, "draft decoder layers"),
    ("draft", "num_target_layers_tapped"): (1, True, "target layers the draft reads"),
    ("draft", "num_anchors"): (1, True, "blocks sampled per sequence"),
    ("data", "max_eval_rows"): (1, True, "held-out rows"),
    ("data", "max_length"): (2, True, "tokens per row"),
    ("data", "batch_size"): (1, True, "rows per device per micro-step"),
    ("data", "num_workers"): (0, True, "loader worker processes"),
    ("optim", "lr"): (0, False, "the learning rate"),
    ("optim", "weight_decay"): (0, True, "AdamW's weight decay"),
    ("optim", "warmup_ratio"): (0, True, "the warm-up share of all steps"),
    ("optim", "min_lr_ratio"): (0, True, "the cosine floor as a share of lr"),
    ("optim", "grad_clip"): (0, True, "the gradient-norm clip (0: off)"),
    ("optim", "muon_lr_ratio"): (0, False, "Muon's lr as a multiple of optim.lr"),
    ("optim", "muon_momentum"): (0, True, "Muon's momentum"),
    ("optim", "muon_weight_decay"): (0, True, "Muon's weight decay"),
    ("optim", "muon_ns_steps"): (1, True, "Muon's Newton-Schulz steps"),
    ("trainer", "epochs"): (0, False, "passes over the training set"),
    ("trainer", "gradient_accumulation_steps"): (1, True, "micro-steps per optimizer step"),
    ("trainer", "stop_after_min"): (0, True, "minutes of training per job (0: to the end)"),
    ("trainer", "log_every"): (1, True, "optimizer steps between log rows"),
    ("trainer", "eval_every"): (0, True, "optimizer steps between evals (0: only at the end)"),
    ("trainer", "save_every"): (
        0,
        True,
        "optimizer steps between checkpoints (0: only at the end)",
    ),
    ("trainer", "keep_last"): (1, True, "checkpoints kept"),
    ("trainer", "divergence_factor"): (0, True, "the loss blow-up that stops a run (0: off)"),
    ("trainer", "calibrate_prompts"): (0, True, "STS prompts (0: no fit)"),
    ("trainer", "calibrate_max_new_tokens"): (1, True, "tokens per STS prompt"),
}
# Keys that may be null; when set they obey the same kind of bound.
_OPTIONAL_BOUNDS: dict[tuple[str, str], tuple[float, str]] = {
    ("trainer", "max_steps"): (1, "optimizer steps (null: from trainer.epochs)"),
    ("trainer", "threads"): (1, "torch CPU threads (null: torch's default)"),
    # the upper bound, the target's vocabulary size, is checked when the target is loaded
    ("draft", "vocab_size"): (1, "draft vocabulary tokens (null: the target's full vocabulary)"),
}


def _check_bounds(cfg: Any) -> None:
    for (group, key), (low, inclusive, what) in _BOUNDS.items():
        value = cfg[group][key]
        ok = math.isfinite(value) and (value >= low if inclusive else value > low)
        if not ok:
            op = ">=" if inclusive else ">"
            raise BadInputError(f"{group}.{key}={value} is out of range: {what}, {op} {low}")
    for (group, key), (low, what) in _OPTIONAL_BOUNDS.items():
        value = cfg[group][key]
        if value is not None and value < low:
            raise BadInputError(f"{group}.{key}={value} is out of range: {what}, >= {low}")
    if not 0.0 <= cfg.optim.warmup_ratio < 1.0:
        raise BadInputError(f"optim.warmup_ratio={cfg.optim.warmup_ratio} must be in [0, 1)")
    if len(cfg.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optim.betas):
        raise BadInputError(f"optim.betas={list(cfg.optim.betas)} must be two numbers in [0, 1)")
    if not cfg.optim.muon_momentum < 1.0:
        raise BadInputError(f"optim.muon_momentum={cfg.optim.muon_momentum} must be in [0, 1)")
    if not cfg.optim.muon_ns_steps < 100:  # torch.optim.Muon's own limit
        raise BadInputError(f"optim.muon_ns_steps={cfg.optim.muon_ns_steps} must be below 100")
    layers = cfg.draft.init_layers
    if layers is not None and len(layers) != cfg.draft.num_hidden_layers:
        raise BadInputError(
            f"draft.init_layers={list(layers)} names {len(layers)} target layers for "
            f"draft.num_hidden_layers={cfg.draft.num_hidden_layers}: name one per draft layer, "
            "or null for the target's last ones"
        )


def check(cfg: Any) -> None:
    """Value checks a type cannot express; each error (a `BadInputError`, i.e. a ValueError
    and a user error) names the key, the allowed values and the fix."""
    if OmegaConf.is_missing(cfg.data, "train"):
        raise BadInputError(
            "data.train is not set: pass data.train=DIR, a tokenized dataset "
            "(python data_scripts/regenerate.py ... --tokenize writes DIR/tokenized)"
        )
    for (group, key), choices in _CHOICES.items():
        allowed = choices() if callable(choices) else choices
        value = cfg[group][key]
        if value not in allowed:
            raise BadInputError(f"{group}.{key}={value!r} is not one of {allowed}")
    _check_bounds(cfg)
    settings = objective_settings(cfg.objective)  # its own keys, types and ranges
    name = str(cfg.objective.get("name", "dspark"))
    values = objective_defaults(name)
    values.update({k: getattr(settings, k) for k in values if k != "name"})
    cfg.objective = values  # every key, as run_config.json records it
    if cfg.draft.block_size < 1:
        raise BadInputError(f"draft.block_size must be >= 1, got {cfg.draft.block_size}")
    if cfg.draft.lora.r < 0:
        raise BadInputError("draft.lora.r must be >= 0 (0: no LoRA, every draft weight trains)")
    if cfg.optim.name == "muon" and cfg.draft.lora.r > 0:
        raise BadInputError(
            "optim.name=muon with draft.lora.r > 0: LoRA factors train with AdamW "
            "(dspark/training/muon.py), so Muon would train nothing; use optim.name=adamw, or "
            "draft.lora.r=0 for a full fine-tune with Muon"
        )
    if cfg.draft.markov_rank < 0:
        raise BadInputError("draft.markov_rank must be >= 0 (0 disables the Markov head)")
    if not 0.0 <= cfg.data.eval_fraction < 1.0:
        raise BadInputError("data.eval_fraction must be in [0, 1)")
    d = cfg.data
    if d.eval_features and not (d.features and d.eval):
        raise BadInputError(
            "data.eval_features is the feature cache of data.eval: set data.eval and "
            "data.features (the cache of data.train) with it, or drop it"
        )
    if d.features and d.eval and not d.eval_features:
        raise BadInputError(
            "data.features is set and data.eval names its own held-out set: set "
            "data.eval_features to a cache of data.eval (data_scripts/cache_features.py), or "
            "drop data.eval to carve the held-out rows off data.train"
        )


def register_configs(recipes_dir: Path | None = None) -> None:
    """Register the schema and every `recipes/*.yaml` as the `recipe` group (`recipe=NAME`).

    `recipes_dir=None` finds it by `dspark.paths.find_dir` ($DSPARK_RECIPES, ./recipes, the
    editable checkout); the scripts pass their own checkout's."""
    if recipes_dir is None:
        recipes_dir = find_dir("recipes")
    cs = ConfigStore.instance()
    cs.store(name="distill_schema", node=DistillConfig)
    for name in OBJECTIVES:  # objective=NAME: the name and its settings' defaults
        cs.store(group="objective", name=name, node=objective_defaults(name))
    for path in sorted(recipes_dir.glob("*.yaml")):
        cs.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="_global_")
