"""Command-line overrides checked against a run-config schema before Hydra composes anything.

Hydra reports a misspelt key or a value of the wrong type as a multi-line block (and adds a
key given with `+` to a closed schema without a word); the entry scripts promise one `error:`
line that names the fix. `check_overrides` parses each `key=value` argument with Hydra's own
override parser and raises a `UserError`:
- for a key the schema does not declare (with or without `+`), with a "did you mean";
- for a value the key's type rejects (each value of a sweep `a,b,c` is checked);
- for a config-group choice (`recipe=NAME`, `optim=NAME`) that names no file of the group.
Sweeps over ranges / intervals and `hydra.*` keys are left to Hydra.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass

from dspark.errors import UserError


def schema_keys(cls, prefix: str = "") -> list[str]:
    """Every key of a dataclass schema, inner nodes too: `["optim", "optim.lr", ...]`."""
    out: list[str] = []
    for f in fields(cls):
        out.append(prefix + f.name)
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            out.extend(schema_keys(type(default), prefix + f.name + "."))
    return out


def _values(override) -> list:
    """The plain values an override sets (each choice of a `a,b,c` sweep), or [] when it is a
    range / interval sweep or a deletion, which Hydra checks itself."""
    from hydra.core.override_parser.types import (  # light module: defers hydra
        ChoiceSweep,
        OverrideType,
    )

    if override.type == OverrideType.DEL:
        return []
    if not override.is_sweep_override():
        return [override.value()]
    if isinstance(override._value, ChoiceSweep):
        return list(override.sweep_iterator())
    return []


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_overrides(
    args: Iterable[str],
    schema,
    groups: Mapping[str, Iterable[str]] | None = None,
    extra_keys: Iterable[str] = (),
) -> None:
    """Raise a `UserError` for the first bad `key=value` in `args` (see the module doc).

    `schema`: the run config's dataclass; `groups`: config group -> its choices (file stems);
    `extra_keys`: keys of dict-typed sections the schema cannot list (their values are checked
    later, by the run config's own checks)."""
    from hydra.core.override_parser.overrides_parser import (  # light module: defers hydra
        OverridesParser,
    )
    from hydra.errors import HydraException, OverrideParseException  # light module: defers hydra
    from omegaconf import OmegaConf  # light module: defers omegaconf
    from omegaconf.errors import OmegaConfBaseException  # light module: defers omegaconf

    groups = {g: sorted(set(c)) for g, c in (groups or {}).items()}
    known = schema_keys(schema) + list(extra_keys)
    parser = OverridesParser.create()
    base = OmegaConf.structured(schema)
    for arg in args:
        if arg.startswith("-") or "=" not in arg and not arg.startswith("~"):
            continue
        try:
            override = parser.parse_override(arg)
        except (OverrideParseException, HydraException) as e:
            raise UserError(f"cannot parse the override '{arg}': {_first_line(e)}") from None
        key = override.key_or_group
        if key == "hydra" or key.startswith("hydra."):
            continue
        if key in groups:
            for value in _values(override):
                if value is not None and str(value) not in groups[key]:
                    close = difflib.get_close_matches(str(value), groups[key], n=1)
                    hint = f" Did you mean '{close[0]}'?" if close else ""
                    raise UserError(
                        f"{key}={value} names no {key} config.{hint} Known: "
                        f"{', '.join(groups[key])}"
                    )
            continue
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            section = key.rsplit(".", 1)[0] if "." in key else ""
            siblings = [
                k[len(section) + 1 :] if section else k
                for k in known
                if (k.startswith(section + ".") if section else True)
                and "." not in (k[len(section) + 1 :] if section else k)
            ]
            where = f"{section} has" if section else "the top level has"
            raise UserError(
                f"unknown config key '{key}' in '{arg}'.{hint} {where}: {', '.join(siblings)}"
            )
        for value in _values(override):
            try:
                OmegaConf.update(OmegaConf.structured(base), key, value, merge=True)
            except OmegaConfBaseException as e:
                raise UserError(f"{key}={value!r}: {_first_line(e)}") from None


def check_sweep_outputs(args: list[str], output_key: str) -> None:
    """A `-m` sweep whose jobs would share one output directory is refused before any job
    starts: with `output_key` (or `hydra.sweep.subdir`) set to one fixed value, every job
    would write the first job's run (Hydra's default, a subdirectory per job number, is fine).
    """
    from hydra.core.override_parser.overrides_parser import (  # light module: defers hydra
        OverridesParser,
    )

    if not {"-m", "--multirun"} & set(args):
        return
    overrides = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    jobs = 1
    for o in overrides:
        if o.is_sweep_override():
            jobs *= max(1, len(list(o.sweep_string_iterator())))
    if jobs < 2:
        return
    for o in overrides:
        if o.key_or_group not in (output_key, "hydra.sweep.subdir"):
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else []
        if not o.is_sweep_override():
            text = o.get_value_element_as_str()
            if "$" in text:  # an interpolation (`${hydra.job.num}`, `${now:...}`): per job
                continue
            values = [text]
        if len(set(values)) < jobs:
            raise UserError(
                f"this sweep runs {jobs} jobs, but {o.key_or_group}={','.join(values)} gives "
                f"them {len(set(values))} output director{'y' if len(set(values)) == 1 else 'ies'}: "
                f"jobs would overwrite each other's runs. Drop {o.key_or_group} (each job then "
                "writes runs/sweeps/<time>/<job number>), or interpolate the job, e.g. "
                f"{o.key_or_group}=DIR/${{hydra.job.num}}"
            )
