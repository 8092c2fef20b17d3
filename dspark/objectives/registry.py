"""The objectives a run can name (`objective.name`), each registered by its own module.

    @register_objective("mine", settings=MySettings)
    class MyObjective(ObjectiveBase): ...

`settings` is a dataclass of the objective's own keys (the run config's `objective.*` beside
`name`), their types and defaults; a key it lacks or a value of the wrong type is one
`BadInputError` naming the objective's keys. The class builds itself from those settings and
the run's `ObjectiveContext` (`ObjectiveBase.from_settings`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dspark.errors import BadInputError
from dspark.objectives.base import Objective, ObjectiveContext


@dataclass(frozen=True)
class ObjectiveEntry:
    cls: type
    settings: type | None  # a dataclass of the objective's keys; None: it has none


OBJECTIVES: dict[str, ObjectiveEntry] = {}


def register_objective(name: str, settings: type | None = None) -> Callable[[type], type]:
    """Class decorator: the objective `objective.name=NAME` builds (its `name` is set)."""

    def register(cls: type) -> type:
        cls.name = name  # type: ignore[attr-defined]
        OBJECTIVES[name] = ObjectiveEntry(cls, settings)
        return cls

    return register


def objective_entry(name: str) -> ObjectiveEntry:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise BadInputError(
            f"objective.name={name!r} names no objective; choose one of {sorted(OBJECTIVES)}"
        ) from None


def objective_keys(name: str) -> list[str]:
    """The keys of objective `name`'s settings, in their order."""
    settings = objective_entry(name).settings
    return [f.name for f in fields(settings)] if settings is not None else []


def objective_defaults(name: str) -> dict[str, Any]:
    """`{"name": name, **its settings' defaults}`: the run config's `objective` section."""
    settings = objective_entry(name).settings
    return {"name": name, **(asdict(settings()) if settings is not None else {})}


def objective_settings(section: Mapping[str, Any]) -> Any:
    """The settings dataclass of `section["name"]` filled from `section` (its other keys): a
    key the objective lacks, a value of the wrong type or out of its range is a
    `BadInputError` naming the key."""
    name = str(section.get("name", "dspark"))
    settings = objective_entry(name).settings
    values = {k: v for k, v in section.items() if k != "name"}
    keys = objective_keys(name)
    for key in values:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f" Did you mean 'objective.{close[0]}'?" if close else ""
            raise BadInputError(
                f"objective.{key} is not a key of objective {name!r}.{hint} Its keys: "
                f"{', '.join(keys) or 'none'}"
            )
    if settings is None:
        return None
    try:
        merged = OmegaConf.merge(OmegaConf.structured(settings), values)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        first = str(e).strip().splitlines()[0]
        bad = getattr(e, "full_key", None)
        where = f"objective.{bad}={values.get(bad)!r} " if bad in values else ""
        raise BadInputError(f"{where}(objective {name!r}): {first}") from None


def build_objective_from_config(section: Mapping[str, Any], context: ObjectiveContext) -> Objective:
    """The objective the run config's `objective` section names, built with `context`."""
    entry = objective_entry(str(section.get("name", "dspark")))
    return entry.cls.from_settings(objective_settings(section), context)  # type: ignore[attr-defined]


def build_objective(name: str, target, draft_config, **kwargs) -> Objective:
    """Objective `name` for `target` and the draft's config; `kwargs` go to its constructor
    (DSpark's: ce_weight, l1_weight, confidence_weight, loss_decay_gamma, chunk_slots,
    num_anchors, seed, ...)."""
    try:
        cls = OBJECTIVES[name].cls
    except KeyError:
        raise ValueError(
            f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}"
        ) from None
    return cls(target, draft_config, **kwargs)
