"""Training objectives (methods) for the one training loop, each registered by its own module.

objective = build_objective("dspark", target, draft.config, ce_weight=0.1, ...)
loss, metrics = objective.step(draft, batch, reducer)
metrics = objective.evaluate(draft, batch, reducer)

A new objective is one module: a class on `ObjectiveBase` decorated with
`@register_objective("name", settings=ItsSettings)` (dspark/objectives/registry.py); a run
picks it with `objective=name` (its settings' keys: `objective.KEY=...`).
"""

from __future__ import annotations

from dspark.objectives.base import (
    LocalReducer,
    Objective,
    ObjectiveBase,
    ObjectiveContext,
    Reducer,
    TorchDistributedReducer,
)
from dspark.objectives.dspark import DFlashObjective, DSparkObjective
from dspark.objectives.dspark_settings import CHUNK_SLOTS, LOSS_WEIGHTS, DSparkSettings, LossWeights
from dspark.objectives.registry import (
    OBJECTIVES,
    build_objective,
    build_objective_from_config,
    objective_defaults,
    objective_keys,
    objective_settings,
    register_objective,
)

# Draft-config overrides (for DSparkConfig.from_target_config) that make a pure DFlash draft.
# The Hydra option `draft=dflash` (conf/draft/dflash.yaml) states the same keys: both stay,
# because this constant must work without a checkout's conf/ (an installed package) and the
# yaml is the group option users see beside dspark/gated/rnn; loading one from the other would
# tie the package to finding conf/. tests/test_run_config.py checks the two are equal.
DFLASH_CONFIG_OVERRIDES = {
    "markov_rank": 0,
    "enable_confidence_head": False,
    "confidence_head_with_markov": False,
}


__all__ = [
    "CHUNK_SLOTS",
    "DFLASH_CONFIG_OVERRIDES",
    "DFlashObjective",
    "DSparkObjective",
    "DSparkSettings",
    "LOSS_WEIGHTS",
    "LossWeights",
    "LocalReducer",
    "OBJECTIVES",
    "Objective",
    "ObjectiveBase",
    "ObjectiveContext",
    "Reducer",
    "TorchDistributedReducer",
    "build_objective",
    "build_objective_from_config",
    "objective_defaults",
    "objective_keys",
    "objective_settings",
    "register_objective",
]
