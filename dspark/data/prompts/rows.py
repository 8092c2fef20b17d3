"""Every row shape people have, normalised to one: `[{"role", "content"}, ...]` messages.

Accepted shapes (first match wins, keys whose value is None count as absent):
- `messages`: OpenAI `[{"role": system|user|assistant, "content": str}, ...]`
- `conversations`: ShareGPT `[{"from": human|user|gpt|assistant|chatgpt|system, "value": str}]`
- `turns`: `["user turn 1", "user turn 2", ...]` (as in the bench and training prompt sets);
  user turns only, the assistant answers come from regeneration.
- Alpaca: `instruction` (+ optional `input`, optional `output`).

A row that cannot be normalised raises `MalformedRow(reason)`; a line a reader could not even
parse arrives as a `BadLine` with its reason. Neither is fatal: `prompt_set.normalize_rows`
turns both into rejected rows.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


class MalformedRow(ValueError):
    """A row that cannot be normalised; the message is the reason."""


class BadLine:
    """A source line that could not be read as a row (not UTF-8, not JSON); `reason` says why."""

    def __init__(self, reason: str):
        self.reason = reason


def _present(row: dict, key: str) -> bool:
    return key in row and row[key] is not None


def _content(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedRow(f"{where}: content must be a string, got {type(value).__name__}")
    if not value.strip():
        raise MalformedRow(f"{where}: empty content")
    return value


def _check_order(messages: list[dict]) -> list[dict]:
    if not messages:
        raise MalformedRow("no messages")
    for i, m in enumerate(messages):
        if m["role"] == "system" and i != 0:
            raise MalformedRow(f"message {i}: a system message is only allowed first")
    if not any(m["role"] == "user" for m in messages):
        raise MalformedRow("no user message")
    return messages


def _from_messages(msgs: Any) -> list[dict]:
    if not isinstance(msgs, list):
        raise MalformedRow(f"'messages' must be a list, got {type(msgs).__name__}")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise MalformedRow(f"message {i}: must be an object, got {type(m).__name__}")
        role = m.get("role")
        if role is None:
            raise MalformedRow(f"message {i}: missing role")
        if role not in ROLES:
            raise MalformedRow(f"message {i}: unsupported role {role!r} (use one of {ROLES})")
        if m.get("content") is None:
            raise MalformedRow(f"message {i}: missing content")
        out.append({"role": role, "content": _content(m["content"], f"message {i}")})
    return _check_order(out)


def _from_sharegpt(conv: Any) -> list[dict]:
    if not isinstance(conv, list):
        raise MalformedRow(f"'conversations' must be a list, got {type(conv).__name__}")
    out = []
    for i, m in enumerate(conv):
        if not isinstance(m, dict):
            raise MalformedRow(f"conversation turn {i}: must be an object, got {type(m).__name__}")
        who = m.get("from")
        if who is None:
            raise MalformedRow(f"conversation turn {i}: missing role ('from')")
        if not isinstance(who, str) or who.lower() not in SHAREGPT_ROLES:
            raise MalformedRow(f"conversation turn {i}: unknown speaker {who!r}")
        if m.get("value") is None:
            raise MalformedRow(f"conversation turn {i}: missing 'value'")
        out.append(
            {
                "role": SHAREGPT_ROLES[who.lower()],
                "content": _content(m["value"], f"conversation turn {i}"),
            }
        )
    return _check_order(out)


def _from_turns(turns: Any) -> list[dict]:
    if isinstance(turns, str) or not isinstance(turns, list):
        raise MalformedRow(f"'turns' must be a list of strings, got {type(turns).__name__}")
    return _check_order(
        [{"role": "user", "content": _content(t, f"turn {i}")} for i, t in enumerate(turns)]
    )


def _from_alpaca(row: dict) -> list[dict]:
    instruction = _content(row["instruction"], "instruction")
    extra = row.get("input")
    if extra is not None and not isinstance(extra, str):
        raise MalformedRow(f"input: must be a string, got {type(extra).__name__}")
    user = instruction if not extra or not extra.strip() else f"{instruction}\n\n{extra}"
    msgs = [{"role": "user", "content": user}]
    if _present(row, "system"):
        msgs.insert(0, {"role": "system", "content": _content(row["system"], "system")})
    out = row.get("output")
    if out is not None:
        if not isinstance(out, str):
            raise MalformedRow(f"output: must be a string, got {type(out).__name__}")
        if out.strip():
            msgs.append({"role": "assistant", "content": out})
    return msgs


def normalize_row(row: Any) -> list[dict]:
    """Return the row as OpenAI-style `messages`, or raise `MalformedRow(reason)`."""
    if not isinstance(row, dict):
        raise MalformedRow(f"row must be an object, got {type(row).__name__}")
    if _present(row, "messages"):
        return _from_messages(row["messages"])
    if _present(row, "conversations"):
        return _from_sharegpt(row["conversations"])
    if _present(row, "turns"):
        return _from_turns(row["turns"])
    if _present(row, "instruction"):
        return _from_alpaca(row)
    keys = sorted(k for k in row if row[k] is not None)
    raise MalformedRow(
        f"unknown row shape (keys {keys}); expected 'messages', 'conversations', 'turns' or "
        "'instruction'"
    )
