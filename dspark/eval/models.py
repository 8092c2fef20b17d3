"""The benchmark's models: the target and draft on the configured device and dtype
(`load_models`), refused early when the draft does not fit the target."""

from __future__ import annotations

import sys

import torch

from dspark.errors import BadInputError, require_draft_dir
from dspark.export.load import load_draft
from dspark.target.loading import _as_dtype, load_target


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_draft_fits_target(draft_config, target_config, draft: str, target: str) -> None:
    """Refuse a draft whose dimensions do not fit the target (hidden size, vocabulary, a tapped
    layer the target lacks): it would crash deep in the decoder or index past the vocabulary.
    A draft that fits but names another target only gets a warning: it runs, with whatever
    acceptance it has there."""
    trained_for = getattr(draft_config, "target_name_or_path", None) or "an unnamed target"
    n_layers = int(target_config.num_hidden_layers)
    taps = [int(i) for i in draft_config.target_layer_ids]
    wrong = []
    if int(draft_config.hidden_size) != int(target_config.hidden_size):
        wrong.append(
            f"hidden size {draft_config.hidden_size} vs the target's {target_config.hidden_size}"
        )
    if int(draft_config.vocab_size) != int(target_config.vocab_size):
        wrong.append(
            f"vocabulary {draft_config.vocab_size} vs the target's {target_config.vocab_size}"
        )
    if max(taps) >= n_layers:
        wrong.append(f"tapped layers {taps} vs the target's {n_layers} layers")
    if wrong:
        raise BadInputError(
            f"draft={draft} was trained for {trained_for} and does not fit target={target}: "
            f"{'; '.join(wrong)}. Pass the target it was trained for (target={trained_for}, "
            "or leave target unset to use the draft's own), or a draft trained for this target"
        )
    trained_layers = getattr(draft_config, "num_target_layers", None)
    family = getattr(draft_config, "target_model_type", None)
    other_layers = trained_layers is not None and int(trained_layers) != n_layers
    other_family = family is not None and family != getattr(target_config, "model_type", family)
    if other_layers or other_family:
        print(
            f"warning: draft={draft} was trained for {trained_for} ({family}, "
            f"{trained_layers} layers), but target={target} is a {target_config.model_type} "
            f"target of {n_layers} layers: the dimensions fit, so it runs, but acceptance "
            "there is likely low",
            file=sys.stderr,
        )


def load_models(cfg, probe_dtype: bool = False):
    """(target, tokenizer, draft, target spec) on the configured device and dtype.

    `probe_dtype` (the benchmark): `dtype=auto` loads fp32, which `auto_settings.choose` then
    casts to the measured choice; other callers keep `auto` = the checkpoint's dtype."""
    device = resolve_device(cfg.device)
    # auto: loaded in fp32, then cast to the probe's choice (auto_settings.choose)
    dtype = torch.float32 if probe_dtype and cfg.dtype == "auto" else _as_dtype(cfg.dtype)
    # load_draft: a missing or damaged weights file is one error line naming it
    draft = load_draft(require_draft_dir(cfg.draft, "draft"))
    spec = cfg.target or getattr(draft.config, "target_name_or_path", None)
    if not spec:
        raise BadInputError(
            f"the draft at {cfg.draft} names no target_name_or_path; pass target=..."
        )
    target, tokenizer = load_target(spec, dtype=dtype, device=device)
    check_draft_fits_target(draft.config, target.config, cfg.draft, spec)
    # The draft may run in a cheaper dtype than the target (bf16 on AMX / tensor-core
    # hardware): verification by the target keeps decoding lossless whatever the draft proposes.
    wanted = getattr(cfg, "draft_dtype", None)  # the benchmark's key; other callers pass argparse
    draft_dtype = _as_dtype(wanted) if wanted not in (None, "auto") else target.dtype
    draft.to(device=device, dtype=draft_dtype).eval().requires_grad_(False)
    return target, tokenizer, draft, spec
