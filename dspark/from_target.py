"""What a fresh draft's config takes from its target: the layer family of the target's
`model_type` (`target_family`), the decoder layers it taps (`default_target_layer_ids`) and
the token whose embedding row fills the masked block slots (`choose_mask_token_id`).

`dspark.config` re-exports every name here; `DSparkConfig.from_target_config` uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Target layers a fresh draft taps by default (`default_target_layer_ids`); not a config field
# (a draft stores the ids), hence a constant here that `from_target_config` and the schema read.
NUM_TARGET_FEATURES = 5
TARGET_FAMILIES = ("llama", "qwen2", "qwen3")
# Mask-token candidates, in order of preference: reserved/unused specials first, then rarely
# used specials of families without spare rows (SmolLM2/StarCoder: `<empty_output>`, a
# code-notebook marker that chat text never contains; Qwen: the FIM pad token).
MASK_TOKEN_CANDIDATES = (
    "<|reserved_0|>",
    "<|reserved_special_token_0|>",
    "<|MASK|>",
    "<|mask|>",
    "<mask>",
)
RARE_SPECIAL_FALLBACKS = ("<empty_output>", "<jupyter_script>", "<|fim_pad|>")


def target_family(model_type: str) -> str:
    """Map an HF `model_type` to the draft's layer family: llama | qwen2 | qwen3."""
    mt = (model_type or "").lower()
    if mt.startswith("qwen3"):
        return "qwen3"
    if mt.startswith("qwen2"):
        return "qwen2"
    if mt in ("llama", "mistral", "smollm3"):
        return "llama"
    raise ValueError(
        f"Unsupported target model_type {model_type!r}: DSpark drafts are built for Llama-, "
        f"Qwen2- and Qwen3-family targets ({', '.join(TARGET_FAMILIES)})."
    )


def default_target_layer_ids(num_target_layers: int, n: int = NUM_TARGET_FEATURES) -> list[int]:
    """Decoder-layer ids to tap: `n` ids spread evenly over 1..N-3 (never the final layer).

    36 layers -> [1, 9, 17, 25, 33]; 30 layers (SmolLM2-135M) -> [1, 8, 14, 21, 27]
    (half-way values round up). When 1..N-3 holds fewer than `n` layers (small targets), the
    range widens to 0..N-2 and at most N-1 distinct ids are returned: a 4-layer tiny target
    gives [0, 1, 2], 7 layers give [0, 1, 3, 4, 5]. The final layer N-1 is never tapped.
    """
    N = int(num_target_layers)
    n = int(n)
    if N < 2:
        raise ValueError(
            f"a target needs at least 2 layers to tap (got {N}); the final one is never tapped"
        )
    if n < 1:
        raise ValueError(f"need at least one tapped layer (got n={n})")
    start, end = 1, N - 3
    if end - start + 1 < n:
        start, end = 0, N - 2
        n = min(n, end - start + 1)
    if n == 1:
        return [start]
    span = end - start
    ids = [int(start + i * span / (n - 1) + 0.5) for i in range(n)]
    return sorted(set(ids))


def choose_mask_token_id(tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None) -> int:
    """Pick the mask token: an id whose embedding row normal text never uses.

    Order: a reserved/mask special the tokenizer defines (`<|reserved_0|>` in tiny targets,
    `<|reserved_special_token_0|>` in Llama 3); else the first embedding row beyond the
    tokenizer (`len(tokenizer)`, when the model's `vocab_size` is larger, e.g. Qwen3's padded
    vocab); else a rarely used special (`<empty_output>` for SmolLM2, `<|fim_pad|>` for Qwen).
    """
    vocab = tokenizer.get_vocab()
    for tok in MASK_TOKEN_CANDIDATES:
        if tok in vocab:
            return int(vocab[tok])
    n_tok = len(tokenizer)
    if vocab_size is not None and int(vocab_size) > n_tok:
        return n_tok
    for tok in RARE_SPECIAL_FALLBACKS:
        if tok in vocab:
            return int(vocab[tok])
    raise ValueError(
        "Could not find an unused token for the mask embedding: the tokenizer defines none of "
        f"{MASK_TOKEN_CANDIDATES + RARE_SPECIAL_FALLBACKS} and the model has no spare embedding "
        "rows. Pass mask_token_id explicitly."
    )
