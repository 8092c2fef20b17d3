"""The DSpark draft model: block-parallel backbone, Markov heads, confidence head."""

from dspark.modeling.draft import DSparkDraftModel, DSparkDraftOutput
from dspark.modeling.heads import ConfidenceHead, GatedMarkovHead, MarkovHead, RNNMarkovHead
from dspark.modeling.protocols import DraftInference


def _register_auto() -> None:
    try:
        from transformers import AutoModel

        from dspark.config import DSparkConfig

        AutoModel.register(DSparkConfig, DSparkDraftModel)
    except (ValueError, ImportError):  # already registered
        pass


_register_auto()

__all__ = [
    "ConfidenceHead",
    "DSparkDraftModel",
    "DSparkDraftOutput",
    "DraftInference",
    "GatedMarkovHead",
    "MarkovHead",
    "RNNMarkovHead",
]
