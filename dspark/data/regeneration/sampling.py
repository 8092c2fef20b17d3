"""The contract between the regeneration loop and its backends, and what they share.

Parallels `dspark/decoding/sampling.py`, how the bundled decoder samples from logits.

A backend has `generate(convs, seeds, sampling) -> [Reply | exception]`: one reply per
conversation, row i sampled from `seeds[i]` alone (`row_seed(seed, row index, turn)`), so a
row's answer never depends on its batch neighbours. The local backends render prompts with
`prompt_texts` (the chat template with `add_generation_prompt`) and cut the generated ids at
`stop_token_ids` with `reply_from_tokens`.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from dspark.data.masks import end_of_turn_ids


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    seed: int = 0


@dataclass
class Reply:
    text: str
    tokens: int
    finish_reason: str  # "stop" | "length"
    reasoning: str | None = None  # a server's reasoning_content, kept on request


class GenerationFailed(RuntimeError):
    pass


def row_seed(seed: int, index: int, turn: int) -> int:
    """The per-row, per-turn sampling seed (63 bits, the same on every machine)."""
    digest = hashlib.sha256(f"{seed}:{index}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def stop_token_ids(tokenizer, chat_template_kwargs=None) -> list[int]:
    """The ids that end an answer: the chat template's end-of-turn marker(s) and EOS."""
    stop = set(end_of_turn_ids(tokenizer, chat_template_kwargs or {}))
    if tokenizer.eos_token_id is not None:
        stop.add(tokenizer.eos_token_id)
    return sorted(stop)


def prompt_texts(tokenizer, convs, chat_template_kwargs=None) -> list[str]:
    """Each conversation rendered by the chat template, ready for the assistant's answer."""
    kw = chat_template_kwargs or {}
    return [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True, **kw)
        for c in convs
    ]


def reply_from_tokens(tokenizer, tokens: list[int], stop_ids) -> Reply:
    """A `Reply` from generated ids: cut at the first stop id (counted, not decoded)."""
    cut = next((j for j, t in enumerate(tokens) if t in stop_ids), None)
    body = tokens if cut is None else tokens[:cut]
    text = tokenizer.decode(body, skip_special_tokens=True)
    return Reply(text, len(body) + (cut is not None), "length" if cut is None else "stop")


class TokenIdBackend(ABC):
    """The chat side every local backend shares: conversations rendered to prompt ids (the
    template text, no added specials, as HF `generate` is fed) and generated ids cut into
    replies at `stop_ids`. A subclass sets `tok`, `kw` and `stop_ids` and decodes ids:
    `generate_ids(ids, seeds, sampling) -> [ids (a final stop id included) | GenerationFailed]`.
    """

    tok: Any
    kw: dict
    stop_ids: list[int]

    @abstractmethod
    def generate_ids(self, ids: list[list[int]], seeds, sampling: SamplingConfig) -> list:
        """Generated ids per prompt, in the order of `ids` (each backend's own decoding)."""

    def encode(self, convs) -> list[list[int]]:
        texts = prompt_texts(self.tok, convs, self.kw)
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def generate(self, convs, seeds, sampling: SamplingConfig) -> list[Reply | GenerationFailed]:
        stop = set(self.stop_ids)
        outs = self.generate_ids(self.encode(convs), seeds, sampling)
        return [
            o if isinstance(o, GenerationFailed) else reply_from_tokens(self.tok, o, stop)
            for o in outs
        ]
