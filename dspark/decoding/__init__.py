"""The bundled speculative decoder: static caches, pure verification, the AR baseline."""

from dspark.decoding.decoder import SpeculativeDecoder
from dspark.decoding.observer import DecodeObserver
from dspark.decoding.output import GenerationOutput
from dspark.decoding.verify import verify_greedy, verify_sampled

__all__ = [
    "DecodeObserver",
    "GenerationOutput",
    "SpeculativeDecoder",
    "verify_greedy",
    "verify_sampled",
]
