"""The two exported layouts: config.json contents and the weights that go beside it.

Both layouts hold the same tensors under the same unprefixed names (method doc, section 7:
`embed_tokens.weight`, `fc.weight`, `layers.{i}....`, `markov_head.markov_w{1,2}.weight`,
`confidence_head.proj.*`, plus `d2t` / `t2d` for a reduced draft vocabulary); only config.json
differs:

- `deepspec`: the draft's own `DSparkConfig` (the target's dimensions as a Qwen3 config, model
  type `qwen3`, `architectures: ["Qwen3DSparkModel"]`, decoder-layer `target_layer_ids`,
  `sample_from_anchor: true`), what upstream vLLM (`method: dspark`), SGLang (`DSPARK`) and
  DeepSpec load.
- `speculators`: vllm-project/speculators' `DSparkSpeculatorConfig` (checked against
  speculators 0.9): `speculators_model_type: dspark`, `architectures: ["DSparkSpeculator"]`,
  `speculators_config` {algorithm, proposal_methods [greedy, speculative_tokens = block size,
  since the anchor slot predicts too], default_proposal_method, verifier {name_or_path,
  architectures}}, `transformer_layer_config` (a Qwen3 config of the draft's layers),
  `aux_hidden_state_layer_ids` = decoder-layer ids + 1 (they index HF `hidden_states`, whose
  entry 0 is the embedding output), `draft_vocab_size`, and the DSpark fields. Two extra keys
  (`num_target_layers`, `target_model_type`) make the config read back losslessly; the
  schema allows extras and engines ignore them.
"""

from __future__ import annotations

from typing import Any

import torch

from dspark.config import DSparkConfig
from dspark.errors import BadInputError

# DSparkConfig keys that are not part of a plain decoder-layer (Qwen3) config.
DSPARK_KEYS = (
    "architectures",
    "block_size",
    "mask_token_id",
    "target_layer_ids",
    "num_target_layers",
    "num_anchors",
    "markov_rank",
    "markov_head_type",
    "enable_confidence_head",
    "confidence_head_with_markov",
    "target_model_type",
    "target_name_or_path",
    "sample_from_anchor",
    "draft_vocab_size",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "_name_or_path",
)
SPECULATORS_VERSION = "0.9.0"  # the speculators release this schema was checked against
FAMILY_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def deepspec_config(config, *, dtype: torch.dtype, draft_vocab_size: int | None) -> dict[str, Any]:
    out = config.to_dict()
    out["dtype"] = str(dtype).removeprefix("torch.")
    out.pop("torch_dtype", None)
    if draft_vocab_size is not None:
        out["draft_vocab_size"] = int(draft_vocab_size)
    return out


def speculators_config(
    config,
    *,
    dtype: torch.dtype,
    draft_vocab_size: int | None,
    verifier: str,
    verifier_architectures: list[str],
) -> dict[str, Any]:
    layer = {k: v for k, v in config.to_dict().items() if k not in DSPARK_KEYS}
    layer["model_type"] = "qwen3"
    layer["tie_word_embeddings"] = False
    block = int(config.block_size)
    return {
        "speculators_model_type": "dspark",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["DSparkSpeculator"],
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": block,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": int(draft_vocab_size or config.vocab_size),
        "block_size": block,
        "aux_hidden_state_layer_ids": [int(i) + 1 for i in config.target_layer_ids],
        "mask_token_id": int(config.mask_token_id),
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": int(config.markov_rank),
        "markov_head_type": config.markov_head_type,
        "enable_confidence_head": bool(config.enable_confidence_head),
        "confidence_head_with_markov": bool(config.confidence_head_with_markov),
        "num_target_layers": config.num_target_layers,
        "target_model_type": config.target_model_type,
        "dtype": str(dtype).removeprefix("torch."),
    }


def dspark_kwargs_from_speculators(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """`DSparkConfig` keyword arguments from a speculators-format config.json dict."""
    if raw.get("speculators_model_type") != "dspark":
        raise BadInputError(
            f"{source}: speculators_model_type is {raw.get('speculators_model_type')!r}, not "
            "'dspark'; only DSpark speculators load as a dspark draft"
        )
    layer = dict(raw.get("transformer_layer_config") or {})
    if not layer:
        raise BadInputError(f"{source}: a speculators config without transformer_layer_config")
    aux = raw.get("aux_hidden_state_layer_ids")
    if not aux:
        raise BadInputError(f"{source}: aux_hidden_state_layer_ids is missing")
    if not raw.get("sample_from_anchor", False):
        raise BadInputError(
            f"{source}: sample_from_anchor is false (a 1+N block layout, anchor not sampled); "
            "dspark drafts are anchor-first and cannot run it"
        )
    verifier = (raw.get("speculators_config") or {}).get("verifier") or {}
    family = raw.get("target_model_type")
    if family is None:
        archs = " ".join(verifier.get("architectures") or []).lower()
        family = "qwen2" if "qwen2" in archs else "llama" if "llama" in archs else "qwen3"
    kw = {k: v for k, v in layer.items() if k not in DSPARK_KEYS and k != "model_type"}
    kw.update(
        block_size=int(raw["block_size"]),
        mask_token_id=raw.get("mask_token_id"),
        target_layer_ids=[int(i) - 1 for i in aux],
        num_target_layers=raw.get("num_target_layers"),
        # keys a speculators config may lack: DSparkConfig's own defaults
        markov_rank=int(raw.get("markov_rank", DSparkConfig.markov_rank)),
        markov_head_type=raw.get("markov_head_type", DSparkConfig.markov_head_type),
        enable_confidence_head=bool(
            raw.get("enable_confidence_head", DSparkConfig.enable_confidence_head)
        ),
        confidence_head_with_markov=bool(
            raw.get("confidence_head_with_markov", DSparkConfig.confidence_head_with_markov)
        ),
        target_model_type=family,
        target_name_or_path=verifier.get("name_or_path"),
        # K == vocab_size (what a full draft's export writes) normalises to None
        draft_vocab_size=raw.get("draft_vocab_size"),
    )
    return kw


def export_state(
    draft, dtype: torch.dtype, kept_ids: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """The draft's tensors in `dtype` (`d2t` int64 and `t2d` bool when `kept_ids` reduces the
    vocabulary: `lm_head` and `markov_w2` keep those rows only). A draft that is already
    reduced holds its K rows and maps: `kept_ids` must then be its own (`export_kept_ids`)."""
    from dspark.modeling.vocab_map import (  # start-up: modeling imports slowly
        ids_from_d2t,
        mapping_from_ids,
    )

    state = {k: v.detach().to("cpu") for k, v in draft.state_dict().items()}
    if "d2t" in state:  # reduced in the model itself: its rows and maps are the export's
        own = ids_from_d2t(state["d2t"], int(draft.config.vocab_size))
        if kept_ids is not None and not torch.equal(torch.as_tensor(kept_ids).cpu(), own):
            raise BadInputError("kept_ids differ from the reduced draft's own d2t")
    elif kept_ids is not None:
        V = int(draft.config.vocab_size)
        d2t, t2d = mapping_from_ids(kept_ids, V)
        ids = d2t + torch.arange(d2t.numel())
        for key in ("lm_head.weight", "markov_head.markov_w2.weight"):
            if key in state:
                state[key] = state[key][ids]
        state["d2t"], state["t2d"] = d2t, t2d
    return {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
