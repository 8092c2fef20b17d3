"""The DSpark draft model: block-parallel backbone, Markov heads, confidence head."""

from transformers import AutoModel

from dspark.config import DSparkConfig
from dspark.modeling.draft import DSparkDraftModel, DSparkDraftOutput
from dspark.modeling.heads import ConfidenceHead, GatedMarkovHead, MarkovHead, RNNMarkovHead
from dspark.modeling.protocols import DraftInference


def _register_auto() -> None:
    try:
        AutoModel.register(DSparkConfig, DSparkDraftModel)
    except ValueError:  # already registered
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
