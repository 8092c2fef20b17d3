"""`SpeculativeDecoder`: DSpark speculative decoding and the plain AR baseline, one code path.

Per round (see docs/method.md sections 1 and 3):
1. draft: one `block_hidden` pass for [anchor, mask x (gamma-1)] over the static context
   cache, then the serial Markov loop samples x_1..x_gamma and their q (draft_step.py); a
   reduced draft vocabulary (draft_vocab.py) samples over its K ids and proposes target ids;
2. optional confidence threshold picks how many drafts each request verifies;
3. target: one KV-cached pass over [anchor, x_1..x_L] (target_step.py), lossless acceptance
   (verify.py);
4. commit accepted + 1 tokens, advance the per-row anchor position (which is all the
   "crop" a position-indexed static cache needs, cache.py) and write the verify pass's tapped
   features into the draft context cache at the same positions.

Batching: prompts are right-padded and every row owns its positions (slot = position), so
requests advance by their own acceptance lengths with no leakage. A request that finishes
(EOS / budget) leaves the batch (`LiveBatch`, live_batch.py) by swap-remove: the last live row
moves into its slot (only that row's committed cache slots are copied), so later rounds cost only
what the live requests need (both decoders do this, keeping the comparison fair).
Host syncs: one small device->host copy per round (accept counts and tokens, needed for
EOS / budget bookkeeping), plus one more with a confidence threshold (the verify length).
Verify policies (`verify_policy`), each decided from the draft alone, never from the target,
so decoding stays lossless:
- `full`: every request verifies min(gamma, remaining budget - 1) drafts;
- `threshold`: the longest prefix whose survival prod c_i >= `confidence_threshold` (>= 1);
- `scheduler`: the prefix scheduler (paper Algorithm 1, scheduler.py) over the survivals and
  the device's SPS(B) profile (sps.py; measured at start-up and cached when not given).
  `scheduler_batch="padded"` (default) prices what this decoder runs, one padded
  `[R, 1 + L]` pass, and admits whole depths; `"ragged"` is the published per-slot algorithm
  with B = sum(1 + l_r): rows then verify their own l_r inside a pass padded to max l_r, so
  the pass computes `R * (1 + max l_r)` tokens while the scheduler priced B (both recorded
  per round in `round_tokens` / `round_width`). Rows never verify the padding's free drafts
  under `ragged`: whether another row reaches depth j can depend on this row's a_{j+1},
  i.e. on its x_j, which would make the choice anticipating (scheduler.py). Under the
  scheduler, a `DraftGate` (draft_gate.py) also skips the draft on rounds where drafting does
  not pay at the current load (plain AR steps that still feed the draft's context).
The draft's STS temperatures (`confidence_temperatures` in its config) calibrate c_k first.
The verify pass runs the longest verify length (rows with shorter ones ignore the extra
drafts).
`compile=True` wraps the target's layer loop in `torch.compile(dynamic=True)` (checked on
CPU with a tiny target: identical output; the first compile takes minutes, so it is meant for
GPUs). The AR baseline runs the same target forward, cache and masks as the verify pass, so
it runs at HF `generate` speed and speed-ups compare like with like. A round pays when the
tokens it commits outweigh its cost, a draft round plus a verify pass over 1 + L tokens,
against one 1-token step per token (eval/cost_model.py measures both on a device).
"""

from __future__ import annotations

import time
from itertools import accumulate
from operator import mul
from typing import TYPE_CHECKING

import torch

from dspark.decoding.cache import DraftContextCache, TargetKVCache, bucket
from dspark.decoding.draft_gate import (
    MAX_PROBE_INTERVAL,
    PROBE_BUDGET,
    PROBE_INTERVAL,
    DraftGate,
)
from dspark.decoding.draft_step import DraftProposal, propose, verify_lengths
from dspark.decoding.draft_vocab import DraftVocab
from dspark.decoding.live_batch import LiveBatch
from dspark.decoding.observer import DecodeObserver
from dspark.decoding.output import GenerationOutput
from dspark.decoding.sampling import sample, sample_per_row, warp
from dspark.decoding.scheduler import SCHEDULERS
from dspark.decoding.target_step import TargetRunner
from dspark.decoding.verify import verify_greedy, verify_sampled

if TYPE_CHECKING:
    from dspark.modeling.protocols import DraftInference


class SpeculativeDecoder:
    """Decode `target` with a DSpark `draft` (any model with the contracts.md inference API).

    `temperature=0` is greedy (output == plain greedy decoding token for token); otherwise
    the output is distributed exactly as the target's warped distribution (temperature,
    `top_k` > 0, `top_p` < 1). `verify_policy`: `full | threshold | scheduler` (module
    docstring); None picks `threshold` when `confidence_threshold` is set, else `full`.
    `confidence_threshold` verifies, per request, the longest draft prefix whose survival
    prod c_i >= threshold (at least one draft). `sps`: the scheduler's `SPSProfile` (None:
    the cached profile of this device, target and dtype, measured on first use).
    `calibrate`: apply the draft config's `confidence_temperatures` (STS) to c_k.
    `time_rounds`: record per-round draft / verify times (a CUDA sync at the boundary).
    `skip_unprofitable_drafts` (scheduler only, needs draft times in the profile): the
    `DraftGate` (draft_gate.py) skips the draft on rounds where it does not pay at this load:
    AR steps that verify nothing but still feed the draft's context, with probes every
    `draft_probe_interval` rounds, doubling up to `max_draft_probe_interval`, and never more
    often than keeps probes under `draft_probe_budget` of the AR time (0: no floor). Its
    history (a survival prior, realized rates, the back-off) persists across `generate`
    calls; `draft_gate.reset()` forgets it.
    `max_length` bounds prompt + new tokens (+ gamma spare slots) and so the caches.
    `draft=None` allows only `generate_autoregressive`.
    `observer`: a `DecodeObserver` told which request each live row serves every round and
    handed each finished request's caches (tests; the decoder itself keeps neither).
    `cpu_fast_paths` (default on): the CPU-only lm_head and T = 0 Markov-pruning shortcuts of
    cpu_paths.py; off runs the plain path everywhere (same greedy tokens).
    """

    def __init__(
        self,
        target,
        draft: DraftInference | None = None,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        confidence_threshold: float | None = None,
        max_length: int = 2048,
        compile: bool = False,
        kv_bucket: int | None = None,
        verify_policy: str | None = None,
        sps=None,
        scheduler_batch: str = "padded",
        calibrate: bool = True,
        time_rounds: bool = True,
        skip_unprofitable_drafts: bool = True,
        draft_probe_interval: int = PROBE_INTERVAL,
        max_draft_probe_interval: int = MAX_PROBE_INTERVAL,
        draft_probe_budget: float = PROBE_BUDGET,
        observer: DecodeObserver | None = None,
        cpu_fast_paths: bool = True,
    ):
        self.target, self.draft = target, draft
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.confidence_threshold = confidence_threshold
        if verify_policy is None:  # a threshold without a confidence head verifies the block
            has_conf = getattr(draft, "confidence_head", None) is not None
            verify_policy = "threshold" if confidence_threshold is not None and has_conf else "full"
        self.verify_policy = verify_policy
        self.scheduler_batch = scheduler_batch
        self.time_rounds = time_rounds
        self._check_policy(draft)
        self.max_length = max_length
        self.kv_bucket = kv_bucket or (128 if compile else 16)
        taps = list(draft.config.target_layer_ids) if draft is not None else []
        self.gamma = int(draft.config.block_size) if draft is not None else 0
        self.mask_token_id = int(draft.config.mask_token_id) if draft is not None else 0
        self.cpu_fast_paths = cpu_fast_paths
        self.runner = TargetRunner(target, taps, cpu_fast_paths=cpu_fast_paths)
        self.device = next(target.parameters()).device
        # a reduced draft vocabulary's kept target ids (None: the draft scores all V)
        self.draft_vocab = DraftVocab.of(draft, self.device) if draft is not None else None
        temps = getattr(draft.config, "confidence_temperatures", None) if draft else None
        self.confidence_temperatures = (
            torch.tensor(temps, dtype=torch.float32, device=self.device)
            if calibrate and temps
            else None
        )
        self.sps = sps
        if verify_policy == "scheduler" and sps is None:
            from dspark.decoding.sps import load_or_measure

            self.sps = load_or_measure(target, draft, gamma=self.gamma)
        self.draft_gate: DraftGate | None = None  # None: draft every round
        if verify_policy == "scheduler" and skip_unprofitable_drafts:
            self.draft_gate = DraftGate.for_profile(
                self.sps,
                self.gamma,
                ragged=scheduler_batch == "ragged",
                interval=draft_probe_interval,
                max_interval=max_draft_probe_interval,
                probe_budget=draft_probe_budget,
            )
        self._target_cache: TargetKVCache | None = None
        self._ctx_cache: DraftContextCache | None = None
        self.observer = observer
        if compile:
            self.runner.compile(dynamic=True)

    # ----------------------------------------------------------------- helpers
    def _check_policy(self, draft) -> None:
        policies = ("full", "threshold", "scheduler")
        if self.verify_policy not in policies:
            raise ValueError(f"verify_policy={self.verify_policy!r}; use one of {policies}")
        if self.scheduler_batch not in SCHEDULERS:
            raise ValueError(
                f"scheduler_batch={self.scheduler_batch!r}; use one of {tuple(SCHEDULERS)}"
            )
        if self.verify_policy == "threshold" and self.confidence_threshold is None:
            raise ValueError("verify_policy='threshold' needs confidence_threshold=<0..1>")
        needs_conf = self.verify_policy in ("threshold", "scheduler")
        if needs_conf and draft is not None and getattr(draft, "confidence_head", None) is None:
            raise ValueError(
                f"verify_policy={self.verify_policy!r} ranks drafts by confidence but this "
                "draft has no confidence head; use verify_policy='full'"
            )

    def _verify_lengths(self, prop, cap: list[int], live: int) -> tuple[torch.Tensor, list[int]]:
        """Drafts each live row verifies (device tensor and host list): one host sync."""
        dev = self.device
        cap_t = torch.tensor(cap, device=dev)
        if self.verify_policy == "threshold" and prop.confidence is not None:
            vlen = verify_lengths(prop.confidence, self.confidence_threshold, self.gamma, live, dev)
            vlen = torch.minimum(vlen, cap_t)
        elif self.verify_policy == "scheduler" and prop.confidence is not None:
            table = self.sps.table(live, self.gamma, dev)
            survival = prop.confidence.cumprod(dim=1)
            vlen = SCHEDULERS[self.scheduler_batch](survival, table, cap_t)
        else:
            return cap_t, list(cap)
        return vlen, vlen.tolist()

    def _sync(self) -> None:
        if self.time_rounds and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def _pick(self, logits: torch.Tensor, generator) -> torch.Tensor:
        """Greedy, or one warped sample per row; `generator` may be one generator for the
        batch or a list with one per row (`sample_per_row`)."""
        if self.greedy:
            return logits.argmax(-1)
        probs = warp(logits, self.temperature, self.top_k, self.top_p)
        if isinstance(generator, list):
            return sample_per_row(probs, generator)
        return sample(probs, generator)

    def _caches(self, batch: int, max_len: int, with_ctx: bool):
        if max_len > self.max_length:
            raise ValueError(
                f"prompt + max_new_tokens + spare slots = {max_len} exceeds "
                f"max_length={self.max_length}; raise max_length"
            )
        if self._target_cache is None or not self._target_cache.fits(batch, max_len):
            size = min(self.max_length, bucket(max_len, 64, self.max_length))
            self._target_cache = TargetKVCache.for_model(self.target, batch, size)
            self._ctx_cache = None
        if with_ctx and (self._ctx_cache is None or not self._ctx_cache.fits(batch, max_len)):
            self._ctx_cache = DraftContextCache(batch, self._target_cache.max_len)
        return self._target_cache, self._ctx_cache

    def _prefill(self, input_ids: list[list[int]], max_new_tokens: int, tapped: bool, generator):
        if not input_ids or any(len(p) == 0 for p in input_ids):
            raise ValueError("every prompt needs at least one token")
        bsz, lens = len(input_ids), [len(p) for p in input_ids]
        width = max(lens)
        ids = torch.zeros((bsz, width), dtype=torch.long)
        for b, p in enumerate(input_ids):
            ids[b, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(self.device)
        pos = torch.arange(width, device=self.device)[None].expand(bsz, width)
        cache, ctx = self._caches(bsz, width + max_new_tokens + self.gamma + 2, tapped)
        last = torch.tensor(lens, device=self.device) - 1
        logits, taps = self.runner.forward(
            ids,
            pos,
            cache,
            bucket(width, self.kv_bucket, cache.max_len),
            start=0,
            tapped=tapped,
            logits_at=last,
        )
        if tapped:  # generate(), which checked the draft; _caches made its context cache
            assert self.draft is not None and ctx is not None
            kv = self.draft.context_kv(self.draft.encode_context(taps), pos)
            ctx.write(kv, pos, start=0)
        return self._pick(logits, generator), lens, cache, ctx

    @staticmethod
    def _eos_set(eos_token_id) -> set[int]:
        if eos_token_id is None:
            return set()
        if isinstance(eos_token_id, int):
            return {eos_token_id}
        return set(eos_token_id)

    @staticmethod
    def _append(seq: list[int], new: list[int], budget: int, eos: set[int]) -> bool:
        """Append `new` to `seq` up to the budget / first EOS; True when `seq` is finished."""
        for t in new:
            if len(seq) >= budget:
                return True
            seq.append(t)
            if t in eos:
                return True
        return len(seq) >= budget

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
        t0 = time.perf_counter()
        bsz = len(input_ids)
        out = GenerationOutput.empty(bsz)
        if max_new_tokens <= 0:
            return self._finish(out, t0)
        eos = self._eos_set(eos_token_id)
        gen = self._generator(seed)
        gamma, dev = self.gamma, self.device
        first, lens, cache, ctx = self._prefill(input_ids, max_new_tokens, True, gen)
        first_host = first.tolist()
        out.prefill_s = time.perf_counter() - t0
        done = [
            self._append(out.sequences[b], [first_host[b]], max_new_tokens, eos) for b in range(bsz)
        ]
        self._stamp(out, range(bsz), done, t0)
        batch = LiveBatch(list(range(bsz)), list(lens), cache, ctx, self.observer)
        keep = batch.retire(done)
        anchor = first[keep] if keep is not None else first
        steps = torch.arange(gamma + 1, device=dev)
        slots = torch.arange(cache.max_len, device=dev)
        gate = self.draft_gate
        while batch:
            batch.start_round()
            rows, apos_host, cache, ctx = batch.requests, batch.positions, batch.cache, batch.ctx
            assert ctx is not None  # the prefill made it (tapped=True)
            live = len(rows)
            t_round = time.perf_counter()
            apos = torch.tensor(apos_host, device=dev)
            ctx_len = bucket(max(apos_host), self.kv_bucket, cache.max_len)
            ctx_valid = slots[None, :ctx_len] < apos[:, None]
            cap = [min(gamma, max_new_tokens - len(out.sequences[b]) - 1) for b in rows]
            if gate is not None and not gate.should_draft(live, max(cap)):  # it would not pay
                prop = DraftProposal(anchor.new_zeros((live, 0)), None, None)
                vlen_host = [0] * live
                vlen = torch.zeros(live, dtype=torch.long, device=dev)
            else:
                prop = propose(
                    self.draft,
                    anchor,
                    apos,
                    ctx.view(ctx_len),
                    ctx_valid,
                    gamma=gamma,
                    mask_token_id=self.mask_token_id,
                    temperature=self.temperature,
                    top_k=self.top_k,
                    top_p=self.top_p,
                    generator=gen,
                    confidence_temperatures=self.confidence_temperatures,
                    cpu_fast_paths=self.cpu_fast_paths,
                    vocab=self.draft_vocab,
                )
                # drafts to verify: the policy (draft-only, so lossless) and the budget
                vlen, vlen_host = self._verify_lengths(prop, cap, live)
            self._sync()
            t_verify = time.perf_counter()
            n_ver = max(vlen_host)
            drafts = prop.tokens[:, :n_ver]
            ids = torch.cat([anchor[:, None], drafts], dim=1)
            pos = apos[:, None] + steps[: n_ver + 1]
            start = apos_host[0] if len(set(apos_host)) == 1 else None
            kv_len = bucket(max(apos_host) + n_ver + 1, self.kv_bucket, cache.max_len)
            logits, taps = self.runner.forward(ids, pos, cache, kv_len, start=start, tapped=True)
            if self.greedy:
                n_acc, nxt = verify_greedy(drafts, logits.argmax(-1), vlen)
            else:
                p = warp(logits, self.temperature, self.top_k, self.top_p)
                q = prop.q[:, :n_ver] if prop.q is not None else p[:, :0]
                n_acc, nxt = verify_sampled(drafts, q, p, vlen, gen, q_vocab=prop.vocab)
            ctx.write(self.draft.context_kv(self.draft.encode_context(taps), pos), pos, start)
            # the one host sync of the round: accept counts, next tokens, drafts
            host = torch.cat([n_acc[:, None], nxt[:, None], drafts], dim=1).tolist()
            conf = prop.confidence.tolist() if prop.confidence is not None else None  # [R][gamma]
            t_end = time.perf_counter()
            draft_s = t_verify - t_round if prop.tokens.shape[1] else 0.0  # 0: skipped
            out.record_round(draft_s, t_end - t_verify, live, live + sum(vlen_host), n_ver + 1)
            if gate is not None and conf is not None:
                surv = [list(accumulate(c, mul)) for c in conf]
                gate.observe(surv, vlen_host, [h[0] for h in host])
            for i, b in enumerate(rows):
                a, t = host[i][0], host[i][1]
                out.accept_lengths[b].append(a)
                out.verify_lengths[b].append(vlen_host[i])
                out.confidences[b].append(conf[i][: vlen_host[i]] if conf is not None else [])
                done[b] = self._append(
                    out.sequences[b], host[i][2 : 2 + a] + [t], max_new_tokens, eos
                )
                apos_host[i] += a + 1
            self._stamp(out, rows, done, t0)
            keep = batch.retire(done)
            anchor = nxt[keep] if keep is not None else nxt
        return self._finish(out, t0)

    # ----------------------------------------------------------------- baseline
    @torch.inference_mode()
    def generate_autoregressive(
        self,
        input_ids: list[list[int]],
        max_new_tokens: int,
        eos_token_id: int | list[int] | None = None,
        seed: int | None = None,
        generators: list[torch.Generator] | None = None,
    ) -> GenerationOutput:
        """Plain decoding, one token per target forward, same forward / cache / masks.

        `generators` (one per request, instead of `seed`): request b samples from
        `generators[b]` alone, so its tokens do not depend on its batch neighbours.
        """
        t0 = time.perf_counter()
        bsz = len(input_ids)
        out = GenerationOutput.empty(bsz)
        if max_new_tokens <= 0:
            return self._finish(out, t0)
        eos = self._eos_set(eos_token_id)
        if generators is not None and len(generators) != bsz:
            raise ValueError(f"{len(generators)} generators for {bsz} requests; pass one each")
        gen = list(generators) if generators is not None else self._generator(seed)
        tok, lens, cache, _ = self._prefill(input_ids, max_new_tokens, False, gen)
        host = tok.tolist()
        out.prefill_s = time.perf_counter() - t0
        done = [self._append(out.sequences[b], [host[b]], max_new_tokens, eos) for b in range(bsz)]
        self._stamp(out, range(bsz), done, t0)
        batch = LiveBatch(list(range(bsz)), list(lens), cache, None, self.observer)
        rounds = [0] * bsz
        while True:
            keep = batch.retire(done)
            if keep is not None:
                tok = tok[keep]
                if isinstance(gen, list):
                    gen = [gen[i] for i in keep]
            if not batch:
                break
            batch.start_round()
            rows, apos_host, cache = batch.requests, batch.positions, batch.cache
            t_step = time.perf_counter()
            pos = torch.tensor(apos_host, device=self.device)[:, None]
            start = apos_host[0] if len(set(apos_host)) == 1 else None
            kv_len = bucket(max(apos_host) + 1, self.kv_bucket, cache.max_len)
            logits, _ = self.runner.forward(tok[:, None], pos, cache, kv_len, start=start)
            tok = self._pick(logits[:, 0], gen)
            host = tok.tolist()
            out.record_round(0.0, time.perf_counter() - t_step, len(rows), len(rows), 1)
            for i, b in enumerate(rows):
                rounds[b] += 1
                done[b] = self._append(out.sequences[b], [host[i]], max_new_tokens, eos)
                apos_host[i] += 1
            self._stamp(out, rows, done, t0)
        out.num_rounds = rounds
        return self._finish(out, t0, keep_rounds=True)

    # ----------------------------------------------------------------- common
    @staticmethod
    def _stamp(out: GenerationOutput, rows, done: list[bool], t0: float) -> None:
        """Set `finish_s` of the requests among `rows` that have just finished."""
        now = None
        for b in rows:
            if done[b] and not out.finish_s[b]:
                now = now or time.perf_counter() - t0
                out.finish_s[b] = now

    def _generator(self, seed: int | None):
        if seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(seed)

    @staticmethod
    def _finish(out: GenerationOutput, t0: float, keep_rounds: bool = False) -> GenerationOutput:
        out.new_tokens = [len(s) for s in out.sequences]
        if not keep_rounds:
            out.num_rounds = [len(a) for a in out.accept_lengths]
        out.wall_time_s = time.perf_counter() - t0
        return out
