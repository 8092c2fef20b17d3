"""The bundled speculative decoder: static caches, pure verification, the AR baseline."""

from dspark.decoding.decoder import SpeculativeDecoder
from dspark.decoding.output import GenerationOutput
from dspark.decoding.verify import verify_greedy, verify_sampled

__all__ = ["GenerationOutput", "SpeculativeDecoder", "verify_greedy", "verify_sampled"]
