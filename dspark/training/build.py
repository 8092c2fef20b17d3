"""Build the parts of a distillation run from its (validated) run config."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from datasets import concatenate_datasets, load_from_disk
from torch.utils.data import DataLoader

from dspark.config import DSparkConfig, choose_mask_token_id
from dspark.data.collate import PadCollator
from dspark.data.features.feature_cache import target_identity
from dspark.data.features.feature_dataset import ROW_COLUMN, CachedFeatureDataset, FeatureCache
from dspark.data.features.summary_cache import load_or_summarize
from dspark.data.packing import PackedDataset
from dspark.data.tokenize import MANIFEST, chat_template_hash, tokenizer_hash
from dspark.errors import BadInputError, MissingPathError
from dspark.export import load_draft
from dspark.locking import refuse_if_being_written
from dspark.modeling import DSparkDraftModel
from dspark.modeling.lora import apply_lora
from dspark.modeling.warm_start import warm_start_from_target
from dspark.objectives import ObjectiveContext, build_objective_from_config
from dspark.target import load_target
from dspark.target.capture import BatchFeatures, target_summary
from dspark.training.draft_vocab import choose_draft_vocab, requested_size, vocab_path

# Text whose target activations calibrate a warm start's q/k norms (any ordinary prose works).
CALIBRATION_TEXT = (
    "Speculative decoding lets a small draft model propose several tokens that the large target "
    "model then verifies in a single forward pass. If the draft is accurate, many tokens are "
    "accepted at once, and generation becomes faster while the output distribution stays the "
    "same. Question: a train travels 60 miles in 1.5 hours; what is its average speed? Answer: "
    "60 / 1.5 = 40 miles per hour."
)


def build_draft(
    cfg,
    device: torch.device,
    *,
    main_first: Callable[[], AbstractContextManager] | None = None,
):
    """The frozen target, its tokenizer, and the draft (fresh from the target, or `init_from`).

    A fresh draft with `draft.vocab_size=K` counts its vocabulary in `data.train`: the
    vocabulary file is read or written inside `main_first()` (the loop passes
    `accelerator.main_process_first`: the main process writes, the others then read)."""
    target, tokenizer = load_target(cfg.target.name, dtype=cfg.target.dtype, device=device)
    d = cfg.draft
    V = int(target.config.vocab_size)
    if d.init_from:
        draft = load_draft(d.init_from).train()  # names the layouts it knows on a bad dir
        if draft.config.hidden_size != target.config.hidden_size:
            raise BadInputError(
                f"draft.init_from={d.init_from} was trained for a target of hidden size "
                f"{draft.config.hidden_size}, but {cfg.target.name} has "
                f"{target.config.hidden_size}"
            )
        draft.freeze_target_copies()
        _check_init_vocab(cfg, draft, V)
    else:
        vocab = None
        if requested_size(cfg, V) is not None:  # the range check before any data work
            with (main_first or nullcontext)():
                vocab = choose_draft_vocab(cfg, V)
        try:
            config = _draft_config(cfg, target, tokenizer, None if vocab is None else vocab.size)
        except ValueError as e:  # DSparkConfig's own checks on values the user chose
            raise BadInputError(
                f"draft settings: {e} (the draft.* keys of the run config)"
            ) from None
        draft = DSparkDraftModel.from_target(
            target, config, kept_ids=None if vocab is None else vocab.ids
        )
        if d.init == "target_layers":
            calib = tokenizer(CALIBRATION_TEXT, return_tensors="pt")["input_ids"].to(device)
            warm_start_from_target(draft, target, d.init_layers, calib)
    lora = getattr(d, "lora", None)
    if lora is not None and lora.r > 0:
        apply_lora(draft, lora.r, lora.alpha, lora.target_modules, lora.dropout)
    draft.attn_backend = cfg.trainer.attention  # sdpa | flex | auto (flex on CUDA)
    return target, tokenizer, draft.to(device)


def _check_init_vocab(cfg, draft, vocab_size: int) -> None:
    """`draft.vocab_size` with `draft.init_from` must describe the draft that is loaded: its
    vocabulary was fixed when it was trained."""
    asked = requested_size(cfg, vocab_size)
    has = draft.config.draft_vocab_size
    if getattr(cfg.draft, "vocab_size", None) is not None and asked != has:
        raise BadInputError(
            f"draft.vocab_size={cfg.draft.vocab_size} but draft.init_from={cfg.draft.init_from} "
            f"scores {has or vocab_size} tokens: drop draft.vocab_size (a loaded draft keeps "
            f"its vocabulary), or set draft.vocab_size={has}"
        )


def draft_vocab_record(cfg, draft) -> dict | None:
    """What a run records about its draft's vocabulary (None: the full one): the file the
    ids came from and their coverage of the supervised tokens, or the draft it was loaded
    from."""
    K = draft.config.draft_vocab_size
    if K is None:
        return None
    if cfg.draft.init_from:
        return {"size": int(K), "from": str(cfg.draft.init_from)}

    path = vocab_path(cfg, int(K))
    doc = json.loads(path.read_text())
    return {"file": str(path), "size": int(K), "coverage": float(doc["coverage"])}


def _draft_config(cfg, target, tokenizer, draft_vocab_size: int | None = None):
    """A fresh draft's model config from the run config's `draft.*` keys and the target."""
    d = cfg.draft
    return DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=d.num_hidden_layers,
        block_size=d.block_size,
        target_layer_ids=list(d.target_layer_ids) if d.target_layer_ids is not None else None,
        num_target_features=d.num_target_layers_tapped,
        mask_token_id=d.mask_token_id
        if d.mask_token_id is not None
        else choose_mask_token_id(tokenizer, target.config.vocab_size),
        num_anchors=d.num_anchors,
        markov_rank=d.markov_rank,
        markov_head_type=d.markov_head_type,
        enable_confidence_head=d.enable_confidence_head,
        confidence_head_with_markov=d.confidence_head_with_markov,
        target_name_or_path=cfg.target.name,
        draft_vocab_size=draft_vocab_size,
    )


def build_objective_for(cfg, target, draft_config):
    """The objective `cfg.objective` names, built from its own settings; with `data.features`
    it reads cached features from the batch instead of running the target (whose lm_head
    still gives the target distribution)."""
    context = ObjectiveContext(
        target,
        draft_config,
        seed=cfg.trainer.seed,  # anchor sampling; its RNG state is checkpointed
        feature_source=BatchFeatures() if cfg.data.features else None,
    )
    return build_objective_from_config(cfg.objective, context)


# The command that makes a data dir, named by the error a missing one gives (`make debug-data`
# runs it for recipe=debug; README's "Train" section has the others).
DATA_COMMAND = (
    "python data_scripts/regenerate.py --target TARGET --input PROMPTS --output DIR --tokenize"
)


def require_data(cfg) -> None:
    """Every data dir the run reads exists (training reads data, it never makes it): a
    missing one is a `MissingPathError` naming the command that makes it."""
    d = cfg.data
    specs = [("data.train", d.train), ("data.eval", d.eval)]
    for key, spec in specs:
        for path in [p.strip() for p in str(spec or "").split(",") if p.strip()]:
            p = Path(path).expanduser()
            if p.exists():
                continue
            raise MissingPathError(
                f"{key}={path} does not exist: training reads a tokenized set, it never makes "
                f"one. Make it first with `{DATA_COMMAND}` (it writes DIR/tokenized; "
                f"`make debug-data` makes recipe=debug's), or point {key} at an existing set"
            )


def open_feature_caches(cfg, target, draft_config):
    """`(train_cache, eval_cache)` of `data.features` / `data.eval_features` (None when unset),
    each checked against this run's target, the draft's tapped layers and its tokenized set."""
    d = cfg.data
    if target is None or draft_config is None:
        raise ValueError("data.features needs the run's target and draft config to check it")
    ident = target_identity(target)
    caches = []
    for what, cache_dir, data_dir in (
        ("data.features", d.features, d.train),
        ("data.eval_features", d.eval_features, d.eval),
    ):
        if not cache_dir:
            caches.append(None)
            continue
        cache = FeatureCache(cache_dir)
        cache.validate(
            target_identity=ident,
            layer_ids=draft_config.target_layer_ids,
            data_dir=Path(data_dir).expanduser(),
            what=what,
        )
        caches.append(cache)
    return tuple(caches)


def check_tokenized_for(data_dir: Path, tokenizer, target_name: str) -> None:
    """Refuse a tokenized set made with another tokenizer or chat template than the run's
    target (its `manifest.json` records both hashes): its ids would mean other tokens, and
    its loss mask other turns. A set without a manifest (made by other tools) is taken as is."""
    path = data_dir / MANIFEST
    if tokenizer is None or not path.is_file():
        return
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInputError(f"{path} is not valid JSON ({e}): re-tokenize the set") from None
    for what, key, ours in (
        ("tokenizer", "tokenizer_hash", tokenizer_hash),
        ("chat template", "chat_template_hash", chat_template_hash),
    ):
        theirs = manifest.get(key)
        if theirs is not None and theirs != ours(tokenizer):
            raise BadInputError(
                f"{data_dir} was tokenized for target {manifest.get('target')!r}, whose {what} "
                f"differs from target.name={target_name!r}'s: train with "
                f"target.name={manifest.get('target')}, or tokenize the set for this target "
                f"(python data_scripts/tokenize_data.py --target {target_name} ...)"
            )


def check_split(rows: int, eval_fraction: float, train: str) -> None:
    """The held-out carve-off leaves at least one row on each side (datasets' own error
    names `test_size`, a key the user never set)."""
    held_out = math.ceil(rows * eval_fraction)
    if eval_fraction <= 0 or held_out < 1 or rows - held_out < 1:
        raise BadInputError(
            f"data.train={train} has {rows} row(s): data.eval_fraction={eval_fraction} carves "
            f"{held_out} held-out row(s) off it, leaving {rows - held_out} to train on. Use more "
            "rows, another data.eval_fraction, or a held-out set of its own (data.eval=DIR)"
        )


def load_datasets(cfg, tokenizer, target=None, draft_config=None):
    """Train and held-out splits of a tokenized dataset dir (`input_ids`, `loss_mask`).

    With `data.features` the splits are `CachedFeatureDataset`s whose rows also carry the
    cached `tapped` / `final_hidden` (checked against `target` and `draft_config`)."""
    cached = bool(cfg.data.get("features"))

    def load(spec: str):
        """One tokenized dir, or several joined by commas (concatenated in that order)."""
        paths = [p.strip() for p in str(spec).split(",") if p.strip()]
        if cached and len(paths) > 1:
            raise ValueError(
                f"data.features caches one tokenized set, but {spec!r} joins {len(paths)}; "
                "tokenize the sets into one directory and cache that, or drop data.features"
            )
        parts = [load_one(p) for p in paths]
        return parts[0] if len(parts) == 1 else concatenate_datasets(parts)

    def load_one(path: str):
        p = Path(path).expanduser()
        if not p.exists():
            raise MissingPathError(
                f"data dir {p} does not exist. Make one with `python data_scripts/regenerate.py "
                f"... --tokenize` (see README), or point data.train at an existing tokenized set."
            )
        if not (p / "state.json").exists():  # what `save_to_disk` writes; else datasets' OSError
            hint = (
                " (its tokenized/ subfolder?)" if (p / "tokenized" / "state.json").exists() else ""
            )
            raise BadInputError(
                f"{p} is not a tokenized dataset{hint}: point data.train / data.eval at the "
                "directory `data_scripts/regenerate.py ... --tokenize` writes (OUTPUT/tokenized)"
            )
        # a set, or the regeneration (its run.json) it is tokenized from, another job writes
        refuse_if_being_written(p, "data dir")
        if (p.parent / "run.json").is_file():
            refuse_if_being_written(p.parent, "data dir")
        check_tokenized_for(p, tokenizer, cfg.target.name if "target" in cfg else "")
        ds = load_from_disk(str(p))
        missing = {"input_ids", "loss_mask"} - set(ds.column_names)
        if missing:
            raise BadInputError(
                f"{p} lacks columns {sorted(missing)}; it is not a tokenized training set "
                "(make one with `data_scripts/tokenize_data.py`)"
            )
        columns = ["input_ids", "loss_mask"]
        if cached:  # each row keeps its number in the cached set through splits and subsets
            ds = ds.add_column(ROW_COLUMN, list(range(len(ds))))
            columns.append(ROW_COLUMN)
        return ds.select_columns(columns)

    train = load(cfg.data.train)
    if cfg.data.eval:
        held_out = load(cfg.data.eval)
    else:
        check_split(len(train), cfg.data.eval_fraction, cfg.data.train)
        split = train.train_test_split(test_size=cfg.data.eval_fraction, seed=cfg.trainer.seed)
        train, held_out = split["train"], split["test"]
    if len(held_out) > cfg.data.max_eval_rows:
        held_out = held_out.select(range(cfg.data.max_eval_rows))
    if len(train) == 0 or len(held_out) == 0:
        raise ValueError(f"empty split: {len(train)} train rows, {len(held_out)} held-out rows")
    if cached:
        train_cache, eval_cache = open_feature_caches(cfg, target, draft_config)
        eval_cache = eval_cache or train_cache
        if draft_config.is_reduced_vocab:
            # the target's logsumexp / argmax over all V, once per position: each step then
            # needs its logits at the K kept ids only (DSparkObjective._slot_loss)
            train_sums, eval_sums = cache_summaries(
                target, (train, train_cache), (held_out, eval_cache)
            )
        else:
            train_sums = eval_sums = None
        train = CachedFeatureDataset(train, train_cache, train_sums)
        held_out = CachedFeatureDataset(held_out, eval_cache, eval_sums)
    return train, held_out


def cache_summaries(target, *splits) -> list[dict]:
    """`summarize_rows` of each `(tokenized split, its FeatureCache)` with the target's head,
    read back from `$DSPARK_CACHE/target_summaries/` for the rows an earlier run on the same
    cache and head already summarized (summary_cache.py)."""
    head = target.get_output_embeddings()
    device = head.weight.device

    def summarize(final: torch.Tensor):
        return target_summary(head, final.to(device))

    return [load_or_summarize(ds, cache, head, summarize) for ds, cache in splits]


def make_loader(ds, tokenizer, cfg, shuffle: bool) -> DataLoader:
    """Batches of `data.batch_size` rows, right-padded; with `data.packing` a row is several
    conversations first-fit into `data.max_length` tokens (packed once, seeded by
    `trainer.seed`; the loader shuffles the packed rows every epoch)."""
    if cfg.data.packing:
        ds = PackedDataset(ds, cfg.data.max_length, seed=cfg.trainer.seed)
    return DataLoader(
        ds,
        batch_size=cfg.data.batch_size,
        shuffle=shuffle,
        num_workers=cfg.data.num_workers,
        drop_last=False,
        collate_fn=PadCollator(tokenizer.pad_token_id, max_length=cfg.data.max_length),
    )
