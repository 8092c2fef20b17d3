"""The data pipeline: prompt sources, the embedded default set, regeneration, tokenization.

Public API (what the training loop and scripts use):
- `load_prompts(source, split="train", limit=None) -> PromptSet` (rows `{"index", "messages"}`
  and the per-row report of rejected rows), `normalize_row(row) -> messages`.
- `embedded_prompts(split="train"|"test") -> [{"messages": [...]}]`.
- `regenerate(prompts, backend, output_dir, sampling=SamplingConfig(...), batch_size=8)`
  with `DecoderBackend(model, tokenizer, batch_size=32)` (fast, the default of the CLI),
  `HFBackend(model, tokenizer)` (the fallback) or `OpenAIBackend(url)` (vLLM / SGLang).
- `assistant_mask(tokenizer, messages) -> (input_ids, loss_mask, method)`,
  `check_loss_masks(tokenizer, rows)`, `tokenize_rows(...)`, `save_tokenized(...)`.
- `PadCollator(pad_token_id)` (in `dspark.data.collate`).

Submodules are imported lazily so `import dspark.data` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "load_prompts": "prompts.sources",
    "normalize_row": "prompts.sources",
    "normalize_rows": "prompts.sources",
    "PromptSet": "prompts.sources",
    "MalformedRow": "prompts.sources",
    "embedded_prompts": "prompts.embedded",
    "regenerate": "regeneration.regenerate",
    "SamplingConfig": "regeneration.regenerate",
    "HFBackend": "regeneration.regenerate",
    "OpenAIBackend": "regeneration.openai_backend",
    "DecoderBackend": "regeneration.decoder_backend",
    "row_seed": "regeneration.regenerate",
    "assistant_mask": "masks",
    "check_loss_masks": "masks",
    "LossMaskError": "masks",
    "end_of_turn_ids": "masks",
    "tokenize_rows": "tokenize",
    "save_tokenized": "tokenize",
    "tokenize_file": "tokenize",
    "load_manifest": "tokenize",
    "PadCollator": "collate",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"dspark.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'dspark.data' has no attribute {name!r}")
