"""The data pipeline, one subpackage per stage, each importing only earlier ones:

- `prompts/`: prompt sources and sets (files, hub presets, the named public sets, the
  embedded default), normalised to `messages`, and the filters on generated prompts;
- `regeneration/`: the target answers them (backends, the resumable loop, Magpie prompts);
- `tokenize.py`, `masks.py`: chat-template tokens and loss masks; `collate.py`, `packing.py`:
  batches; `outputs.py`: the output-directory checks every stage shares;
- `features/`: the offline target-feature cache; `draft_vocab.py`: the reduced vocabulary.

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
    "normalize_row": "prompts.rows",
    "normalize_rows": "prompts.prompt_set",
    "PromptSet": "prompts.prompt_set",
    "MalformedRow": "prompts.rows",
    "embedded_prompts": "prompts.embedded",
    "regenerate": "regeneration.regenerate",
    "SamplingConfig": "regeneration.sampling",
    "HFBackend": "regeneration.hf_backend",
    "OpenAIBackend": "regeneration.openai_backend",
    "DecoderBackend": "regeneration.decoder_backend",
    "row_seed": "regeneration.sampling",
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
