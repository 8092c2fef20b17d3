"""Read a draft of any supported layout back into a `DSparkDraftModel`.

Layouts, told apart by config.json:
- ours / DeepSpec / upstream vLLM: `block_size` and `target_layer_ids` at the top level
  (`DSparkDraftModel.from_pretrained`; dspark < 0.2 drafts fail there with the conversion
  command);
- DeepSpec / DFlash-style nesting: `block_size` at the top and `dflash_config` {mask_token_id,
  target_layer_ids} (flattened here);
- speculators: `speculators_model_type: dspark` (`aux_hidden_state_layer_ids` - 1 are the
  decoder-layer ids).
A reduced draft vocabulary (`d2t`) cannot run in dspark's decoder, which proposes over the
full target vocabulary: such a directory is refused with that reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = path / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(path / f)))
        return state
    raise FileNotFoundError(
        f"{path} holds no model.safetensors (or sharded index): not a draft weights directory"
    )


def layout_of(path: str | Path) -> str:
    """`dspark` | `dflash_nested` | `speculators` for a draft directory, or a ValueError."""
    path = Path(path).expanduser()
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(
            f"{cfg_file} not found: point at a draft directory (train/distill.py writes "
            "<run>/draft; dspark export writes deepspec / speculators directories)"
        )
    raw = json.loads(cfg_file.read_text())
    if "speculators_model_type" in raw:
        return "speculators"
    if "block_size" in raw and "target_layer_ids" in raw:
        return "dspark"
    if "block_size" in raw and "target_layer_ids" in (raw.get("dflash_config") or {}):
        return "dflash_nested"
    raise ValueError(
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
    from dspark.config import DSparkConfig
    from dspark.modeling import DSparkDraftModel

    path = Path(path).expanduser()
    layout = layout_of(path)
    raw = json.loads((path / "config.json").read_text())
    reduced = raw.get("draft_vocab_size")
    vocab = (raw.get("transformer_layer_config") or raw).get("vocab_size")
    if reduced is not None and vocab is not None and int(reduced) < int(vocab):
        raise ValueError(
            f"{path} has a reduced draft vocabulary ({reduced} of {vocab} tokens, d2t): dspark's "
            "decoder proposes over the full target vocabulary. Load the full-vocabulary draft "
            "it was exported from (export without draft_vocab)."
        )
    if layout == "dspark":
        model = DSparkDraftModel.from_pretrained(path, dtype=dtype)
    else:
        if layout == "speculators":
            from dspark.export.layouts import dspark_kwargs_from_speculators

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
        config = DSparkConfig(**kw)
        model = DSparkDraftModel(config)
        state = {
            k: v
            for k, v in _read_weights(path).items()
            if k not in ("d2t", "t2d", "verifier_lm_head.weight", "verifier_norm.weight")
        }
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{path}/model.safetensors does not match the draft its config describes: "
                f"missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
            )
        # transformers' `to` is @wraps(nn.Module.to), which mypy types as an unbound function
        model.to(dtype)  # type: ignore[arg-type]
    model.freeze_target_copies()
    return model.to(device).eval()  # type: ignore[arg-type]  # (the same `to`)
