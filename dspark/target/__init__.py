"""The frozen target: loading (`loading`), tiny random stand-ins (`tiny`), the embedded
SmolLM2 set-up (`prepare`) and feature capture for training (`capture`).

    from dspark.target import load_target

The package root re-exports the loader's public API only; everything else is imported from
its module (`dspark.target.capture`, `dspark.target.tiny`, ...).
"""

from dspark.target.loading import (
    TargetNotFoundError,
    load_target,
    load_tokenizer,
    resolve_target,
)

__all__ = ["TargetNotFoundError", "load_target", "load_tokenizer", "resolve_target"]
