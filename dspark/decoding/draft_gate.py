"""Whether to run the draft at all this round: the scheduler's draft gate (pure host math).

At high load a verify pass is compute-bound, so every verified draft costs nearly a full token
of target work, and the draft's own round (its lm_head over the draft vocabulary for R x gamma
slots: V rows, or K for a reduced one) costs about one AR step at R = 64 on a CPU with the full
vocabulary. The scheduler then verifies zero drafts everywhere and the draft round is pure
loss. The round's price is the profile's `draft_time(R)`, measured with the draft as it is
(so with its K rows; sps.py keeps a reduced draft's profile apart) or a `Roofline` sized by
`sps.draft_weight_bytes`. The gate decides before each round whether to draft:

- It keeps an exponential average of the survival curve of drafted rounds (mean over
  requests; the prior) and corrects it by what verification realized: per depth, drafts
  accepted over survival predicted on the slots verified so far (the STS fit comes from other
  prompts). The correction is for pricing only; the scheduler keeps the draft's own survivals.
- Pricing at `live` requests: expected committed tokens per second with the draft (a round's
  survivals, or the prior for every request; the verify lengths the scheduler would pick, draft + verify time from the
  SPS profile) against `live` tokens per plain AR step. Budgets are left out: a request near
  its end caps what any draft can add, which says nothing about the load (a round where every
  request has only its bonus token left does not draft at all).
- What drafting realized vetoes what the profile promises: per load band, the tokens that
  drafted rounds committed against the tokens AR steps would have committed in the same wall
  time (AR steps priced by the profile, scaled by the measured/priced time of the AR rounds
  this decoder ran, at the nearest band that ran any). Where that realized gain is below 1
  (over a few drafted rounds' worth) the band backs off whatever the survivals say: the
  profile is measured at one short context, and the survivals of marginal rounds, even
  corrected per depth, overstate them where drafting nearly breaks even (load 16 on a CPU,
  where shallow rounds priced to pay commit fewer tokens than AR steps would). The round
  times come from earlier rounds only, like every other input of the gate.
- After each drafted round it prices that round's own (corrected) survivals: acceptance is
  autocorrelated (an easy stretch of text stays easy for a while), so the round just seen
  predicts the next better than the average does. Whenever the load changes band (a call
  starts, requests finish or join; bands are powers of two) it prices the prior at the new
  load. Where the price pays, the next round drafts (a back-off in progress ends); where it
  does not, a back-off starts: the next `skip` rounds are AR steps (no draft), then one probe
  round drafts again and its survivals replace the prior (the requests now live may differ
  from those the average was made of). Each failed probe doubles `skip` (up to
  `max_interval`); a round that pays resets it to `interval`. `skip` is kept per load
  (power-of-two bands of live requests: that drafting pays at load 1 says nothing about load
  64); a load seen for the first time starts from the longest back-off of the lower loads;
  and it is never shorter than keeps probes under `probe_budget` of the AR time (a probe
  costs a draft round, ~1 AR step at 64 requests on a CPU).
- Its state outlives a `generate` call, as a server's decoder learns its traffic; `reset()`
  forgets it.

Losslessness: whether a round drafts is decided before it from earlier rounds only (their
survivals, acceptance counts and wall times), never from the target's outputs of the round
being decided, so the committed tokens keep the target's distribution; within a round the
scheduler decides the verified prefix from the draft alone, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from dspark.decoding.scheduler import SCHEDULERS
from dspark.decoding.sps import SPSProfile


def expected_tokens_per_s(
    survival: Sequence[Sequence[float]],
    lengths: Sequence[int],
    profile: SPSProfile,
    ragged: bool = False,
) -> tuple[float, float]:
    """`(with the draft, plain AR)` expected committed tokens per second for one round.

    survival `[R][gamma]` (a_{r,j} = prod_{i<=j} c_{r,i}), lengths `[R]` drafts verified per
    request. With the draft: tau = sum_r (1 + sum_{j<=l_r} a_{r,j}) over draft time(R) + verify
    time(R, width), width = 1 + max l (padded pass) or (R + sum l) / R (ragged); AR: R tokens
    per verify time(R, 1).
    """
    live = len(lengths)
    tau = float(live) + sum(sum(a[:n]) for a, n in zip(survival, lengths))
    width = (live + sum(lengths)) / live if ragged else 1 + max(lengths)
    t_spec = profile.draft_time(live) + profile.step_time(live, width)
    return tau / t_spec, live / profile.step_time(live, 1)


# The gate's defaults, in one place (VerifyPolicy's keyword defaults read these).
PROBE_INTERVAL = 4
MAX_PROBE_INTERVAL = 64
PROBE_BUDGET = 0.05
GAIN_DECAY = 0.9  # realized gain and AR round times: about the last 10 rounds per load band
MIN_GAIN_ROUNDS = 2.5  # decayed count of drafted rounds before a veto: 3 in a row (2.71)
# the measured/priced time of AR rounds stays within [1 / bound, bound]: it corrects a profile
# of this machine at other context lengths; a larger error means the profile is not of this
# machine (re-measure it), and one descheduled round must not swing the verdict
AR_SCALE_BOUND = 2.0


class DraftGate:
    """Back-off state plus a survival prior; `should_draft(live, max_cap)` before a round,
    `observe(survival, verified, accepted)` after a drafted one (module docstring)."""

    def __init__(
        self,
        profile: SPSProfile,
        gamma: int,
        *,
        ragged: bool = False,
        interval: int = PROBE_INTERVAL,
        max_interval: int = MAX_PROBE_INTERVAL,
        prior_weight: float = 0.2,
        realized_decay: float = 0.95,
        probe_budget: float = PROBE_BUDGET,
        gain_decay: float = GAIN_DECAY,
    ):
        if interval < 1:
            raise ValueError(f"draft_probe_interval={interval}; use >= 1")
        self.profile, self.gamma, self.ragged = profile, int(gamma), ragged
        self.interval = int(interval)
        self.max_interval = max(int(max_interval), self.interval)
        self.prior_weight = float(prior_weight)
        self.realized_decay = float(realized_decay)
        self.probe_budget = float(probe_budget)
        self.gain_decay = float(gain_decay)
        schedule = SCHEDULERS["ragged" if ragged else "padded"]
        self._schedule: Callable[..., torch.Tensor] = schedule
        self.reset()

    @classmethod
    def for_profile(
        cls, profile: SPSProfile, gamma: int, *, ragged: bool = False, **options
    ) -> DraftGate | None:
        """A gate for this profile, or None when it has no draft times (a draft round could not
        be priced, so the scheduler drafts every round)."""
        if not profile.draft_times:
            return None
        return cls(profile, gamma, ragged=ragged, **options)

    def reset(self) -> None:
        """Forget the back-off and the survival prior (a fresh decoder's state)."""
        self.skip_left = 0  # AR rounds left before the next probe
        self.skip_next: dict[int, int] = {}  # load band -> back-off after its next failure
        self.prior: list[float] | None = None  # EMA of the mean survival curve [gamma]
        self.load: int | None = None  # live requests of the last round priced
        self.probe_next = self.probing = False  # a probe's survivals replace the prior
        # decayed sums over verified slots per depth: survival predicted, drafts accepted
        self.predicted_sum = [0.0] * self.gamma
        self.realized_sum = [0.0] * self.gamma
        # load band -> decayed sums over its AR rounds: [measured s, profile-priced s]
        self.ar_time: dict[int, list[float]] = {}
        # load band -> decayed sums over its drafted rounds: [tokens committed, tokens AR steps
        # would have committed in the same time, rounds]
        self.drafted_sums: dict[int, list[float]] = {}

    # ------------------------------------------------------------------ decisions
    def lengths(self, survival: Sequence[Sequence[float]], caps: Sequence[int]) -> list[int]:
        """What the scheduler verifies for these survivals at this load (host lists)."""
        rows = len(survival)
        table = self.profile.table(rows, self.gamma)
        surv = torch.tensor(survival, dtype=torch.float32).reshape(rows, self.gamma)
        return self._schedule(surv, table, torch.tensor(list(caps))).tolist()

    def pays(self, survival: Sequence[Sequence[float]], lengths: Sequence[int]) -> bool:
        with_draft, ar = expected_tokens_per_s(survival, lengths, self.profile, self.ragged)
        return with_draft >= ar

    def ar_scale(self, live: int) -> float:
        """Measured over priced time of the AR rounds at this load band, or at the nearest
        band that ran any (a band where drafting always paid runs none), else 1.0; within
        [1 / AR_SCALE_BOUND, AR_SCALE_BOUND]."""
        band = self.load_band(live)
        seen = [b for b, v in self.ar_time.items() if v[1] > 0]
        if not seen:
            return 1.0
        near = min(seen, key=lambda b: (abs(b.bit_length() - band.bit_length()), b))
        measured, priced = self.ar_time[near]
        return min(max(measured / priced, 1.0 / AR_SCALE_BOUND), AR_SCALE_BOUND)

    def realized_gain(self, live: int) -> float | None:
        """Tokens the drafted rounds at this load band committed over the tokens AR steps
        would have committed in their wall time (decayed sums); None before MIN_GAIN_ROUNDS
        drafted rounds' worth."""
        sums = self.drafted_sums.get(self.load_band(live))
        if not sums or sums[2] < MIN_GAIN_ROUNDS or sums[1] <= 0:
            return None
        return sums[0] / sums[1]

    def realized_loss(self, live: int) -> bool:
        gain = self.realized_gain(live)
        return gain is not None and gain < 1.0

    def observe_round(
        self, verified: Sequence[int], accepted: Sequence[int], drafted: bool, seconds: float
    ) -> None:
        """After every round (`verified [R]` / `accepted [R]` drafts per request, all 0 on a
        round the gate skipped) with its wall time: an AR round's time against its price, or
        what a drafted round committed against what AR steps would have in that time. Call it
        before `observe`, which decides on the round just seen."""
        live = len(verified)
        if live == 0 or seconds <= 0:
            return
        band, d = self.load_band(live), self.gain_decay
        step = self.profile.step_time(live, 1)
        if not drafted:
            t = self.ar_time.setdefault(band, [0.0, 0.0])
            t[0], t[1] = d * t[0] + seconds, d * t[1] + step
            return
        ar_tokens = live * seconds / (self.ar_scale(live) * step)
        g = self.drafted_sums.setdefault(band, [0.0, 0.0, 0.0])
        g[0] = d * g[0] + live + sum(accepted)
        g[1] = d * g[1] + ar_tokens
        g[2] = d * g[2] + 1.0

    def realism(self) -> list[float]:
        """Per depth j: accepted drafts / predicted survival over the verified slots so far
        (decayed sums); 1.0 where fewer than one slot's worth of survival was verified."""
        return [r / p if p >= 1.0 else 1.0 for r, p in zip(self.realized_sum, self.predicted_sum)]

    def corrected(self, survival: Sequence[Sequence[float]]) -> list[list[float]]:
        """Survivals scaled by `realism()`, capped at 1 and kept non-increasing in depth: what
        the gate prices with (the scheduler itself sees the draft's own survivals)."""
        k = self.realism()
        out = []
        for a in survival:
            row, last = [], 1.0
            for j in range(self.gamma):
                last = min(last, a[j] * k[j])
                row.append(last)
            out.append(row)
        return out

    def priced(self, survival: Sequence[Sequence[float]]) -> bool:
        """Does a round with these survivals pay at this load, with the scheduler's own choice
        of lengths (no budget caps) and the realized-rate correction?"""
        surv = self.corrected(survival)
        return self.pays(surv, self.lengths(surv, [self.gamma] * len(surv)))

    def prior_pays(self, live: int) -> bool | None:
        """Would the average drafted round pay at `live` requests? None without history."""
        if self.prior is None:
            return None
        return self.priced([self.prior] * live)

    @staticmethod
    def load_band(live: int) -> int:
        """Loads 1, 2, 3-4, 5-8, ... share a back-off (the next power of two)."""
        return 1 << max(0, live - 1).bit_length()

    def backoff(self, live: int) -> int:
        """AR rounds the next failed round at this load starts. A load not yet backed off
        inherits the longest back-off of the lower loads seen: a verify pass only gets more
        compute-bound with load, so drafting that lost at a lower load loses here too."""
        b = self.load_band(live)
        if b in self.skip_next:
            own = self.skip_next[b]
        else:
            own = max([n for k, n in self.skip_next.items() if k < b], default=self.interval)
        return min(max(own, self.probe_floor(live)), self.max_interval)

    def probe_floor(self, live: int) -> int:
        """The shortest back-off that keeps probes under `probe_budget` of the AR time at this
        load: a probe costs a draft round, ~1 AR step at 64 requests on a CPU."""
        if self.probe_budget <= 0:
            return 1
        step = self.profile.step_time(live, 1)
        return math.ceil(self.profile.draft_time(live) / (self.probe_budget * step))

    def should_draft(self, live: int, max_cap: int | None = None) -> bool:
        """Before a round of `live` requests; `max_cap`: the most drafts any request may still
        verify (its budget); 0 means a draft could add nothing."""
        if max_cap is not None and max_cap <= 0:
            return False
        # a new load band: price the average round there (within a band, e.g. requests
        # finishing one by one at the end of a call, its back-off stands)
        if self.load is None or self.load_band(live) != self.load_band(self.load):
            verdict = self.prior_pays(live)
            if verdict and self.realized_loss(live):
                verdict = False
            if verdict is True:
                self.skip_left = 0
            elif verdict is False:
                self.skip_left = max(self.skip_left, self.backoff(live))
        self.load = live
        if self.skip_left > 0:
            self.skip_left -= 1
            self.probe_next = self.skip_left == 0  # the round after a back-off probes
            return False
        self.probing, self.probe_next = self.probe_next, False
        return True

    def observe(
        self,
        survival: Sequence[Sequence[float]],
        verified: Sequence[int] | None = None,
        accepted: Sequence[int] | None = None,
    ) -> None:
        """After a drafted round (`survival [R][gamma]`; `verified [R]` drafts verified and
        `accepted [R]` drafts accepted per request, when known): fold it into the prior and
        the realized rates, back off if this round does not pay at this load."""
        if verified is not None and accepted is not None:
            d = self.realized_decay
            self.predicted_sum = [d * x for x in self.predicted_sum]
            self.realized_sum = [d * x for x in self.realized_sum]
            for a, v, n in zip(survival, verified, accepted):
                for j in range(min(v, self.gamma)):
                    self.predicted_sum[j] += a[j]
                    self.realized_sum[j] += float(n > j)
        mean = [sum(a[j] for a in survival) / len(survival) for j in range(self.gamma)]
        w = 1.0 if self.probing else self.prior_weight  # a probe re-learns the traffic now
        self.probing = False
        self.prior = (
            mean if self.prior is None else [(1 - w) * p + w * m for p, m in zip(self.prior, mean)]
        )
        live = self.load = len(survival)
        if self.priced(survival) and not self.realized_loss(live):
            self.skip_next[self.load_band(live)] = self.interval
        else:
            self.skip_left = self.backoff(live)
            self.skip_next[self.load_band(live)] = min(2 * self.skip_left, self.max_interval)
