"""dspark: train DSpark speculative-decoding drafts, prove them in a bundled decoder, export them.

    from dspark import load_target, DSparkConfig, DSparkDraftModel, SpeculativeDecoder

Names resolve lazily so `import dspark` stays cheap for scripts that need one part.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "load_target": "dspark.target",
    "load_tokenizer": "dspark.target",
    "TargetNotFoundError": "dspark.target",
    "DSparkConfig": "dspark.config",
    "DSparkDraftModel": "dspark.modeling",
    "build_objective": "dspark.objectives",
    "SpeculativeDecoder": "dspark.decoding",
    "DecoderOptions": "dspark.decoding",
    "GenerationOutput": "dspark.decoding",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dspark' has no attribute {name!r}")
