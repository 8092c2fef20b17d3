"""`GenerationOutput`: what both decoders return (the benchmark's input), and the record
they keep of a call while it runs (`start`, `commit`, `record_round`, `finish`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class GenerationOutput:
    """The result of `SpeculativeDecoder.generate` / `.generate_autoregressive`.

    Fields (one entry per request, in the order of the input prompts):
    - `sequences: list[list[int]]` the generated tokens, prompt excluded, EOS included when one
      was produced (it is then the last token); never longer than `max_new_tokens`.
    - `accept_lengths: list[list[int]]` per request, per verify round, how many drafted tokens
      were accepted (0..L; the bonus / correction token is NOT counted). Empty for the
      autoregressive baseline.
    - `verify_lengths: list[list[int]]` per request, per round, how many drafts L were sent to
      the target for verification (gamma without a confidence threshold).
    - `confidences: list[list[list[float]]]` per request, per round, the confidence c_k of each
      verified draft (length L) as the verify policy saw it (after the draft's STS temperatures
      when the decoder applies them); an empty list per round without a confidence head.
    - `num_rounds: list[int]` verify rounds per request (AR: decode steps after the prefill).
    - `new_tokens: list[int]` `len(sequences[i])`.
    - `wall_time_s: float` wall-clock time of the whole call (prefill included).
    - `prefill_s: float` the prefill's share of it; `finish_s: list[float]` per request, the
      time from the call's start until its last token was committed.
    - per round of the batch (monitoring; one entry per verify round / AR step):
      `round_draft_s` draft phase (block pass, Markov loop, verify-length policy),
      `round_verify_s` verify phase (target pass, acceptance, draft-context write, the host
      copy), `round_rows` live requests, `round_tokens` verify tokens the policy priced
      (sum over rows of 1 + L_r), `round_width` the padded verify width (1 + max L_r; the
      pass computes `round_rows * round_width` tokens), `round_committed` tokens the round
      committed (rows + drafts accepted). AR: draft 0, width 1.
      Phases are timed with `perf_counter` on the host; on CUDA the decoder synchronises at
      the draft/verify boundary only when `time_rounds` is on.

    The first generated token comes from the prefill pass (as in plain decoding), so
    `new_tokens[i] == 1 + sum(accept_lengths[i]) + num_rounds[i]`, up to a final round cut by
    EOS or `max_new_tokens`.

    Convenience: `tau` = mean tokens committed per verify round, bonus counted
    (`(sum accepted + rounds) / rounds` pooled over requests, the paper's acceptance length),
    `acceptance_by_position()` = for k = 1..gamma the fraction of rounds that verified >= k
    drafts in which draft k was accepted, `throughput` = new tokens per second.
    """

    sequences: list[list[int]]
    accept_lengths: list[list[int]] = field(default_factory=list)
    verify_lengths: list[list[int]] = field(default_factory=list)
    confidences: list[list[list[float]]] = field(default_factory=list)
    num_rounds: list[int] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    prefill_s: float = 0.0
    finish_s: list[float] = field(default_factory=list)
    round_draft_s: list[float] = field(default_factory=list)
    round_verify_s: list[float] = field(default_factory=list)
    round_rows: list[int] = field(default_factory=list)
    round_tokens: list[int] = field(default_factory=list)
    round_committed: list[int] = field(default_factory=list)
    round_width: list[int] = field(default_factory=list)
    # the call while it is recorded (`start`): token budget, stop ids, clock, finished requests
    _budget: int = field(default=0, init=False, repr=False, compare=False)
    _eos: frozenset[int] = field(default=frozenset(), init=False, repr=False, compare=False)
    _t0: float = field(default=0.0, init=False, repr=False, compare=False)
    _done: list[bool] = field(default_factory=list, init=False, repr=False, compare=False)

    @classmethod
    def empty(cls, batch: int) -> GenerationOutput:
        """An output with one empty record per request, filled round by round."""
        out = cls(
            sequences=[[] for _ in range(batch)],
            accept_lengths=[[] for _ in range(batch)],
            verify_lengths=[[] for _ in range(batch)],
            confidences=[[] for _ in range(batch)],
            num_rounds=[0] * batch,
        )
        out.finish_s = [0.0] * batch
        return out

    # ------------------------------------------------------------------ recording a call
    @classmethod
    def start(
        cls, batch: int, max_new_tokens: int, eos_token_id: int | Sequence[int] | None
    ) -> GenerationOutput:
        """The record of a call of `batch` requests starting now (the clock of `finish_s`)."""
        out = cls.empty(batch)
        out._t0 = time.perf_counter()
        out._budget = max_new_tokens
        if eos_token_id is not None:
            out._eos = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        out._done = [False] * batch
        return out

    def elapsed(self) -> float:
        """Seconds since the call started."""
        return time.perf_counter() - self._t0

    def room(self, request: int) -> int:
        """Tokens `request` may still commit."""
        return self._budget - len(self.sequences[request])

    def commit(self, requests: Sequence[int], tokens: Sequence[Sequence[int]]) -> list[bool]:
        """Append `tokens[i]` to the sequence of `requests[i]`, up to the budget and the first
        EOS, and stamp `finish_s` of the requests this finishes; returns, per request of the
        call, whether it has finished."""
        now = None
        for b, new in zip(requests, tokens):
            seq = self.sequences[b]
            for t in new:
                if len(seq) >= self._budget:
                    break
                seq.append(t)
                if t in self._eos:
                    self._done[b] = True
                    break
            self._done[b] = self._done[b] or len(seq) >= self._budget
            if self._done[b] and not self.finish_s[b]:
                now = now or self.elapsed()
                self.finish_s[b] = now
        return self._done

    def record_round(
        self,
        requests: Sequence[int],
        draft_s: float,
        verify_s: float,
        verified: Sequence[int] | None = None,
        accepted: Sequence[int] | None = None,
        confidences: Sequence[Sequence[float]] | None = None,
    ) -> None:
        """One round of the live `requests` (row i serves `requests[i]`): per request its
        drafts `verified` and `accepted` and the confidences of the verified ones (None: an AR
        step, which verifies nothing), and the round's phase times and verify shape."""
        for b in requests:
            self.num_rounds[b] += 1
        rows = len(requests)
        self.round_draft_s.append(draft_s)
        self.round_verify_s.append(verify_s)
        self.round_rows.append(rows)
        self.round_committed.append(rows + (sum(accepted) if accepted is not None else 0))
        if verified is None or accepted is None:
            self.round_tokens.append(rows)
            self.round_width.append(1)
            return
        self.round_tokens.append(rows + sum(verified))
        self.round_width.append(1 + max(verified))
        for i, b in enumerate(requests):
            self.accept_lengths[b].append(accepted[i])
            self.verify_lengths[b].append(verified[i])
            self.confidences[b].append(
                list(confidences[i][: verified[i]]) if confidences is not None else []
            )

    def finish(self) -> GenerationOutput:
        """Close the record: `new_tokens` and the call's wall time."""
        self.new_tokens = [len(s) for s in self.sequences]
        self.wall_time_s = self.elapsed()
        return self

    def timing_summary(self) -> dict:
        """Totals and per-round means of the draft / verify phases (seconds, tokens)."""
        n = len(self.round_verify_s)
        draft, verify = sum(self.round_draft_s), sum(self.round_verify_s)
        padded = sum(r * w for r, w in zip(self.round_rows, self.round_width))
        return {
            "rounds": n,
            "draft_s": draft,
            "verify_s": verify,
            "draft_ms_per_round": 1e3 * draft / n if n else None,
            "verify_ms_per_round": 1e3 * verify / n if n else None,
            "draft_over_verify": draft / verify if verify > 0 else None,
            "verify_tokens_per_round": sum(self.round_tokens) / n if n else None,
            "padded_tokens_per_round": padded / n if n else None,
            "other_s": max(0.0, self.wall_time_s - self.prefill_s - draft - verify),
        }

    @property
    def tau(self) -> float:
        """Mean tokens committed per round (accepted drafts + 1), pooled over requests."""
        rounds = sum(len(a) for a in self.accept_lengths)
        if rounds == 0:
            return float("nan")
        return (sum(sum(a) for a in self.accept_lengths) + rounds) / rounds

    @property
    def total_new_tokens(self) -> int:
        return sum(self.new_tokens)

    @property
    def throughput(self) -> float:
        """Generated tokens per second over the whole call."""
        return self.total_new_tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")

    def acceptance_by_position(self) -> list[float]:
        """P(draft k accepted | drafts 1..k-1 accepted and k verified), k = 1..max L."""
        max_l = max((max(v) for v in self.verify_lengths if v), default=0)
        hits = [0] * max_l
        tries = [0] * max_l
        for accs, vers in zip(self.accept_lengths, self.verify_lengths):
            for a, v in zip(accs, vers):
                for k in range(min(a + 1, v)):  # draft k+1 was tried when the first k passed
                    tries[k] += 1
                    hits[k] += int(k < a)
        return [h / t if t else float("nan") for h, t in zip(hits, tries)]
