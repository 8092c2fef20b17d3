"""The settings of the dspark (and dflash) objective: the run config's `objective.*` keys, their
defaults (the loss weights of the method doc, section 2) and their ranges, written here once:
`DSparkObjective` (dspark/objectives/dspark.py) and its registration both read them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dspark.errors import BadInputError
from dspark.objectives.feature_noise import FEATURE_NOISE


@dataclass(frozen=True)
class LossWeights:
    """The loss-weight defaults (method doc, section 2), written here once: `DSparkObjective`
    and `DSparkSettings` (the run config's `objective.*` keys) both read them."""

    ce_weight: float = 0.1
    l1_weight: float = 0.9
    confidence_weight: float = 1.0
    loss_decay_gamma: float = 4.0


LOSS_WEIGHTS = LossWeights()

# Supervised slots per loss chunk (`objective.chunk_slots`; 0 / None: all at once): the draft's
# and target's vocabulary-sized fp32 tensors exist for one chunk at a time, recomputed in
# backward (dspark/modeling/slot_chunks.py). At V = 152k one fp32 [256, V] tensor is 156 MB
# (a 4096-token sequence with 512 anchors of gamma 7 has 3584 slots: 2.2 GB per tensor
# unchunked); 256 rows still keep the lm_head matmuls large.
CHUNK_SLOTS = 256


# (key) -> (lowest allowed, whether the bound itself is allowed, what the key means)
_BOUNDS = {
    "ce_weight": (0, True, "a loss weight"),
    "l1_weight": (0, True, "a loss weight"),
    "confidence_weight": (0, True, "a loss weight"),
    "loss_decay_gamma": (0, False, "the positional decay of the loss"),
    "feature_noise": (0, True, "the feature noise as a share of each vector's RMS"),
}


@dataclass
class DSparkSettings:
    """The run config's `objective.*` keys of the dspark and dflash objectives."""

    ce_weight: float = LOSS_WEIGHTS.ce_weight
    l1_weight: float = LOSS_WEIGHTS.l1_weight
    confidence_weight: float = LOSS_WEIGHTS.confidence_weight
    loss_decay_gamma: float = LOSS_WEIGHTS.loss_decay_gamma
    # supervised slots per loss chunk, recomputed in backward (0 / null: all slots at once)
    chunk_slots: int | None = CHUNK_SLOTS
    # Training steps add Gaussian noise to the target's tapped hidden states, std this times
    # each vector's RMS (dspark/objectives/feature_noise.py); held-out metrics read clean ones.
    feature_noise: float = FEATURE_NOISE

    def __post_init__(self) -> None:
        for key, (low, inclusive, what) in _BOUNDS.items():
            value = getattr(self, key)
            if not (math.isfinite(value) and (value >= low if inclusive else value > low)):
                op = ">=" if inclusive else ">"
                raise BadInputError(f"objective.{key}={value} is out of range: {what}, {op} {low}")
