"""`DecoderBackend`: regeneration on dspark's own static-cache batched decoder (its AR path).

Why not HF `generate`: the decoder keeps a preallocated, position-indexed KV cache (right
padding, slot = position, no per-step concatenation) and batches continuously: rows are
sorted by prompt length and `batch_size` of them decode at once, a finished row's slot taking
the next waiting one after a prefill of its own (`generate_autoregressive(max_batch=...)`), so
the batch stays full instead of running on with fewer and fewer rows until its longest answer
ends.

Greedy answers equal HF `generate` token for token (tests compare them on the tiny targets and
SmolLM2). At T > 0 each row samples from its own `torch.Generator` seeded with its
`row_seed(seed, index, turn)`, so its answer depends on its own seed only, not on which rows
share its batch or where it sits in it. The random stream differs from `HFBackend`'s (an
exponential race instead of `torch.multinomial`), so sampled answers differ between the two
backends; both draw from the same warped distribution (temperature, top-k, top-p).
"""

from __future__ import annotations

import torch

from dspark.data.regeneration.sampling import (
    GenerationFailed,
    SamplingConfig,
    TokenIdBackend,
    stop_token_ids,
)
from dspark.decoding import DecoderOptions, SpeculativeDecoder
from dspark.decoding.sampling import Sampling


class DecoderBackend(TokenIdBackend):
    """Answer chat prompts with `SpeculativeDecoder.generate_autoregressive`.

    `generate(convs, seeds, sampling)` returns one `Reply` per conversation, or a
    `GenerationFailed` for a conversation that cannot be answered (prompt too long), so one bad
    row never fails its neighbours.
    """

    name = "decoder"

    def __init__(
        self,
        model,
        tokenizer,
        chat_template_kwargs: dict | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
    ):

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tok = model, tokenizer
        self.kw = chat_template_kwargs or {}
        self.stop_ids = stop_token_ids(tokenizer, self.kw)
        self.batch_size = batch_size
        self.max_length = max_length or int(
            getattr(model.config, "max_position_embeddings", None) or 4096
        )
        self.decoder = SpeculativeDecoder(model, None, DecoderOptions(max_length=self.max_length))

    @property
    def device(self):
        return self.decoder.device

    def conditions(self) -> dict:
        """What the answers' speed and numerics depend on: engine, dtype, rows decoding at once."""
        dtype = str(self.model.dtype).removeprefix("torch.")
        return {"engine": "dspark decoder", "dtype": dtype, "live_batch": self.batch_size}

    def generate_ids(
        self, ids: list[list[int]], seeds, sampling: SamplingConfig
    ) -> list[list[int] | GenerationFailed]:
        """Generated ids per prompt (a final stop id included), in the order of `ids`."""
        spare = sampling.max_new_tokens + 2  # the decoder's cache needs 2 spare slots
        results: dict[int, list[int] | GenerationFailed] = {}  # every index gets one below
        ok = []
        for i, p in enumerate(ids):
            if not p:
                results[i] = GenerationFailed("the chat template rendered an empty prompt")
            elif len(p) + spare > self.max_length:
                results[i] = GenerationFailed(
                    f"prompt of {len(p)} tokens + max_new_tokens {sampling.max_new_tokens} "
                    f"exceeds the target's length limit {self.max_length}; lower "
                    "--max-new-tokens or drop the row"
                )
            else:
                ok.append(i)
        dec = self.decoder
        dec.options.sampling = Sampling(sampling.temperature, sampling.top_k, sampling.top_p)
        # shortest first (ties by position): rows decoding together have similar lengths; the
        # decoder keeps `batch_size` of them live, a finished row's slot taking the next one
        order = sorted(ok, key=lambda i: (len(ids[i]), i))
        if order:
            gens = None
            if sampling.temperature > 0:
                gens = [
                    torch.Generator(device=self.device).manual_seed(int(seeds[i])) for i in order
                ]
            out = dec.generate_autoregressive(
                [ids[i] for i in order],
                sampling.max_new_tokens,
                eos_token_id=self.stop_ids,
                generators=gens,
                max_batch=self.batch_size,
            )
            for i, seq in zip(order, out.sequences):
                results[i] = seq
        return [results[i] for i in range(len(ids))]
