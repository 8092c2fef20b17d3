"""A `SpeculativeDecoder` that verifies at most `max_verify` drafts a round.

The benchmark's `verify_length` (dspark/eval/auto_settings.py) lowers every round's cap
min(gamma, budget - 1) to min(max_verify, ...) before the verify policy sees it. The cap is a
constant, decided before decoding and never from the target, so it is lossless: at T = 0 the
output equals plain greedy decoding (tests/test_dtype_choice.py). The draft still runs the
block pass over the whole block it was trained for (a shorter block would change its
bidirectional block pass); under the full-block policy its serial Markov loop stops at the cap.
"""

from __future__ import annotations

from dspark.decoding import DecoderOptions, SpeculativeDecoder


class CappedVerifyDecoder(SpeculativeDecoder):
    def __init__(self, target, draft, options: DecoderOptions | None = None, *, max_verify: int):
        super().__init__(target, draft, options)
        if not 1 <= max_verify:
            raise ValueError(f"max_verify={max_verify} must be >= 1")
        self.max_verify = int(max_verify)

    def _caps(self, caps: list[int]) -> list[int]:
        # caps [live]: drafts each live row may verify this round (the budget's bound), lowered
        return [min(c, self.max_verify) for c in caps]
