"""Tokenizer metadata (`tokenizer.*` keys) of a GGUF draft, taken from its target.

llama.cpp tokenizes with the draft's own vocabulary metadata, so it must be the target's,
token for token. Two sources:

- the target's GGUF: every `tokenizer.*` key is copied with its value type;
- the target's HF directory (a BPE `tokenizer.json`): tokens and token types from the
  tokenizer's vocabulary (ids it leaves unused become `[PAD{i}]`, UNUSED), merges, special
  token ids, add-bos/eos flags and the chat template through `gguf.SpecialVocab`, and the
  pre-tokenizer name llama.cpp splits text with (`tokenizer.ggml.pre`), read off the
  tokenizer's pre-tokenizer rules (`PRE_TOKENIZERS`). A SentencePiece-only target (no
  tokenizer.json) is refused: pass its GGUF instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
from transformers import AutoTokenizer

from dspark.errors import BadInputError

# llama.cpp's pre-tokenizer names for the split rules of the families dspark targets: the
# regex of a `Split` pre-tokenizer (Qwen2/Qwen3, Llama-3), or the shape of a bare ByteLevel
# one (GPT-2's built-in regex; SmolLM2 puts digit-splitting before it).
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {
    ("split", QWEN2_REGEX): "qwen2",
    ("split", LLAMA3_REGEX): "llama-bpe",
    ("bytelevel",): "gpt-2",
    ("digits", "bytelevel"): "smollm",
}
GGUF_HINT = "pass target=<the target's .gguf file>, whose tokenizer metadata is copied as is"


def _pre_tokenizer_shape(pre: dict[str, Any] | None) -> tuple[str, ...]:
    """The key `PRE_TOKENIZERS` is looked up by, from a tokenizer.json `pre_tokenizer`."""
    if not pre:
        return ()
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    shape: list[str] = []
    for step in steps:
        kind = step.get("type", "").lower()
        if kind == "split":
            shape += ["split", (step.get("pattern") or {}).get("Regex", "")]
        elif kind == "bytelevel" and step.get("use_regex", True):
            shape.append("bytelevel")  # GPT-2's regex is applied here
        elif kind == "digits" and step.get("individual_digits"):
            shape.append("digits")
        elif kind != "bytelevel":  # a ByteLevel without regex only maps bytes
            shape.append(kind)
    return tuple(shape)


def _token_types(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Token strings and llama.cpp token types for ids 0..vocab_size-1: added special tokens
    (and `<|...|>` ones) are CONTROL, other added tokens USER_DEFINED (pre-normalised the way
    the tokenizer would normalise them), ids without a token UNUSED."""
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    if by_id and max(by_id) >= vocab_size:
        raise BadInputError(
            f"the target's tokenizer has ids up to {max(by_id)}, beyond the draft's vocabulary "
            f"of {vocab_size}: the draft was not built for this target"
        )
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        kind = gguf.TokenType.NORMAL
        if token in added:
            if not decoder[i].normalized:  # llama.cpp expects added tokens pre-normalised
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or (token.startswith("<|") and token.endswith("|>")):
                kind = gguf.TokenType.CONTROL
            else:
                token = token.replace("\u2581", " ")
                kind = gguf.TokenType.USER_DEFINED
        tokens.append(token)
        types.append(kind)
    return tokens, types


def add_hf_vocab(
    writer: gguf.GGUFWriter,
    target_dir: str | Path,
    *,
    vocab_size: int,
    family: str,
    pre: str | None = None,
) -> None:
    """Write the tokenizer metadata of the HF target directory `target_dir`.

    `vocab_size`: the draft's (= the target's embedding rows). `family`: the target's model
    type (llama | qwen2 | qwen3), for the per-family keys llama.cpp's own converter writes.
    `pre`: llama.cpp's pre-tokenizer name, when the tokenizer's rules are not in
    `PRE_TOKENIZERS`."""
    target_dir = Path(target_dir)
    tok_file = target_dir / "tokenizer.json"
    if not tok_file.is_file():
        raise BadInputError(f"{target_dir} has no tokenizer.json (a BPE tokenizer); {GGUF_HINT}")
    raw = json.loads(tok_file.read_text())
    if (raw.get("model") or {}).get("type") != "BPE":
        raise BadInputError(f"{tok_file} is not a BPE tokenizer; {GGUF_HINT}")
    if pre is None:
        shape = _pre_tokenizer_shape(raw.get("pre_tokenizer"))
        pre = PRE_TOKENIZERS.get(shape)
        if pre is None:
            raise BadInputError(
                f"{tok_file}: pre-tokenizer rules {shape!r} are not ones llama.cpp is known to "
                "split the same way; pass tokenizer_pre=<llama.cpp's name for them>, or "
                + GGUF_HINT
            )
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    tokens, types = _token_types(tokenizer, vocab_size)
    if family == "llama":
        cfg_file = target_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        if cfg.get("add_prefix_space") is not None:
            writer.add_add_space_prefix(cfg["add_prefix_space"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(target_dir, load_merges=True).add_to_gguf(writer)
    if family == "llama" and vocab_size == 49152:
        # SmolLM2 / Granite's 49152-token vocabulary: no BOS is prepended, whatever the
        # tokenizer config says (what llama.cpp's converter writes for these targets)
        writer.add_add_bos_token(False)


def add_gguf_vocab(writer: gguf.GGUFWriter, target_gguf: str | Path, *, vocab_size: int) -> None:
    """Copy every `tokenizer.*` key of the target GGUF `target_gguf`, value types kept."""
    reader = gguf.GGUFReader(str(target_gguf))
    fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    tokens = fields.get(gguf.Keys.Tokenizer.LIST)
    if tokens is None:
        raise BadInputError(f"{target_gguf} holds no tokenizer metadata (tokenizer.ggml.tokens)")
    if len(tokens.data) != vocab_size:
        raise BadInputError(
            f"{target_gguf} has {len(tokens.data)} tokens but the draft's vocabulary has "
            f"{vocab_size}: the draft was not built for this target"
        )
    for key, field in fields.items():
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)


def gguf_block_count(target_gguf: str | Path) -> int | None:
    """The target GGUF's decoder-layer count (`{arch}.block_count`), or None."""
    reader = gguf.GGUFReader(str(target_gguf))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    field = reader.fields.get(f"{arch}.block_count")
    return None if field is None else int(field.contents())
