"""`SpeculativeDecoder`: DSpark speculative decoding and the plain AR baseline.

One call (`generate`) is a prefill, then rounds (`_round`) until every request is done; a
round (see docs/method.md sections 1 and 3) is propose, verify, accept, advance, with the verify
policy (verify_policy.py: full / threshold / scheduler, deciding from the draft alone, so
decoding stays lossless) saying how far to draft and how many drafts each request verifies:
1. propose (`_propose`): one `block_hidden` pass for [anchor, mask x (gamma-1)] over the
   static context cache, then the serial Markov loop samples x_1..x_n and their q
   (draft_step.py; a reduced draft vocabulary, draft_vocab.py, samples over its K ids and
   proposes target ids); n is the policy's `draft_steps`, 0 on a round its draft gate skips
   (draft_gate.py: the round is then a plain AR step that still feeds the draft's context);
2. verify and accept (`_verify`): the policy's `lengths` per request, then one KV-cached target
   pass over [anchor, x_1..x_L] (target_step.py), lossless acceptance (verify.py), and the
   pass's tapped features written into the draft context cache at the same positions;
3. advance (`_commit`): the accepted drafts + 1 target token go to the output (output.py, which
   also records the round), each row's anchor position moves past them (which is all the
   "crop" a position-indexed static cache needs, cache.py), and finished requests leave.
Device shortcuts sit below the round: the CPU lm_head and T = 0 Markov pruning of
cpu_paths.py inside `propose` and `TargetRunner`, and row-exact batch-1 verify passes
(`TargetRunner.row_kv_lens`, row_attention.py).

The AR baseline (`generate_autoregressive`) shares the prefill, the target pass (same
forward, cache and masks as the verify pass, so it runs at HF `generate` speed and speed-ups
compare like with like) and the commit; its round is one 1-token step.

Batching: prompts are right-padded and every row owns its positions (slot = position), so
requests advance by their own acceptance lengths with no leakage. A request that finishes
(EOS / budget) leaves the batch (`LiveBatch`, live_batch.py) by swap-remove, so later rounds
cost only what the live requests need (both decoders do this, keeping the comparison fair);
plain decoding with `max_batch` refills the freed rows with waiting requests (regeneration).
Host syncs: one small device->host copy per round (accept counts and tokens, needed for
EOS / budget bookkeeping), plus one more when the policy reads the confidences (the verify
lengths). The verify pass runs the longest verify length (rows with shorter ones ignore the
extra drafts). A round pays when the tokens it commits outweigh its cost, a draft round plus
a verify pass over 1 + L tokens, against one 1-token step per token (eval/cost_model.py).
`DecoderOptions(compile=True)` wraps the target's layer loop in `torch.compile(dynamic=True)`
(checked on CPU with a tiny target: identical output; the first compile takes minutes, so it is
meant for GPUs).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from dspark.decoding.cache import DraftContextCache, TargetKVCache, bucket, right_padded
from dspark.decoding.draft_step import DraftProposal, propose
from dspark.decoding.draft_vocab import DraftVocab
from dspark.decoding.live_batch import LiveBatch
from dspark.decoding.options import DecoderOptions
from dspark.decoding.output import GenerationOutput
from dspark.decoding.target_step import TargetRunner
from dspark.decoding.verify import accept
from dspark.timing import sync

if TYPE_CHECKING:
    from dspark.modeling.protocols import DraftInference


class SpeculativeDecoder:
    """Decode `target` with a DSpark `draft` (any model with the contracts.md inference API) as
    `options` (`DecoderOptions`, options.py) say; `draft=None` allows only
    `generate_autoregressive`."""

    def __init__(
        self, target, draft: DraftInference | None = None, options: DecoderOptions | None = None
    ):
        self.options = options = options if options is not None else DecoderOptions()
        self.target, self.draft, self.policy = target, draft, options.policy
        self.device = next(target.parameters()).device
        self.policy.attach(target, draft, self.device)
        self.gamma = int(draft.config.block_size) if draft is not None else 0
        self.mask_token_id = int(draft.config.mask_token_id) if draft is not None else 0
        taps = list(draft.config.target_layer_ids) if draft is not None else []
        self.runner = TargetRunner(
            target, taps, cpu_fast_paths=options.cpu_fast_paths, exact_rows=options.exact_rows
        )
        # a reduced draft vocabulary's kept target ids (None: the draft scores all V)
        self.draft_vocab = DraftVocab.of(draft, self.device) if draft is not None else None
        self._target_cache: TargetKVCache | None = None
        self._ctx_cache: DraftContextCache | None = None
        if options.compile:
            self.runner.compile(dynamic=True)

    @property
    def exact_rows(self) -> bool:
        """Whether batch-1 verify passes run row-exact (`TargetRunner.exact_rows`)."""
        return self.runner.exact_rows

    # ----------------------------------------------------------------- speculative
    @torch.inference_mode()
    def generate(
        self,
        input_ids: list[list[int]],
        max_new_tokens: int,
        eos_token_id: int | list[int] | None = None,
        seed: int | None = None,
    ) -> GenerationOutput:
        if self.draft is None:
            raise ValueError("generate() needs a draft; use generate_autoregressive()")
        gen = self._generator(seed)
        out, batch = self._prefill(input_ids, max_new_tokens, eos_token_id, gen, tapped=True)
        while batch:
            self._round(out, batch, gen)
        return out.finish()

    def _round(self, out: GenerationOutput, batch: LiveBatch, gen) -> None:
        """Propose, verify, accept, advance; the policy says how far to draft and how many
        drafts each row verifies (0 drafted when its draft gate skips the round)."""
        batch.start_round()
        t_draft = time.perf_counter()
        # the most drafts a row may verify: one token of its budget goes to the target
        caps = self._caps([min(self.gamma, out.room(b) - 1) for b in batch.requests])
        prop = self._propose(batch, self.policy.draft_steps(caps), gen)
        verify_len, verified = self.policy.lengths(prop.confidence, prop.capped(caps))
        t_verify = self._clock()
        accepted, nxt, drafts = self._verify(batch, prop, verify_len, max(verified), gen)
        # the one host sync of the round: accept counts, next tokens, drafts
        host = torch.cat([accepted[:, None], nxt[:, None], drafts], dim=1).tolist()
        n_acc, conf = [h[0] for h in host], prop.host_confidence()
        t_end = time.perf_counter()  # after the host sync: the round's work is done
        self.policy.observe(conf, verified, n_acc, t_end - t_draft)
        draft_s = t_verify - t_draft if prop.drafted else 0.0
        verify_s = t_end - t_verify
        out.record_round(batch.requests, draft_s, verify_s, verified, n_acc, conf)
        self._commit(out, batch, [h[2 : 2 + h[0]] + [h[1]] for h in host], nxt)

    def _caps(self, caps: list[int]) -> list[int]:
        """The most drafts each live row may verify this round (the budget's bound, 0..gamma);
        a subclass may lower them (dspark/eval/capped_decoder.py)."""
        return caps

    def _propose(self, batch: LiveBatch, steps: int | None, gen) -> DraftProposal:
        """The draft's first `steps` tokens after each row's anchor (None: the whole block),
        over the context cache's slots before the anchor (draft_step.py)."""
        assert self.draft is not None and batch.ctx is not None and batch.anchors is not None
        ctx_len = bucket(max(batch.positions), self.options.bucket, batch.cache.max_len)
        slots = torch.arange(ctx_len, device=self.device)
        return propose(
            self.draft,
            batch.anchors,
            batch.anchor_pos,
            batch.ctx.view(ctx_len),
            slots[None, :] < batch.anchor_pos[:, None],
            gamma=self.gamma,
            mask_token_id=self.mask_token_id,
            temperature=self.options.sampling.temperature,
            top_k=self.options.sampling.top_k,
            top_p=self.options.sampling.top_p,
            generator=gen,
            confidence_temperatures=self.policy.confidence_temperatures,
            cpu_fast_paths=self.options.cpu_fast_paths,
            vocab=self.draft_vocab,
            steps=steps,
        )

    def _verify(self, batch: LiveBatch, prop: DraftProposal, verify_len, n_verify: int, gen):
        """One target pass over [anchor, x_1..x_L] (L = `n_verify`), acceptance, and the
        pass's tapped features into the draft's context cache: `(accepted, next, drafts)`."""
        assert self.draft is not None and batch.ctx is not None and batch.anchors is not None
        drafts = prop.tokens[:, :n_verify]
        ids = torch.cat([batch.anchors[:, None], drafts], dim=1)
        logits, taps, pos = self._target_pass(batch, ids, tapped=True)
        accepted, nxt = accept(
            drafts, logits, verify_len, self.options.sampling, prop.q, prop.vocab, generator=gen
        )
        batch.ctx.write(
            self.draft.context_kv(self.draft.encode_context(taps), pos), pos, batch.start
        )
        return accepted, nxt, drafts

    # ----------------------------------------------------------------- baseline
    @torch.inference_mode()
    def generate_autoregressive(
        self,
        input_ids: list[list[int]],
        max_new_tokens: int,
        eos_token_id: int | list[int] | None = None,
        seed: int | None = None,
        generators: list[torch.Generator] | None = None,
        max_batch: int | None = None,
    ) -> GenerationOutput:
        """Plain decoding, one token per target forward, same forward / cache / masks.

        `generators` (one per request, instead of `seed`): request b samples from
        `generators[b]` alone, so its tokens do not depend on its batch neighbours.
        `max_batch` (continuous batching): at most this many requests decode at once; a row
        that a finished request frees takes the next waiting one (in `input_ids` order) after a
        prefill of its own, so the batch stays full until nothing waits. Without it every
        request starts at once and the batch shrinks as they finish.
        """
        if generators is not None and len(generators) != len(input_ids):
            raise ValueError(
                f"{len(generators)} generators for {len(input_ids)} requests; pass one each"
            )
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        gen = list(generators) if generators is not None else self._generator(seed)
        slots = len(input_ids) if max_batch is None else min(max_batch, len(input_ids))
        out, batch = self._prefill(
            input_ids, max_new_tokens, eos_token_id, gen, tapped=False, slots=slots
        )
        waiting = list(range(slots, len(input_ids))) if batch is not None else []
        while batch or waiting:
            free = slots - len(batch)
            if waiting and free:  # admit the next requests into the rows after the live ones
                take, waiting = waiting[:free], waiting[free:]
                batch = self._admit(out, batch, take, input_ids, gen)
                continue  # some may have finished on their first token
            batch.start_round()
            t_step = time.perf_counter()
            assert batch.anchors is not None
            logits, _, _ = self._target_pass(batch, batch.anchors[:, None])
            tok = self.options.sampling.pick(logits[:, 0], batch.generator)
            host = tok.tolist()
            out.record_round(batch.requests, 0.0, time.perf_counter() - t_step)
            self._commit(out, batch, [[t] for t in host], tok)
        return out.finish()

    # ----------------------------------------------------------------- shared
    def _prefill(
        self,
        input_ids,
        max_new_tokens: int,
        eos_token_id,
        generator,
        tapped: bool,
        slots: int | None = None,
    ):
        """The call's output record and its live batch after the prompt pass of its first
        `slots` requests (default: all), which commits each one's first token (as plain
        decoding does); `tapped`: also fill the draft's context cache (all requests only). The
        caches hold `slots` rows as long as the longest prompt needs. No batch (None) when
        nothing is to be generated."""
        out = GenerationOutput.start(len(input_ids), max_new_tokens, eos_token_id)
        if max_new_tokens <= 0:
            return out, None
        if not input_ids or any(len(p) == 0 for p in input_ids):
            raise ValueError("every prompt needs at least one token")
        slots = len(input_ids) if slots is None else slots
        assert not tapped or slots == len(input_ids)
        longest = max(len(p) for p in input_ids)
        self._caches(slots, longest + max_new_tokens + self.gamma + 2, tapped)
        batch = self._admit(out, None, list(range(slots)), input_ids, generator, tapped)
        out.prefill_s = out.elapsed()
        return out, batch

    def _admit(self, out, batch: LiveBatch | None, requests, input_ids, generator, tapped=False):
        """Prefill `requests` (indices into `input_ids`) into the cache rows after `batch`'s
        live ones, commit their first tokens; returns the live batch holding both. A row
        attends only slots below its position, all rewritten by its own prompt and tokens, so
        what an earlier request left in the row is never read."""
        cache, ctx = self._target_cache, self._ctx_cache if tapped else None
        assert cache is not None
        live = len(batch) if batch is not None else 0
        ids, pos, lens = right_padded([input_ids[r] for r in requests], self.device)
        bsz, width = ids.shape
        rows = cache.rows(live, live + bsz)
        last = torch.tensor(lens, device=self.device) - 1
        kv_len = bucket(width, self.options.bucket, cache.max_len)
        logits, taps = self.runner.forward(
            ids, pos, rows, kv_len, start=0, tapped=tapped, logits_at=last
        )
        if tapped:  # generate(), which checked the draft; _caches made its context cache
            assert self.draft is not None and ctx is not None and live == 0
            ctx.write(self.draft.context_kv(self.draft.encode_context(taps), pos), pos, start=0)
        gen = [generator[r] for r in requests] if isinstance(generator, list) else generator
        first = self.options.sampling.pick(logits, gen)
        host = first.tolist()
        # each row's anchor so far is its prompt's last token: the first token goes one after
        anchor_pos = [n - 1 for n in lens]
        new = LiveBatch(list(requests), anchor_pos, rows, ctx, self.options.observer, None, gen)
        self._commit(out, new, [[t] for t in host], first)
        if batch is None:
            return new
        batch.extend(new, cache.rows(0, live + len(new)))
        return batch

    def _target_pass(self, batch: LiveBatch, ids: torch.Tensor, tapped: bool = False):
        """The target over `ids [R, n]` at each row's next n positions, KV-cached:
        `(logits [R, n, V], tapped features or None, positions [R, n])`."""
        n = ids.shape[1]
        pos = batch.anchor_pos[:, None] + torch.arange(n, device=self.device)
        cap, kv_bucket = batch.cache.max_len, self.options.bucket
        kv_len = bucket(max(batch.positions) + n, kv_bucket, cap)
        # None, or per query row the KV length a 1-token step there attends (row-exact)
        rows = self.runner.row_kv_lens(batch.positions, n, kv_bucket, cap)
        logits, taps = self.runner.forward(
            ids, pos, batch.cache, kv_len, start=batch.start, tapped=tapped, row_kv_lens=rows
        )
        return logits, taps, pos

    @staticmethod
    def _commit(out: GenerationOutput, batch: LiveBatch, committed, anchors) -> None:
        """Row i commits the tokens `committed[i]` (the output keeps them up to the budget and
        the first EOS) and waits with `anchors[i]`, the last of them, at the position after
        them; finished requests leave the batch."""
        done = out.commit(batch.requests, committed)
        batch.advance([len(c) for c in committed], anchors, done)

    def _caches(self, batch: int, max_len: int, with_ctx: bool):
        if max_len > self.options.max_length:
            raise ValueError(
                f"prompt + max_new_tokens + spare slots = {max_len} exceeds "
                f"max_length={self.options.max_length}; raise max_length"
            )
        if self._target_cache is None or not self._target_cache.fits(batch, max_len):
            size = min(self.options.max_length, bucket(max_len, 64, self.options.max_length))
            self._target_cache = TargetKVCache.for_model(self.target, batch, size)
            self._ctx_cache = None
        if with_ctx and (self._ctx_cache is None or not self._ctx_cache.fits(batch, max_len)):
            self._ctx_cache = DraftContextCache(batch, self._target_cache.max_len)
        return self._target_cache, self._ctx_cache

    def _clock(self) -> float:
        """Now, after the device's queued work when rounds are timed."""
        if self.options.time_rounds:
            sync(self.device)
        return time.perf_counter()

    def _generator(self, seed: int | None):
        if seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(seed)
