"""Tiny random targets (Llama, Qwen2, Qwen3) with a real BPE tokenizer and chat template.

Built in-process, deterministically, with no network: the test suite and the `debug` recipe
use them as stand-ins for real targets. Each family keeps its real chat-template shape, so
loss-mask code is exercised on templates that differ the way real ones do.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import string
import tempfile
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerFast


TINY_ARCHS = ("llama", "qwen2", "qwen3")

_SPECIALS = {
    "llama": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|reserved_0|>",
    ],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|reserved_0|>"],
    "qwen3": [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<|reserved_0|>",
    ],
}

# Llama-3 style: header blocks, <|eot_id|> ends a turn, no generation markers.
_LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# ChatML with {% generation %} markers (what HF's return_assistant_tokens_mask reads).
_QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen3 style: ChatML plus an empty think block before every assistant answer, no markers.
_QWEN3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' + message['content'] + '<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}{% endif %}"
)
_TEMPLATES = {"llama": _LLAMA_TEMPLATE, "qwen2": _QWEN2_TEMPLATE, "qwen3": _QWEN3_TEMPLATE}


def _corpus() -> list[str]:
    """Deterministic English-and-code text to train the tiny BPE on (stdlib docstrings)."""
    texts = []
    for mod in (json, string, textwrap, collections, os):
        texts.append(mod.__doc__ or "")
        for name in sorted(dir(mod)):
            doc = getattr(getattr(mod, name), "__doc__", None)
            if isinstance(doc, str):
                texts.append(doc)
    texts.append("def add(a, b):\n    return a + b\nThe answer is 42. What is 2 + 3? It is 5.")
    return texts


def build_tiny_tokenizer(arch: str, vocab_size: int = 384) -> PreTrainedTokenizerFast:
    from tokenizers import (  # start-up: keeps dspark.target light
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # start-up: keeps dspark.target light

    specials = _SPECIALS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    kwargs = {"chat_template": _TEMPLATES[arch]}
    if arch == "llama":
        kwargs.update(
            bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|end_of_text|>"
        )
    else:
        kwargs.update(eos_token="<|im_end|>", pad_token="<|endoftext|>")
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def tiny_config(
    arch: str, vocab_size: int, num_layers: int = 4, **overrides: Any
) -> PretrainedConfig:
    from transformers import (  # start-up: keeps dspark.target light
        LlamaConfig,
        Qwen2Config,
        Qwen3Config,
    )

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    kw = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    kw.update(overrides)
    return cls(**kw)


def build_tiny_target(
    arch: str, out_dir: str | os.PathLike, *, num_layers: int = 4, seed: int = 0
) -> Path:
    """Write a tiny random `arch` target (config, safetensors, tokenizer) to `out_dir`.

    Atomic: built in a sibling temp dir and renamed, so a killed build leaves nothing that a
    later call would trust.
    """
    from transformers import AutoModelForCausalLM  # start-up: keeps dspark.target light

    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny target architecture {arch!r}; choose one of {TINY_ARCHS}")
    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer(arch)
    cfg = tiny_config(
        arch,
        vocab_size=len(tok),
        num_layers=num_layers,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # Sharper random logits than the default init, so greedy/sampled tests see real choices.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.chmod(0o755)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race; theirs is equally valid
        shutil.rmtree(tmp, ignore_errors=True)
    return out
