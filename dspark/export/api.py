"""`export_draft`: write a draft in a serving layout, atomically, refusing what engines misserve.

Every export holds `export.json` (format, dtype, source, dspark version): it is what makes a
directory recognisable as an export, and `overwrite=True` replaces only such a directory, never
the source draft, a directory around or inside it, or a training run directory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import dspark
from dspark.errors import BadInputError, UserError
from dspark.export.checks import serving_problems
from dspark.export.gguf import write_gguf
from dspark.export.layouts import (
    FAMILY_ARCHITECTURES,
    deepspec_config,
    export_state,
    speculators_config,
)
from dspark.export.load import load_draft, read_json
from dspark.export.readme import render, render_llama_cpp
from dspark.fileio import dumps_strict, staged_dir
from dspark.locking import exclusive_output
from dspark.target.loading import EMBEDDED_ALIASES, TINY_PREFIX, resolve_target

FORMATS = ("deepspec", "speculators", "gguf")
GGUF_FILE = "draft.gguf"  # the llama.cpp export: one GGUF file beside README.md / export.json
ENGINES = ("vllm", "any")  # vllm: refuse what vLLM / SGLang would serve wrong; any: write anyway
DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


PROVENANCE = "export.json"
# what an export directory holds; anything else in it is not ours to delete
EXPORT_FILES = frozenset({"config.json", "model.safetensors", GGUF_FILE, "README.md", PROVENANCE})
# what a training run directory holds (train/distill.py): an export never replaces one
RUN_MARKERS = ("checkpoints", "run_config.json", "metrics.jsonl")


class NotServableError(BadInputError):
    """The draft would be served wrong by the engines the export is for; the message says why."""


class OutputExistsError(UserError, FileExistsError):
    """The output directory exists and is not replaced (no overwrite, or not an export)."""


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.bfloat16, torch.float32):
            raise BadInputError(f"export dtype must be bfloat16 or float32 (got {dtype})")
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise BadInputError(
            f"unknown export dtype {dtype!r}; use bfloat16 (default) or float32"
        ) from None


def _run_dir(path: Path) -> Path | None:
    """`path` or one of its subdirectories if it is a training run directory, else None."""
    for p in (path, *(c for c in path.iterdir() if c.is_dir())):
        if any((p / m).exists() for m in RUN_MARKERS):
            return p
    return None


def _not_an_export(path: Path) -> str | None:
    """Why the directory `path` is not one `export_draft` wrote (None if it is): it holds
    entries an export does not write, or neither `export.json` nor (exports written before
    that file existed) the README's own heading."""
    foreign = sorted(c.name for c in path.iterdir() if c.name not in EXPORT_FILES or c.is_dir())
    if foreign:
        more = ", ..." if len(foreign) > 8 else ""
        return f"it holds {', '.join(foreign[:8])}{more}, which an export does not write"
    if (path / PROVENANCE).is_file():
        return None
    readme = path / "README.md"
    if readme.is_file() and readme.read_text(errors="replace").startswith("# DSpark draft ("):
        return None
    return f"it holds no {PROVENANCE}"


def check_output(out: Path, source: Path | None, overwrite: bool) -> None:
    """Refuse an output directory whose replacement would lose what was written before.

    `out` and `source` (the draft directory read, None for a model in memory) are resolved.
    Never allowed: `out` is the source, holds it or lies inside it; `out` is (or holds) a
    training run directory. An existing `out` is replaced only with `overwrite` and only when
    it is a previous export.
    """
    fix = "choose a new output directory, e.g. exports/NAME"
    if source is not None:
        if out == source:
            raise BadInputError(
                f"the output directory {out} is the source draft itself: exporting would replace "
                f"the draft it reads; {fix}"
            )
        if out in source.parents:
            raise BadInputError(
                f"the output directory {out} holds the source draft {source}: replacing it "
                f"would delete the draft (and whatever lies beside it); {fix}"
            )
        if source in out.parents:
            raise BadInputError(
                f"the output directory {out} lies inside the source draft {source}; {fix} "
                "outside it"
            )
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputExistsError(f"the output path {out} is a file, not an export; {fix}")
    run = _run_dir(out)
    if run is not None:
        what = "is a training run directory" if run == out else f"holds the training run {run}"
        raise BadInputError(
            f"the output directory {out} {what} (checkpoints/, run_config.json or "
            "metrics.jsonl): an export never replaces it; write the export to a new directory, "
            f"e.g. {run / 'exports' / 'NAME'}"
        )
    why = _not_an_export(out)
    if why is not None:
        raise OutputExistsError(
            f"the output directory {out} exists and is not an export ({why}): overwrite "
            f"replaces only a previous export (a directory holding {PROVENANCE} and the files "
            f"beside it); {fix}, or remove it yourself"
        )
    if not overwrite:
        raise OutputExistsError(
            f"{out} exists (a previous export); choose a new directory or pass overwrite=True "
            "(--overwrite) to replace it"
        )


def _provenance(fmt: str, dtype: str, engine: str, source: str, target: str, k: int | None) -> dict:
    return {
        "exported_by": "dspark",
        "dspark_version": dspark.__version__,
        "format": fmt,
        "dtype": dtype,
        "engine": engine,
        "source": source,
        "target": target,
        "draft_vocab_size": k,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def resolve_verifier(config, verifier: str | None) -> tuple[str, list[str]]:
    """The target name engines should load (a local dir for embedded / tiny / path targets, else
    the hub id) and its `architectures`."""
    name = verifier or config.target_name_or_path
    if not name:
        raise BadInputError(
            "the draft's config names no target (target_name_or_path); pass verifier=/--target"
        )
    if name in EMBEDDED_ALIASES or name.startswith(TINY_PREFIX) or Path(name).expanduser().exists():
        name = str(Path(resolve_target(name)).resolve())
    archs: list[str] = []
    cfg_file = Path(name) / "config.json"
    if cfg_file.is_file():
        archs = read_json(cfg_file).get("architectures") or []
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
    gguf_outtype: str = "f16",
    threads: int = 2,
) -> Path:
    """Write `draft` (a `DSparkDraftModel` or a draft directory of any layout) to `out_dir`.

    `fmt`: deepspec | speculators | gguf (llama.cpp: `draft.gguf` of type `gguf_outtype`, f16 |
    bf16 | f32 | q8_0 | q4_0, with the tokenizer of `verifier`, and a README with the
    `llama-server` command for `threads` threads). `dtype`: bfloat16 (default) | float32. `engine="vllm"` refuses
    (NotServableError, with the reasons) a draft that vLLM / SGLang would serve wrong;
    `engine="any"` writes it and lists the reasons in the README. `verifier`: the target's name
    for engines (default: the draft's `target_name_or_path`). `draft_vocab`: target ids to keep
    (a tensor / list, or a .json / .safetensors / .pt file with ids or d2t) for a reduced draft
    vocabulary. Written to a temporary sibling directory and renamed: a failed export leaves
    nothing behind. An existing `out_dir` is replaced only with `overwrite=True` and only when
    it is a previous export (its `export.json`); the source draft, a directory holding it and
    a training run directory are refused (`check_output`). Refusals are `UserError`s
    (`NotServableError`, `OutputExistsError`, `BadInputError`), whose message names the fix.
    """
    if fmt not in FORMATS:
        raise BadInputError(f"unknown export format {fmt!r}; use one of {FORMATS}")
    if engine not in ENGINES:
        raise BadInputError(f"unknown engine {engine!r}; use one of {ENGINES}")
    torch_dtype = _dtype(dtype)
    out = Path(out_dir).expanduser().resolve()
    with exclusive_output(out, "the export"):  # one writer: a second export here is refused
        return _export(draft, out, fmt, torch_dtype, engine, verifier, draft_vocab, overwrite,
                       gguf_outtype, threads)  # fmt: skip


def _export(draft, out: Path, fmt, torch_dtype, engine, verifier, draft_vocab, overwrite,
            gguf_outtype, threads) -> Path:  # fmt: skip
    from dspark.export.vocab import export_kept_ids  # start-up: modeling imports slowly
    from dspark.modeling.lora import has_lora, merged_copy  # start-up: modeling imports slowly

    source = "a DSparkDraftModel in memory"
    source_dir = None
    if not isinstance(draft, torch.nn.Module):
        source_dir = Path(draft).expanduser().resolve()
        source = str(draft)
    check_output(out, source_dir, overwrite)
    if source_dir is not None:
        draft = load_draft(draft)

    if has_lora(draft):  # LoRA-fine-tuned in memory: export the merged weights
        draft = merged_copy(draft)
    config = draft.config

    kept = export_kept_ids(draft, draft_vocab)  # the draft's own ids when it is reduced
    K = None if kept is None else int(kept.numel())

    if fmt == "gguf":  # llama.cpp's own refusals replace vLLM's (dspark.export.gguf)
        return _export_gguf(draft, out, source_dir, source, verifier, draft_vocab, K,
                            gguf_outtype, engine, threads)  # fmt: skip
    problems = serving_problems(config, draft.state_dict().keys())
    if problems and engine == "vllm":
        raise NotServableError(
            "upstream vLLM / SGLang would not serve this draft as trained: "
            + "; ".join(problems)
            + ". Pass engine='any' (--engine any) to export it anyway for DeepSpec or the "
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

    dtype_name = str(torch_dtype).removeprefix("torch.")
    with staged_dir(out) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(
            render(
                fmt=fmt,
                config=config,
                draft_dir=str(out),
                target=target,
                dtype=dtype_name,
                draft_vocab_size=K,
                problems=problems,
                source=source,
            )
        )
        info = _provenance(fmt, dtype_name, engine, str(source_dir or source), target, K)
        (tmp / PROVENANCE).write_text(dumps_strict(info, indent=2, sort_keys=True) + "\n")
    return out


def _export_gguf(draft, out, source_dir, source, verifier, draft_vocab, k, outtype, engine,
                 threads) -> Path:  # fmt: skip

    target = verifier or draft.config.target_name_or_path
    with staged_dir(out) as tmp:
        write_gguf(draft, tmp / GGUF_FILE, target=target, outtype=outtype, draft_vocab=draft_vocab)
        (tmp / "README.md").write_text(
            render_llama_cpp(
                config=draft.config,
                gguf=str(out / GGUF_FILE),
                target=str(target),
                outtype=outtype,
                draft_vocab_size=k,
                source=source,
                threads=threads,
            )  # fmt: skip
        )
        info = _provenance("gguf", outtype, engine, str(source_dir or source), str(target), k)
        (tmp / PROVENANCE).write_text(dumps_strict(info, indent=2, sort_keys=True) + "\n")
    return out
