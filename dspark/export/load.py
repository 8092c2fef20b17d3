"""Read a draft of any supported layout back into a `DSparkDraftModel`.

Layouts, told apart by config.json:
- ours / DeepSpec / upstream vLLM: `block_size` and `target_layer_ids` at the top level
  (`DSparkDraftModel.from_pretrained`; drafts in the earlier per-family layout fail there with the conversion
  command);
- DeepSpec / DFlash-style nesting: `block_size` at the top and `dflash_config` {mask_token_id,
  target_layer_ids} (flattened here);
- speculators: `speculators_model_type: dspark` (`aux_hidden_state_layer_ids` - 1 are the
  decoder-layer ids);
- GGUF: a `draft.gguf` file, or a directory holding one and no config.json
  (`dspark.export.gguf_load`).
A reduced draft vocabulary (`draft_vocab_size` K < vocab_size) loads as a reduced
`DSparkDraftModel`: K rows of `lm_head` / `markov_w2` and its `d2t` / `t2d` buffers, checked
against each other (`DSparkDraftModel.check_vocab_maps`).

A directory that is not a readable draft (no or cut-off config.json, missing or damaged
weights, weights of another shape) is a `UserError` naming the file, not a traceback.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError

from dspark.config import DSparkConfig
from dspark.errors import BadInputError, MissingPathError, UserError
from dspark.export.files import RESAVE, read_json, read_safetensors
from dspark.export.gguf_load import load_gguf_draft
from dspark.export.layouts import dspark_kwargs_from_speculators


def _one_line(e: BaseException, lines: int = 4) -> str:
    """`e`'s message on one line (its first `lines` lines), for a one-line error."""
    parts = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join(parts[:lines]) + (" ..." if len(parts) > lines else "") or type(e).__name__


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    single = path / "model.safetensors"
    if single.is_file():
        return read_safetensors(single)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise BadInputError(f"{index} has no weight_map; {RESAVE}")
        state: dict[str, torch.Tensor] = {}
        for f in sorted(set(weight_map.values())):
            if not (path / f).is_file():
                raise MissingPathError(f"{index} names the shard {f}, which is missing; {RESAVE}")
            state.update(read_safetensors(path / f))
        return state
    raise MissingPathError(
        f"{path} holds no model.safetensors (or sharded index): not a draft weights directory"
    )


def layout_of(path: str | Path) -> str:
    """`dspark` | `dflash_nested` | `speculators` for a draft directory, or a `UserError`
    (a `FileNotFoundError` / `ValueError`) that names the file."""
    path = Path(path).expanduser()
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise MissingPathError(
            f"{cfg_file} not found: point at a draft directory (train/distill.py writes "
            "<run>/draft; dspark export writes deepspec / speculators directories)"
        )
    raw = read_json(cfg_file)
    if "speculators_model_type" in raw:
        return "speculators"
    if "block_size" in raw and "target_layer_ids" in raw:
        return "dspark"
    if "block_size" in raw and "target_layer_ids" in (raw.get("dflash_config") or {}):
        return "dflash_nested"
    raise BadInputError(
        f"{cfg_file} is not a DSpark draft config of a known layout: expected block_size and "
        "target_layer_ids (dspark / DeepSpec / vLLM), dflash_config.target_layer_ids, or "
        "speculators_model_type='dspark' (found keys: "
        f"{sorted(raw)[:12]}...). Export the draft with `python data_scripts/export.py` or "
        "convert it to one of these layouts."
    )


def load_draft(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
):
    """A `DSparkDraftModel` (frozen embeddings / lm_head, eval mode) from any supported layout."""
    from dspark.modeling import DSparkDraftModel  # start-up: modeling imports slowly

    path = Path(path).expanduser()
    gguf_file = path / "draft.gguf" if path.is_dir() else path
    if gguf_file.suffix == ".gguf" and gguf_file.is_file() and not (path / "config.json").exists():
        model = load_gguf_draft(gguf_file)
        model.to(dtype)  # type: ignore[arg-type]  # (transformers' `to`, as below)
        model.freeze_target_copies()
        return model.to(device).eval()  # type: ignore[arg-type]
    layout = layout_of(path)
    raw = read_json(path / "config.json")
    if layout == "dspark":
        try:
            model = DSparkDraftModel.from_pretrained(path, dtype=dtype)
        except UserError:
            raise
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:
            # transformers' OSError for missing weights, a DSparkConfig check (the earlier per-family layout
            # one carries the conversion command), a shape mismatch, a damaged weights file
            raise BadInputError(f"{path} cannot be loaded as a draft: {_one_line(e)}") from None
    else:
        if layout == "speculators":
            kw = dspark_kwargs_from_speculators(raw, str(path / "config.json"))
        else:
            nested = raw["dflash_config"]
            kw = {
                k: v
                for k, v in raw.items()
                if k not in ("architectures", "model_type", "dflash_config")
            }
            kw.update(
                mask_token_id=nested.get("mask_token_id", raw.get("mask_token_id")),
                target_layer_ids=nested["target_layer_ids"],
            )
        try:
            config = DSparkConfig(**kw)
        except (TypeError, ValueError) as e:
            raise BadInputError(f"{path / 'config.json'}: {e}") from None
        model = DSparkDraftModel(config)
        # d2t / t2d stay: a reduced draft holds them as buffers (a full one has none)
        state = {
            k: v
            for k, v in _read_weights(path).items()
            if k not in ("verifier_lm_head.weight", "verifier_norm.weight")
        }
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as e:  # a tensor of another shape than the config describes
            raise BadInputError(
                f"{path}/model.safetensors does not match the draft its config describes: "
                f"{_one_line(e)}"
            ) from None
        if missing or unexpected:
            raise BadInputError(
                f"{path}/model.safetensors does not match the draft its config describes: "
                f"missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
            )
        model.check_vocab_maps()
        # transformers' `to` is @wraps(nn.Module.to), which mypy types as an unbound function
        model.to(dtype)  # type: ignore[arg-type]
    model.freeze_target_copies()
    return _own_storage(model.to(device).eval())  # type: ignore[arg-type]  # (the same `to`)


def _own_storage(model):
    """Every tensor in an allocation of its own: transformers can leave weights as views into
    the file's buffer at any byte offset, and a CPU GEMM rounds by its operands' alignment
    (measured: 1 ulp in a confidence over 6 rows, weights at offset 36), so the loaded draft
    would compute unlike the same draft in memory."""
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            if t.device.type == "cpu" and t.data_ptr() % 64:
                t.data = t.data.clone()
    return model
