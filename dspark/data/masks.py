"""Loss masks: 1 on assistant content plus the end-of-turn marker, 0 on all template text.

Two methods, chosen per template (`method="auto"`):
- `markers`: the template has `{% generation %}` blocks, so HF's `return_assistant_tokens_mask`
  says which tokens are assistant tokens. The end-of-turn token right after each assistant
  span is added when the markers left it out.
- `offsets`: any template. Render the conversation, locate each assistant message's content
  in the rendered string (searching from the end of that turn's own generation prompt, so the
  header, a default system prompt and e.g. Qwen3's `<think>\\n\\n</think>\\n\\n` block are never
  matched), map the char span to tokens with the fast tokenizer's offset mapping (a token is
  in the mask when it starts inside the content), then extend over the end-of-turn token that
  follows.

Template text inserted into an assistant turn (Qwen3's empty think block) is NOT in the
mask: the target does not generate it when the template already put it in the prompt.

`check_loss_masks` is the preflight: it fails loudly on all-zero masks, all-one masks, masks
that cover template text and masks that miss an assistant turn or its end-of-turn marker.
"""

from __future__ import annotations

import re

from dspark.errors import BadInputError

GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")
_SENTINEL = "DSPARKSENTINEL7q"


class LossMaskError(BadInputError):
    """The loss mask is wrong for this template; the message names the problem and the fix
    (a `UserError`: the entry scripts print it as one line)."""


def template_of(tokenizer) -> str:
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):  # several named templates: the default one is used
        tpl = tpl.get("default") or next(iter(tpl.values()))
    if not tpl:
        raise LossMaskError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "use an instruct/chat target or set tokenizer.chat_template"
        )
    return tpl


def has_generation_markers(tokenizer) -> bool:
    return bool(GENERATION_TAG.search(template_of(tokenizer)))


def render(tokenizer, messages, add_generation_prompt=False, chat_template_kwargs=None) -> str:
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **(chat_template_kwargs or {}),
    )


def end_of_turn_ids(tokenizer, chat_template_kwargs=None) -> list[int]:
    """Token ids that end an assistant turn in this template (e.g. `<|im_end|>`, `<|eot_id|>`).

    Found by rendering a sentinel answer and reading the special token right after it; falls
    back to the eos token when the template puts no special token there.
    """
    ids = set()
    try:
        text = render(
            tokenizer,
            [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _SENTINEL}],
            chat_template_kwargs=chat_template_kwargs,
        )
        at = text.find(_SENTINEL)
        if at >= 0:
            suffix = text[at + len(_SENTINEL) :]
            first = tokenizer(suffix, add_special_tokens=False)["input_ids"][:1]
            special = set(tokenizer.all_special_ids) | set(
                getattr(tokenizer, "added_tokens_decoder", {}).keys()
            )
            if first and first[0] in special:
                ids.add(first[0])
    except Exception:  # a template that refuses the probe: fall back to eos
        pass
    if not ids and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def _mask_by_markers(tokenizer, messages, eot, chat_template_kwargs):
    enc = tokenizer.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        **(chat_template_kwargs or {}),
    )
    ids = list(enc["input_ids"])
    mask = [int(bool(m)) for m in enc["assistant_masks"]]
    for _, end in _runs(mask):  # markers that stop before the end-of-turn token
        if end < len(ids) and ids[end] in eot:
            mask[end] = 1
    return ids, mask


def _mask_by_offsets(tokenizer, messages, eot, chat_template_kwargs):
    if not getattr(tokenizer, "is_fast", False):
        raise LossMaskError(
            "the offsets loss-mask method needs a fast tokenizer (offset mapping); load the "
            "target's tokenizer.json or add {% generation %} markers to the chat template"
        )
    text = render(tokenizer, messages, chat_template_kwargs=chat_template_kwargs)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    mask = [0] * len(ids)
    cursor = 0
    for k, m in enumerate(messages):
        content = m["content"]
        start = cursor
        if m["role"] == "assistant" and k > 0:
            try:
                prefix = render(
                    tokenizer,
                    messages[:k],
                    add_generation_prompt=True,
                    chat_template_kwargs=chat_template_kwargs,
                )
            except Exception:
                prefix = None
            if prefix is not None and text.startswith(prefix) and len(prefix) >= cursor:
                start = len(prefix)
        pos = text.find(content, start)
        if pos < 0 and content.strip():
            content = content.strip()
            pos = text.find(content, start)
        if pos < 0:
            if m["role"] != "assistant":
                continue  # templates may drop or rewrite non-assistant text; not our span
            raise LossMaskError(
                f"cannot find assistant message {k} in the rendered chat template (the template "
                "rewrites assistant content). Add {% generation %} markers to the template or "
                "pass messages in the form the template renders verbatim."
            )
        end = pos + len(content)
        cursor = end
        if m["role"] != "assistant":
            continue
        last = None
        for j, (s, e) in enumerate(offsets):
            if e > s and pos <= s < end:
                mask[j] = 1
                last = j
        if last is not None:
            nxt = last + 1
            while nxt < len(ids) and offsets[nxt][1] <= offsets[last][1]:
                nxt += 1  # zero-width or overlapping tokens
            if nxt < len(ids) and ids[nxt] in eot and not text[end : offsets[nxt][0]].strip():
                mask[nxt] = 1
    return ids, mask


def assistant_mask(
    tokenizer, messages, *, method: str = "auto", eot_ids=None, chat_template_kwargs=None
) -> tuple[list[int], list[int], str]:
    """Tokenize `messages` with the chat template; return `(input_ids, loss_mask, method)`."""
    eot = set(end_of_turn_ids(tokenizer, chat_template_kwargs) if eot_ids is None else eot_ids)
    if method == "auto":
        method = "markers" if has_generation_markers(tokenizer) else "offsets"
    if method == "markers":
        if not has_generation_markers(tokenizer):
            raise LossMaskError(
                "mask method 'markers' needs {% generation %} blocks in the chat template; "
                "use method 'offsets' (or 'auto')"
            )
        ids, mask = _mask_by_markers(tokenizer, messages, eot, chat_template_kwargs)
    elif method == "offsets":
        ids, mask = _mask_by_offsets(tokenizer, messages, eot, chat_template_kwargs)
    else:
        raise ValueError(f"unknown mask method {method!r}; use auto, markers or offsets")
    return ids, mask, method


def unmask_cut_turns(ids, mask, finish_reasons, eot) -> list[int]:
    """Take the end-of-turn marker out of the mask of answers cut by `max_new_tokens`.

    The template closes every assistant turn with its marker, but the target never chose to
    stop an answer that hit the token limit; training the draft to predict the stop there
    would be off-policy. `finish_reasons[k]` ("stop" | "length") belongs to assistant turn k.
    """
    if not finish_reasons or "length" not in finish_reasons:
        return mask
    mask = list(mask)
    for (_, end), reason in zip(_runs(mask), finish_reasons):
        if reason == "length" and ids[end - 1] in eot:
            mask[end - 1] = 0
    return mask


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def check_loss_masks(
    tokenizer, rows, *, eot_ids=None, max_rows: int = 64, max_length: int | None = None
) -> None:
    """Preflight: raise `LossMaskError` naming the problem and the fix when masks are wrong.

    `rows` have `messages`, `input_ids`, `loss_mask`. All rows are checked for all-zero and
    all-one masks; the first `max_rows` are checked token by token against the assistant
    contents (template text in the mask, missed assistant turns, missing end-of-turn marker).
    `max_length` says which rows may have been truncated (those get the lenient checks).
    """
    eot = set(end_of_turn_ids(tokenizer) if eot_ids is None else eot_ids)
    total = 0
    fix = (
        "Check the chat template (its {% generation %} markers, or that it renders assistant "
        "content verbatim) and the --mask-method; see dspark/data/masks.py."
    )
    for r, row in enumerate(rows):
        mask = list(row["loss_mask"])
        if len(mask) != len(row["input_ids"]):
            raise LossMaskError(f"row {r}: loss_mask and input_ids differ in length")
        total += sum(mask)
        if mask and all(mask):
            raise LossMaskError(
                f"loss mask is all ones in row {r}: it covers the whole sequence, including "
                f"role headers and user turns, so the draft would learn the template. {fix}"
            )
    if total == 0:
        raise LossMaskError(
            "loss masks are all zero: no assistant token would be trained. The rows may have "
            "no assistant turns (regenerate them first: data_scripts/regenerate.py), or the "
            f"template's assistant text was not found. {fix}"
        )
    for r, row in enumerate(rows):
        if r >= max_rows:
            break
        ids, mask = list(row["input_ids"]), list(row["loss_mask"])
        answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        truncated = max_length is not None and len(ids) >= max_length
        runs = _runs(mask)
        cut = list(row.get("finish_reasons") or [])
        for k, (s, e) in enumerate(runs):
            body = ids[s:e]
            ended = bool(body) and body[-1] in eot
            if ended:
                body = body[:-1]
            text = _decode(tokenizer, body)
            pieces = [p for p in text.split("\ufffd") if p.strip()]
            if not all(any(p.strip() in a for a in answers) for p in pieces):
                raise LossMaskError(
                    f"loss mask covers template text in row {r}: masked tokens {s}..{e - 1} "
                    f"decode to {text[:120]!r}, which is not assistant content (role headers, "
                    f"system prompt or think block must stay unmasked). {fix}"
                )
            was_cut = k < len(cut) and cut[k] == "length"
            if eot and not ended and not was_cut and not (truncated and e == len(ids)):
                raise LossMaskError(
                    f"loss mask of row {r} misses the end-of-turn marker after tokens {s}..{e - 1}"
                    f" (expected one of {sorted(eot)}); the draft must learn to stop. {fix}"
                )
        if not truncated and len(runs) != len(answers):
            raise LossMaskError(
                f"row {r} has {len(answers)} assistant turns but the loss mask has {len(runs)} "
                f"spans. {fix}"
            )
