"""The bundled speculative decoder: static caches, pure verification, the AR baseline."""

from dspark.decoding.decoder import SpeculativeDecoder
from dspark.decoding.observer import DecodeObserver
from dspark.decoding.options import DecoderOptions
from dspark.decoding.output import GenerationOutput
from dspark.decoding.sampling import Sampling
from dspark.decoding.verify import verify_greedy, verify_sampled
from dspark.decoding.verify_policy import VerifyPolicy

__all__ = [
    "DecodeObserver",
    "DecoderOptions",
    "GenerationOutput",
    "Sampling",
    "SpeculativeDecoder",
    "VerifyPolicy",
    "verify_greedy",
    "verify_sampled",
]
