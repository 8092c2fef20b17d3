"""`export_draft`: write a draft in a serving layout, atomically, refusing what engines misserve."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from dspark.export.checks import serving_problems
from dspark.export.layouts import (
    FAMILY_ARCHITECTURES,
    deepspec_config,
    export_state,
    speculators_config,
)

FORMATS = ("deepspec", "speculators")
ENGINES = ("vllm", "any")  # vllm: refuse what vLLM / SGLang would serve wrong; any: write anyway
DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


class NotServableError(ValueError):
    """The draft would be served wrong by the engines the export is for; the message says why."""


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"export dtype must be bfloat16 or float32 (got {dtype})")
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(
            f"unknown export dtype {dtype!r}; use bfloat16 (default) or float32"
        ) from None


def resolve_verifier(config, verifier: str | None) -> tuple[str, list[str]]:
    """The target name engines should load (a local dir for embedded / tiny / path targets, else
    the hub id) and its `architectures`."""
    from dspark.target.loading import EMBEDDED_ALIASES, TINY_PREFIX, resolve_target

    name = verifier or config.target_name_or_path
    if not name:
        raise ValueError(
            "the draft's config names no target (target_name_or_path); pass verifier=/--target"
        )
    if name in EMBEDDED_ALIASES or name.startswith(TINY_PREFIX) or Path(name).expanduser().exists():
        name = str(Path(resolve_target(name)).resolve())
    archs: list[str] = []
    cfg_file = Path(name) / "config.json"
    if cfg_file.is_file():
        archs = json.loads(cfg_file.read_text()).get("architectures") or []
    if not archs:
        archs = [FAMILY_ARCHITECTURES[config.target_model_type]]
    return name, archs


def export_draft(
    draft,
    out_dir: str | os.PathLike,
    fmt: str = "deepspec",
    *,
    dtype: str | torch.dtype = "bfloat16",
    engine: str = "vllm",
    verifier: str | None = None,
    draft_vocab=None,
    overwrite: bool = False,
) -> Path:
    """Write `draft` (a `DSparkDraftModel` or a draft directory of any layout) to `out_dir`.

    `fmt`: deepspec | speculators. `dtype`: bfloat16 (default) | float32. `engine="vllm"` refuses
    (NotServableError, with the reasons) a draft that vLLM / SGLang would serve wrong;
    `engine="any"` writes it and lists the reasons in the README. `verifier`: the target's name
    for engines (default: the draft's `target_name_or_path`). `draft_vocab`: target ids to keep
    (a tensor / list, or a .json / .safetensors / .pt file with ids or d2t) for a reduced draft
    vocabulary. Written to a temporary sibling directory and renamed: a failed export leaves
    nothing behind, and an existing `out_dir` is replaced only with `overwrite=True`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {FORMATS}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; use one of {ENGINES}")
    torch_dtype = _dtype(dtype)
    source = "a DSparkDraftModel in memory"
    if not isinstance(draft, torch.nn.Module):
        from dspark.export.load import load_draft

        source = str(draft)
        draft = load_draft(draft)
    from dspark.training.lora import has_lora, merged_copy

    if has_lora(draft):  # LoRA-fine-tuned in memory: export the merged weights
        draft = merged_copy(draft)
    config = draft.config
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose a new directory or pass overwrite=True")

    kept = None
    if draft_vocab is not None:
        from dspark.export.vocab import mapping_from_ids, read_vocab_file

        V = int(config.vocab_size)
        if isinstance(draft_vocab, (str, os.PathLike)):
            kept = read_vocab_file(draft_vocab, V)
        else:
            kept = torch.unique(torch.as_tensor(draft_vocab, dtype=torch.long))
            mapping_from_ids(draft_vocab, V)
    K = None if kept is None else int(kept.numel())

    problems = serving_problems(config, draft.state_dict().keys())
    if problems and engine == "vllm":
        raise NotServableError(
            "upstream vLLM / SGLang would not serve this draft as trained:\n- "
            + "\n- ".join(problems)
            + "\nPass engine='any' (--engine any) to export it anyway for DeepSpec or the "
            "speculators package."
        )
    target, archs = resolve_verifier(config, verifier)
    if fmt == "deepspec":
        cfg = deepspec_config(config, dtype=torch_dtype, draft_vocab_size=K)
    else:
        cfg = speculators_config(
            config,
            dtype=torch_dtype,
            draft_vocab_size=K,
            verifier=target,
            verifier_architectures=archs,
        )
    state = export_state(draft, torch_dtype, kept)

    from safetensors.torch import save_file

    from dspark.export.readme import render

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(
            render(
                fmt=fmt,
                config=config,
                draft_dir=str(out),
                target=target,
                dtype=str(torch_dtype).removeprefix("torch."),
                draft_vocab_size=K,
                problems=problems,
                source=source,
            )
        )
        tmp.chmod(0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
