"""The DSpark draft model: block-parallel backbone, Markov heads, confidence head."""

from dspark.modeling.draft import DSparkDraftModel, DSparkDraftOutput
from dspark.modeling.heads import ConfidenceHead, GatedMarkovHead, MarkovHead, RNNMarkovHead

__all__ = [
    "ConfidenceHead",
    "DSparkDraftModel",
    "DSparkDraftOutput",
    "GatedMarkovHead",
    "MarkovHead",
    "RNNMarkovHead",
]
