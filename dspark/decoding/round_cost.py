"""What the parts of a speculative round cost on this device, timed with the decoder's own parts.

`RoundBench(target, draft, batch=B, context_len=C, max_tokens=N)` fills a static target cache
with a C-token context of random ids for B rows (one row's prefill, copied into every row; the
tapped features of that prefill fill each timed draft's context cache), then times, each a
`dspark.timing.median_time` of repeated calls:
- `ar_step`: one plain AR step (1 token a row, logits, argmax);
- `verify(n)`: one target pass over n <= N tokens a row after the context, tapped when the
  bench has taps, row-exact where the decoder would run it so (`exact_rows`,
  row_attention.py), with the argmax the verifier takes and (`write_context=True`) the
  draft's `context_kv` of the new features written into its context cache: the target side
  of a round;
- `draft_round(draft)`: one `propose` call (block pass + serial Markov loop + confidence) at
  T = 0 over the C-token context, with the draft's reduced vocabulary when it has one (the
  whole block, or its first `steps` tokens).
Every timed call rewrites the same slots after the context, so the caches never grow.

The cost model (`dspark.bench.cost_model`), the SPS profile (`dspark.decoding.sps`) and the
dtype probe (`dspark.dtype_probe`) all time these passes here. Step times are about speed only:
the ids are random.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dspark.decoding.cache import DraftContextCache, TargetKVCache, bucket, row_kv_lengths
from dspark.decoding.draft_step import propose
from dspark.decoding.draft_vocab import DraftVocab
from dspark.decoding.row_attention import exact_rows_for
from dspark.decoding.target_step import TargetRunner
from dspark.timing import median_time


class RoundBench:
    """A target over a static cache holding a `context_len`-token context for `batch` rows.

    `taps`: the target layers tapped in `verify` (default: `draft`'s `target_layer_ids`, none
    without a draft); `draft`: the draft whose context cache `verify` writes. `max_tokens`:
    the most tokens a row one `verify` runs; `gamma`: the block size of the rounds timed
    (default `draft`'s, else 0). `exact_rows`: time verify passes with row-exact attention
    (default: where the decoder uses it, `default_exact_rows`; only batch 1 runs it)."""

    def __init__(
        self,
        target,
        draft=None,
        *,
        batch: int = 1,
        context_len: int = 256,
        max_tokens: int = 8,
        taps: Sequence[int] | None = None,
        gamma: int | None = None,
        seed: int = 0,
        exact_rows: bool | None = None,
    ) -> None:
        self.target, self.draft = target, draft
        self.device = next(target.parameters()).device
        self.exact_rows = exact_rows_for(target, exact_rows) and int(batch) == 1
        self.batch, self.context_len = int(batch), int(context_len)
        if gamma is None:
            gamma = int(draft.config.block_size) if draft is not None else 0
        self.gamma = int(gamma)
        if taps is None:
            taps = list(draft.config.target_layer_ids) if draft is not None else []
        self.taps = list(taps)
        self.max_tokens = max(1, int(max_tokens))
        self.max_len = bucket(context_len + max(self.max_tokens, self.gamma) + 2, 64, 1 << 30)
        with torch.inference_mode():  # caches and ids as the decoder makes them
            self._prefill(seed)

    def _prefill(self, seed: int) -> None:
        context_len, batch, target = self.context_len, self.batch, self.target
        gen = torch.Generator(device="cpu").manual_seed(seed)
        vocab = int(target.config.vocab_size)
        ids = torch.randint(0, vocab, (batch, context_len + self.max_tokens), generator=gen)
        self.ids = ids.to(self.device)  # [B, context + max_tokens]: the context, then the steps
        self.pos = torch.arange(context_len + self.max_tokens, device=self.device)[None]
        self.pos = self.pos.expand(batch, -1)
        self.runner = TargetRunner(target, self.taps)
        # One row's context, copied into all B: the timed passes read B rows of cache as
        # they would any context, and a B-row prefill costs B times as much (minutes for
        # B = 32 in bf16 on a CPU without bf16 units) to fill it with other random ids.
        first = TargetKVCache.for_model(target, 1, self.max_len)
        _, taps = self.runner.forward(
            self.ids[:1, :context_len],
            self.pos[:1, :context_len],
            first,
            bucket(context_len, 16, self.max_len),
            start=0,
            tapped=bool(self.taps),
        )
        rows = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.cache = first if batch == 1 else first.select(rows)
        self.context_taps = taps if taps is None or batch == 1 else taps.expand(batch, -1, -1)
        self.context_cache = (
            DraftContextCache(batch, self.max_len) if self.draft is not None else None
        )

    # -- the passes -----------------------------------------------------------------------
    def target_pass(self, n: int, tapped: bool):
        """`(logits, tapped features)` of the `n` tokens a row after the context."""
        step = slice(self.context_len, self.context_len + n)
        kv_len = bucket(self.context_len + n, 16, self.max_len)
        rows = None
        if self.exact_rows and n > 1:  # as TargetRunner.row_kv_lens
            rows = row_kv_lengths(self.context_len, n, 16, self.max_len)
        return self.runner.forward(
            self.ids[:, step],
            self.pos[:, step],
            self.cache,
            kv_len,
            start=self.context_len,
            tapped=tapped,
            row_kv_lens=rows,
        )

    def ar_step(self) -> None:
        self.target_pass(1, False)[0].argmax(-1)

    def verify(self, n: int, write_context: bool = True) -> None:
        logits, feats = self.target_pass(n, bool(self.taps))
        logits.argmax(-1)
        if write_context and self.draft is not None:
            assert self.context_cache is not None  # made whenever there is a draft
            step = self.pos[:, self.context_len : self.context_len + n]
            kv = self.draft.context_kv(self.draft.encode_context(feats), step)
            self.context_cache.write(kv, step, start=self.context_len)

    def draft_round_fn(self, draft=None, steps: int | None = None):
        """A no-argument call of one `propose` round of `draft` (default: the bench's) over a
        context cache filled from the prefill's tapped features; `steps`: draft only that many
        tokens of the block (a round that verifies no more; None: the whole block)."""
        draft = self.draft if draft is None else draft
        if draft is None:
            raise ValueError("a draft round needs a draft")
        c, dev = self.context_len, self.device
        with torch.inference_mode():
            ctx = DraftContextCache(self.batch, self.max_len)
            kv = draft.context_kv(draft.encode_context(self.context_taps), self.pos[:, :c])
            ctx.write(kv, self.pos[:, :c], 0)
            n_ctx = bucket(c, 16, self.max_len)
            apos = torch.full((self.batch,), c, device=dev)
            valid = torch.arange(self.max_len, device=dev)[None, :n_ctx] < apos[:, None]
        anchor = self.ids[:, c]
        mask_id = int(draft.config.mask_token_id)
        vocab = DraftVocab.of(draft, dev)  # a reduced draft vocabulary, as the decoder runs it
        gamma = self.gamma or int(draft.config.block_size)

        def draft_round() -> None:
            propose(
                draft,
                anchor,
                apos,
                ctx.view(n_ctx),
                valid,
                gamma=gamma,
                mask_token_id=mask_id,
                vocab=vocab,
                steps=steps,
            )

        return draft_round

    # -- timed ----------------------------------------------------------------------------
    def time(self, fn, repeats: int, warmup: int = 1) -> float:
        with torch.inference_mode():
            return median_time(fn, repeats, self.device, warmup=warmup)

    def time_ar(self, repeats: int, warmup: int = 1) -> float:
        return self.time(self.ar_step, repeats, warmup)

    def time_verify(
        self, n: int, repeats: int, warmup: int = 1, write_context: bool = True
    ) -> float:
        return self.time(lambda: self.verify(n, write_context), repeats, warmup)

    def time_draft(
        self, repeats: int, draft=None, warmup: int = 1, steps: int | None = None
    ) -> float:
        return self.time(self.draft_round_fn(draft, steps), repeats, warmup)
