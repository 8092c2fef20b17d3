"""`HFBackend`: batched HF `model.generate` with left padding (the fallback local backend).

Sampling (T > 0) goes through `_RowSampler`, a logits processor that draws each row from its
own generator, so a row's answer depends only on its seed, as with the other backends.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList

from dspark.data.regeneration.sampling import (
    SamplingConfig,
    prompt_texts,
    reply_from_tokens,
    stop_token_ids,
)


class _RowSampler:
    """A logits processor that samples each row from its own generator.

    It returns scores that are -inf everywhere except the sampled token, so HF's greedy step
    picks it: each row's draws depend only on its own seed, never on its batch neighbours.
    """

    def __init__(self, seeds, sampling: SamplingConfig, device):
        self.gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.s = sampling

    def __call__(self, input_ids, scores):
        logits = scores.float() / self.s.temperature
        if self.s.top_k and self.s.top_k > 0:
            k = min(self.s.top_k, logits.shape[-1])
            kth = torch.topk(logits, k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.s.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop = cum - sorted_logits.softmax(-1) >= self.s.top_p  # keep the first past top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        probs = logits.softmax(-1)
        out = torch.full_like(scores, float("-inf"))
        for i, g in enumerate(self.gens):
            tok = torch.multinomial(probs[i], 1, generator=g)
            out[i, tok] = 0.0
        return out


class HFBackend:
    """Batched `model.generate` with left padding and the target's chat template."""

    name = "hf"

    def __init__(self, model, tokenizer, chat_template_kwargs=None):
        self.model, self.tok = model, tokenizer
        self.kw = chat_template_kwargs or {}
        self.stop_ids = stop_token_ids(tokenizer, self.kw)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        )

    @property
    def device(self):
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, convs, seeds, sampling: SamplingConfig):
        texts = prompt_texts(self.tok, convs, self.kw)
        side = self.tok.padding_side
        self.tok.padding_side = "left"
        try:
            enc = self.tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        finally:
            self.tok.padding_side = side
        enc = {k: v.to(self.device) for k, v in enc.items()}
        cfg = GenerationConfig(
            do_sample=False,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
        )
        procs = LogitsProcessorList()
        if sampling.temperature > 0:
            procs.append(_RowSampler(seeds, sampling, self.device))
        out = self.model.generate(**enc, generation_config=cfg, logits_processor=procs)
        new = out[:, enc["input_ids"].shape[1] :].tolist()
        stop = set(self.stop_ids)
        return [reply_from_tokens(self.tok, row, stop) for row in new]
