"""Conversations with a fixed-length filler answer after every user turn: for measurements whose
result depends on sequence lengths only (padding share, step time), without regenerating the
answers with the target (which costs minutes to hours). Never train a real draft on them.
"""

from __future__ import annotations


def filler_answer(tokenizer, answer_tokens: int) -> tuple[str, int]:
    """A plain answer text and its token count (`"ok ok ok ..."`: one token per word for BPE
    tokenizers, so the count is usually exactly `answer_tokens`)."""
    text = "ok" + " ok" * (int(answer_tokens) - 1)
    return text, len(tokenizer(text, add_special_tokens=False)["input_ids"])


def with_fixed_answers(prompt_rows, answer: str) -> list[dict]:
    """Prompt rows (`{"messages": [...]}`) with every user turn answered by `answer`; existing
    assistant turns are replaced."""
    out = []
    for row in prompt_rows:
        msgs = []
        for m in row["messages"]:
            if m["role"] == "assistant":
                continue
            msgs.append(m)
            if m["role"] == "user":
                msgs.append({"role": "assistant", "content": answer})
        out.append({**row, "messages": msgs})
    return out
