"""Read a draft GGUF (`write_gguf`'s file, llama.cpp's `dflash` layout) back into a
`DSparkDraftModel`, so every export format loads through `load_draft`.

The decoder config comes from the `dflash.*` keys, the vocabulary size from `token_embd`, the
Markov rank from `markov_w1`, the confidence head from `conf_proj`; a missing `output` is the
tied target's head (`token_embd`), and `d2t` (absolute target ids [K]) gives a reduced draft
its `d2t` offsets and `t2d`. Tensors are dequantized to float32 (an f32 file gives the exact
weights back). What the file does not hold is left at `DSparkConfig`'s defaults: the target's
family (`target_model_type`), layer count and name, which only engines' metadata reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark.config import DSparkConfig
from dspark.errors import BadInputError
from dspark.export.gguf_names import ARCH, LAYER_NAMES, TOP_NAMES

_FROM_GGUF = {v: k for k, v in TOP_NAMES.items()}
_LAYER_FROM_GGUF = {v: k for k, v in LAYER_NAMES.items()}


def _hf_name(name: str) -> str | None:
    if name in _FROM_GGUF:
        return _FROM_GGUF[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_FROM_GGUF:
        return f"layers.{parts[1]}.{_LAYER_FROM_GGUF[parts[2]]}"
    return None


def _values(t) -> np.ndarray:
    import gguf  # optional: gguf

    if np.issubdtype(t.data.dtype, np.integer) and t.data.dtype != np.uint8:
        return np.asarray(t.data)
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)


def load_gguf_draft(path: str | Path):
    """A float32 `DSparkDraftModel` (not yet frozen or moved) from a draft GGUF file."""
    import gguf  # optional: gguf

    from dspark.modeling import DSparkDraftModel  # start-up: modeling imports slowly
    from dspark.modeling.vocab_map import mapping_from_ids  # start-up: modeling imports slowly

    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise BadInputError(f"{path} is not a readable GGUF file ({e}); re-export it") from None
    fields = {k: f.contents() for k, f in reader.fields.items()}
    if fields.get("general.architecture") != ARCH:
        raise BadInputError(
            f"{path} is a {fields.get('general.architecture')!r} GGUF, not a DSpark draft "
            f"({ARCH!r}, what `dspark export --format gguf` writes)"
        )
    tensors = {t.name: _values(t) for t in reader.tensors}

    def key(name: str, default: Any = None) -> Any:
        return fields.get(f"{ARCH}.{name}", default)

    state: dict[str, torch.Tensor] = {}
    d2t_ids = None
    for name, arr in tensors.items():
        if name == "d2t":
            d2t_ids = torch.from_numpy(arr.astype(np.int64)).flatten()
            continue
        hf = _hf_name(name)
        if hf is None:
            raise BadInputError(f"{path} holds a tensor {name!r} no DSpark draft has")
        state[hf] = torch.from_numpy(np.array(arr, dtype=np.float32))  # a writable copy
    if "lm_head.weight" not in state:  # a tied target's head: llama.cpp reuses token_embd
        state["lm_head.weight"] = state["embed_tokens.weight"].clone()
    V, H = state["embed_tokens.weight"].shape
    w1 = state.get("markov_head.markov_w1.weight")
    rank = 0 if w1 is None else int(w1.shape[1])
    conf = state.get("confidence_head.proj.weight")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": key("rope.freq_base")}
    scaling = key("rope.scaling.type")
    if scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=key("rope.scaling.factor"))
        if scaling == "yarn":
            rope["original_max_position_embeddings"] = key("rope.scaling.original_context_length")
    try:
        config = DSparkConfig(
            vocab_size=int(V),
            hidden_size=int(H),
            intermediate_size=int(key("feed_forward_length")),
            num_hidden_layers=int(key("block_count")),
            num_attention_heads=int(key("attention.head_count")),
            num_key_value_heads=int(key("attention.head_count_kv")),
            head_dim=int(key("attention.key_length", H // int(key("attention.head_count")))),
            max_position_embeddings=int(key("context_length")),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            rope_parameters=rope,
            block_size=int(key("block_size")),
            target_layer_ids=[int(i) - 1 for i in key("target_layers")],
            mask_token_id=fields.get("tokenizer.ggml.mask_token_id"),
            markov_rank=rank,
            markov_head_type="vanilla",  # the only head llama.cpp's dflash draft has
            enable_confidence_head=conf is not None,
            confidence_head_with_markov=conf is not None and int(conf.shape[1]) == H + rank,
            draft_vocab_size=None if d2t_ids is None else int(d2t_ids.numel()),
        )
    except (TypeError, ValueError) as e:
        raise BadInputError(f"{path}: not a DSpark draft's keys ({e}); re-export it") from None
    if d2t_ids is not None:
        d2t, t2d = mapping_from_ids(d2t_ids, int(V), source=f"{path}: d2t")
        state["d2t"], state["t2d"] = d2t, t2d
    model = DSparkDraftModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise BadInputError(
            f"{path} does not hold the draft its keys describe: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
    model.check_vocab_maps()
    return model
