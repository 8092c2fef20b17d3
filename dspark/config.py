"""`DSparkConfig`: the config.json of a DSpark draft (method doc, sections 1 and 7).

A draft's config is a copy of its target's config (hidden size, heads, kv heads, head_dim, FFN,
RoPE, eps, vocab and every other key the target carries) with fewer layers, plus the DSpark
fields. Saved with `save_pretrained` it is the DeepSpec / upstream-vLLM layout: the full target
config plus `architectures`, `num_hidden_layers`, `num_target_layers`, `block_size`,
`mask_token_id`, `target_layer_ids`, `num_anchors`, `markov_rank`, `markov_head_type`,
`enable_confidence_head`, `confidence_head_with_markov`, `tie_word_embeddings: false`.

Every DSpark default lives here and nowhere else (what a draft takes from its target, the
tapped layers and the mask token, in `dspark/from_target.py`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from dspark.from_target import (
    MASK_TOKEN_CANDIDATES,
    NUM_TARGET_FEATURES,
    RARE_SPECIAL_FALLBACKS,
    TARGET_FAMILIES,
    choose_mask_token_id,
    default_target_layer_ids,
    target_family,
)

__all__ = [
    "LEGACY_ARCHITECTURES",
    "MASK_TOKEN_CANDIDATES",
    "NUM_TARGET_FEATURES",
    "RARE_SPECIAL_FALLBACKS",
    "SERVING_ARCHITECTURE",
    "SERVING_MODEL_TYPE",
    "TARGET_FAMILIES",
    "DSparkConfig",
    "choose_mask_token_id",
    "default_target_layer_ids",
    "target_family",
]


# Every draft, whatever its target's family, is built from Qwen3-style decoder layers (q/k
# RMSNorm, no q/k/v bias) and declares the one architecture upstream vLLM / SGLang / DeepSpec
# serve: `Qwen3DSparkModel` (vLLM routes `DSparkDraftModel` to DeepSeek-V4: never emit it).
SERVING_ARCHITECTURE = "Qwen3DSparkModel"
SERVING_MODEL_TYPE = "qwen3"  # config.json's model_type: engines parse it with Qwen3Config
# Names of the earlier per-family layout for Llama / Qwen2 targets (layers without q/k norms): no
# engine registers them; `convert_legacy_draft` turns such a checkpoint into today's layout.
LEGACY_ARCHITECTURES = ("LlamaDSparkModel", "Qwen2DSparkModel")

# Target config keys that describe the target itself, not the draft: never copied.
_NOT_COPIED = (
    "model_type",
    "transformers_version",
    "architectures",
    "_name_or_path",
    "name_or_path",
    "auto_map",
    "num_hidden_layers",
    "layer_types",
    "tie_word_embeddings",
    "output_attentions",
)


class DSparkConfig(PretrainedConfig):
    """Config of a DSpark draft: the target's config with fewer layers plus the DSpark fields."""

    model_type = "dspark"

    # Copied from the target (defaults only matter for a bare `DSparkConfig()`).
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 5
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    rope_parameters: dict | None = None
    attention_bias: bool = False
    attention_dropout: float | int = 0.0
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # DSpark fields (method doc sections 1 and 7).
    block_size: int = 7
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = None
    num_target_layers: int | None = None
    num_anchors: int = 512
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    target_model_type: str = "qwen3"
    target_name_or_path: str | None = None
    # Engines' legacy readers default this to false (anchor not sampled: a 1+N layout), which
    # silently collapses acceptance for our anchor-first drafts: always written, always true.
    sample_from_anchor: bool = True
    layer_types: list[str] | None = None
    # STS temperatures T_k of the confidence head, k = 1..block_size (method doc section 4):
    # c_k = sigmoid(z_k / T_k); written by eval/calibrate.py, applied by the decoder. None: raw.
    confidence_temperatures: list[float] | None = None
    # A reduced draft vocabulary: the draft scores K of the target's `vocab_size` tokens (its
    # `lm_head` and Markov `markov_w2` have K rows; the `d2t [K]` / `t2d [V]` buffers map the
    # ids, dspark/export/vocab.py). None (and K == vocab_size): the full vocabulary.
    draft_vocab_size: int | None = None

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.target_layer_ids is not None:
            self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        self.layer_types = ["full_attention"] * int(self.num_hidden_layers)
        self.tie_word_embeddings = False
        if int(self.markov_rank) == 0:
            # No Markov head, so no W1 row to read: the confidence head sees h_k alone
            # (`draft.markov_rank=0` alone is a valid DFlash + confidence draft).
            self.confidence_head_with_markov = False
        if type(self.draft_vocab_size) is int and self.draft_vocab_size == int(self.vocab_size):
            self.draft_vocab_size = None  # all V tokens kept: the full vocabulary, one spelling
        super().__post_init__(**kwargs)
        self.check()
        self.architectures = [self.serving_architecture()]

    # ------------------------------------------------------------------ derived
    @property
    def qkv_bias(self) -> bool:
        """q/k/v (and o) projection biases: Qwen3 semantics, `attention_bias` (False unless a
        Qwen3 target has them; a Qwen2 target's always-on biases are not copied)."""
        return bool(self.attention_bias)

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids or [])

    @property
    def is_reduced_vocab(self) -> bool:
        """Whether the draft scores fewer than `vocab_size` tokens (`draft_vocab_size`)."""
        return self.draft_vocab_size is not None

    @property
    def num_draft_tokens(self) -> int:
        """K, the width of the draft's logits: `draft_vocab_size`, or `vocab_size` when full."""
        return int(self.draft_vocab_size or self.vocab_size)

    def serving_architecture(self) -> str:
        return SERVING_ARCHITECTURE

    # ------------------------------------------------------------------ validation
    def check(self) -> None:
        """Raise ValueError with the fix for any inconsistent DSpark field."""
        if int(self.block_size) < 1:
            raise ValueError(f"block_size must be >= 1 (got {self.block_size})")
        if not self.sample_from_anchor:
            raise ValueError(
                "sample_from_anchor must be true: dspark drafts are anchor-first (slot 0 holds the "
                "anchor token); a 1+N layout is not supported"
            )
        if self.target_model_type not in TARGET_FAMILIES:
            raise ValueError(
                f"target_model_type must be one of {TARGET_FAMILIES} (got {self.target_model_type!r})"
            )
        if int(self.markov_rank) < 0:
            raise ValueError(
                f"markov_rank must be >= 0, 0 disables the head (got {self.markov_rank})"
            )
        if int(self.num_anchors) < 1:
            raise ValueError(f"num_anchors must be >= 1 (got {self.num_anchors})")
        K = self.draft_vocab_size
        if K is not None and (
            isinstance(K, bool) or not isinstance(K, int) or not 1 <= K <= int(self.vocab_size)
        ):
            raise ValueError(
                f"draft_vocab_size={K!r} must be an integer in [1, {self.vocab_size}] (the "
                "target's vocabulary size), or null for the full vocabulary"
            )
        temps = self.confidence_temperatures
        if temps is not None and (len(temps) < int(self.block_size) or min(temps) <= 0):
            raise ValueError(
                f"confidence_temperatures needs {self.block_size} positive values, got {temps}; "
                "refit them with eval/calibrate.py or drop the key"
            )
        if self.mask_token_id is not None and not 0 <= int(self.mask_token_id) < int(
            self.vocab_size
        ):
            raise ValueError(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})"
            )
        if self.target_layer_ids is not None:
            ids = list(self.target_layer_ids)
            if not ids:
                raise ValueError("target_layer_ids must not be empty")
            if any(b <= a for a, b in zip(ids, ids[1:])):
                raise ValueError(f"target_layer_ids must be strictly increasing (got {ids})")
            N = self.num_target_layers
            if N is not None:
                bad = [i for i in ids if not 0 <= i < N]
                if bad:
                    raise ValueError(
                        f"target_layer_ids {bad} are out of range for a {N}-layer target "
                        f"(valid decoder-layer ids: 0..{N - 2})"
                    )
                if N - 1 in ids:
                    raise ValueError(
                        f"target_layer_ids {ids} include the target's final layer {N - 1}; the final "
                        "layer is never tapped (its output is the target distribution). Use ids "
                        f"<= {N - 2}, e.g. default_target_layer_ids({N})"
                    )
        if self.hidden_size % self.num_attention_heads and self.head_dim is None:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        assert self.num_key_value_heads is not None  # __post_init__ defaults it to the heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """The serving layout: the target's dimensions as a Qwen3 config (`model_type: qwen3`,
        so engines parse it with Qwen3Config whatever the target family; `target_model_type`
        keeps the family) plus the DSpark keys; engines route on `architectures`.
        `DSparkConfig.from_pretrained` reads it back."""
        out = super().to_dict()
        out["model_type"] = SERVING_MODEL_TYPE
        out["architectures"] = [self.serving_architecture()]
        out["tie_word_embeddings"] = False
        out["sample_from_anchor"] = True
        if out.get("draft_vocab_size") is None:
            # a full-vocabulary draft's config.json stays what engines have always read
            out.pop("draft_vocab_size", None)
        return out

    @classmethod
    def get_config_dict(cls, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        if "block_size" in config_dict and "target_layer_ids" in config_dict:
            legacy = [
                a for a in config_dict.get("architectures") or [] if a in LEGACY_ARCHITECTURES
            ]
            if legacy:
                src = args[0] if args else kwargs.get("pretrained_model_name_or_path", "?")
                raise ValueError(
                    f"{src} is a draft in the earlier per-family layout ({legacy[0]}: decoder layers without q/k "
                    "norms), which no serving engine registers. Convert it once with\n"
                    f"  python -m dspark.modeling.legacy {src} NEW_DIR\n"
                    "then fine-tune NEW_DIR (draft.init_from=NEW_DIR): the new q/k norms start at "
                    "ones, so the converted draft is a warm start, not the old function."
                )
            config_dict = {**config_dict, "model_type": cls.model_type}  # a DSpark draft
        return config_dict, kwargs

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target_config(
        cls,
        target_config: PretrainedConfig | Mapping[str, Any],
        *,
        # The defaults are this class's field defaults above (names of the class body),
        # never restated numbers: a field's default changes here and nowhere else.
        num_hidden_layers: int = num_hidden_layers,
        block_size: int = block_size,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        num_anchors: int = num_anchors,
        markov_rank: int = markov_rank,
        markov_head_type: str = markov_head_type,
        enable_confidence_head: bool = enable_confidence_head,
        confidence_head_with_markov: bool = confidence_head_with_markov,
        target_name_or_path: str | None = None,
        num_target_features: int = NUM_TARGET_FEATURES,
        draft_vocab_size: int | None = None,
    ) -> DSparkConfig:
        """Copy `target_config` (an HF config or its dict), keep `num_hidden_layers` layers and
        add the DSpark fields. `target_layer_ids=None` uses `default_target_layer_ids`;
        `draft_vocab_size=None` keeps the full vocabulary.
        """
        src = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
        family = target_family(src.get("model_type", ""))
        if "text_config" in src:
            raise ValueError("multimodal targets (with a text_config) are not supported yet")
        if src.get("use_sliding_window"):
            raise ValueError("sliding-window targets are not supported: drafts use full attention")
        n_target = int(src["num_hidden_layers"])
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(n_target, num_target_features)
        if mask_token_id is None:
            raise ValueError(
                "mask_token_id is required: use dspark.config.choose_mask_token_id(tokenizer, "
                "target_config.vocab_size)"
            )
        kw = {k: v for k, v in src.items() if k not in _NOT_COPIED}
        if kw.get("head_dim") is None:
            kw["head_dim"] = src["hidden_size"] // src["num_attention_heads"]
        if target_name_or_path is None:
            target_name_or_path = src.get("_name_or_path") or None
        kw.update(
            num_hidden_layers=int(num_hidden_layers),
            num_target_layers=n_target,
            target_model_type=family,
            block_size=int(block_size),
            target_layer_ids=[int(i) for i in target_layer_ids],
            mask_token_id=int(mask_token_id),
            num_anchors=int(num_anchors),
            markov_rank=int(markov_rank),
            markov_head_type=markov_head_type,
            enable_confidence_head=bool(enable_confidence_head),
            confidence_head_with_markov=bool(confidence_head_with_markov),
            target_name_or_path=target_name_or_path,
            draft_vocab_size=draft_vocab_size,  # checked as given: "6" or 2.5 is an error
            tie_word_embeddings=False,
            # Qwen3-style layers: projection biases only where a Qwen3 target has them.
            attention_bias=bool(src.get("attention_bias", False)) and family == "qwen3",
        )
        return cls(**kw)


def _register_auto() -> None:
    try:
        AutoConfig.register("dspark", DSparkConfig)
    except ValueError:  # already registered
        pass


_register_auto()
