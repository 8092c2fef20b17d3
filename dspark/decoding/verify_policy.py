"""`VerifyPolicy`: how many of its drafts each request sends to the target in a round.

Every choice is made from the draft alone (its confidences c_k and the remaining budgets),
never from the target, so decoding stays lossless whatever the policy:
- `full`: every request verifies its cap, min(gamma, remaining budget - 1) drafts;
- `threshold`: the longest prefix whose survival prod_{i<=k} c_i >= `confidence_threshold`,
  at least one draft (a 2-token verify costs about what a 1-token step does, and a round
  without a draft would waste the draft pass), within the cap;
- `scheduler`: the prefix scheduler (paper Algorithm 1, scheduler.py) over the survivals and
  the device's SPS(B) profile (sps.py; measured at start-up and cached when not given).
  `scheduler_batch="padded"` (default) prices what the decoder runs, one padded `[R, 1 + L]`
  pass, and admits whole depths; `"ragged"` is the published per-slot algorithm with
  B = sum(1 + l_r): rows then verify their own l_r inside a pass padded to max l_r, so the pass
  computes `R * (1 + max l_r)` tokens while the scheduler priced B (the output records both,
  `round_tokens` / `round_width`). Rows never verify the padding's free drafts under `ragged`:
  whether another row reaches depth j can depend on this row's a_{j+1}, i.e. on its x_j,
  which would make the choice anticipating (scheduler.py). The scheduler's `DraftGate`
  (draft_gate.py) also skips the draft on rounds where drafting does not pay at the current
  load (plain AR steps that still feed the draft's context), with probes every
  `draft_probe_interval` rounds, doubling up to `max_draft_probe_interval`, never more often
  than keeps probes under `draft_probe_budget` of the AR time (0: no floor); it needs draft
  times in the profile. Its history persists across `generate` calls (`gate.reset()`
  forgets it), so give each decoder its own policy.

`calibrate`: the confidences are the draft config's STS temperatures applied to c_k
(`confidence_temperatures`, method doc section 4), for every policy and in the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from operator import mul

import torch

from dspark.decoding.draft_gate import (
    MAX_PROBE_INTERVAL,
    PROBE_BUDGET,
    PROBE_INTERVAL,
    DraftGate,
)
from dspark.decoding.scheduler import SCHEDULERS
from dspark.decoding.sps import SPSProfile, load_or_measure

POLICIES = ("full", "threshold", "scheduler")


def threshold_lengths(confidence: torch.Tensor, threshold: float) -> torch.Tensor:
    """Per request, the longest prefix of `confidence [R, gamma]` whose survival
    prod_{i<=k} c_i >= `threshold`, at least 1."""
    survival = confidence.cumprod(dim=1)
    return (survival >= threshold).long().cumprod(dim=1).sum(dim=1).clamp_min(1)


class VerifyPolicy:
    """`full | threshold | scheduler` (module docstring); `kind=None` picks `threshold` when a
    `confidence_threshold` is set and the draft has a confidence head, else `full`. The
    decoder binds it to its models once (`attach`), then asks per round how far to draft
    (`draft_steps`, where the draft gate has its say), then how many drafts each request
    verifies (`lengths`), and tells it what verification realized (`observe`)."""

    def __init__(
        self,
        kind: str | None = None,
        *,
        confidence_threshold: float | None = None,
        sps: SPSProfile | None = None,
        scheduler_batch: str = "padded",
        calibrate: bool = True,
        skip_unprofitable_drafts: bool = True,
        draft_probe_interval: int = PROBE_INTERVAL,
        max_draft_probe_interval: int = MAX_PROBE_INTERVAL,
        draft_probe_budget: float = PROBE_BUDGET,
    ):
        if kind is not None and kind not in POLICIES:
            raise ValueError(f"verify_policy={kind!r}; use one of {POLICIES}")
        if scheduler_batch not in SCHEDULERS:
            raise ValueError(f"scheduler_batch={scheduler_batch!r}; use one of {tuple(SCHEDULERS)}")
        if kind == "threshold" and confidence_threshold is None:
            raise ValueError("verify_policy='threshold' needs confidence_threshold=<0..1>")
        self.kind = kind
        self.confidence_threshold = confidence_threshold
        self.sps = sps
        self.scheduler_batch = scheduler_batch
        self.calibrate = calibrate
        self.skip_unprofitable_drafts = skip_unprofitable_drafts
        self.gate_options = {
            "interval": draft_probe_interval,
            "max_interval": max_draft_probe_interval,
            "probe_budget": draft_probe_budget,
        }
        self.gamma, self.device = 0, torch.device("cpu")
        self.confidence_temperatures: torch.Tensor | None = None  # STS, set by `attach`
        self.gate: DraftGate | None = None  # None: draft every round

    def attach(self, target, draft, device: torch.device) -> None:
        """Bind to the decoder's models: pick the default kind, check that the draft can rank
        its drafts, read its STS temperatures, measure the SPS profile when the scheduler needs
        one and none was given, and build the draft gate."""
        has_conf = getattr(draft, "confidence_head", None) is not None
        if self.kind is None:  # a threshold without a confidence head verifies the block
            self.kind = (
                "threshold" if self.confidence_threshold is not None and has_conf else "full"
            )
        if self.kind in ("threshold", "scheduler") and draft is not None and not has_conf:
            raise ValueError(
                f"verify_policy={self.kind!r} ranks drafts by confidence but this "
                "draft has no confidence head; use verify_policy='full'"
            )
        self.gamma = int(draft.config.block_size) if draft is not None else 0
        self.device = device
        temps = getattr(draft.config, "confidence_temperatures", None) if draft else None
        self.confidence_temperatures = (
            torch.tensor(temps, dtype=torch.float32, device=device)
            if self.calibrate and temps
            else None
        )
        if self.kind != "scheduler":
            return
        if self.sps is None:
            self.sps = load_or_measure(target, draft, gamma=self.gamma)
        if self.skip_unprofitable_drafts:
            ragged = self.scheduler_batch == "ragged"
            self.gate = DraftGate.for_profile(
                self.sps, self.gamma, ragged=ragged, **self.gate_options
            )

    # ------------------------------------------------------------------ per round
    def draft_steps(self, caps: Sequence[int]) -> int | None:
        """Before a round, from its caps (per live request, the most drafts it may verify): how
        many tokens the draft proposes. 0 where the draft gate skips the draft (the round is a
        plain AR step that still feeds the draft's context); under `full` the largest cap (it
        verifies exactly its caps, so drafting further is waste); else None, the whole block
        (the confidence policies read every slot)."""
        if self.gate is not None and not self.gate.should_draft(len(caps), max(caps)):
            return 0
        return max(1, *caps) if self.kind == "full" else None

    def lengths(
        self, confidence: torch.Tensor | None, caps: Sequence[int]
    ) -> tuple[torch.Tensor, list[int]]:
        """Drafts each request verifies, `[R]` on the device and as a host list (one host sync
        unless the policy is `full`), each within its cap; `confidence [R, gamma]` (c_k)."""
        cap = torch.tensor(list(caps), device=self.device)
        if confidence is None or self.kind == "full":
            return cap, list(caps)
        if self.kind == "threshold":
            assert self.confidence_threshold is not None  # __init__ checked it
            n = torch.minimum(threshold_lengths(confidence, self.confidence_threshold), cap)
        else:
            assert self.sps is not None  # attach measured it
            table = self.sps.table(len(caps), self.gamma, self.device)
            n = SCHEDULERS[self.scheduler_batch](confidence.cumprod(dim=1), table, cap)
        return n, n.tolist()

    def observe(
        self,
        confidence: list[list[float]] | None,
        verified: Sequence[int],
        accepted: Sequence[int],
        round_s: float = 0.0,
    ) -> None:
        """After every round (`confidence` None where nothing was drafted): its wall time
        `round_s` (0: not timed) and what verification realized, for the draft gate's
        pricing."""
        if self.gate is None:
            return
        self.gate.observe_round(verified, accepted, confidence is not None, round_s)
        if confidence is not None:
            survival = [list(accumulate(c, mul)) for c in confidence]
            self.gate.observe(survival, verified, accepted)
