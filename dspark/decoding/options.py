"""`DecoderOptions`: everything a `SpeculativeDecoder` is told besides its target and draft.

    SpeculativeDecoder(target, draft, DecoderOptions(sampling=Sampling(0.7), max_length=4096))

Each default is written here once; a field left out keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark.decoding.observer import DecodeObserver
from dspark.decoding.sampling import Sampling
from dspark.decoding.verify_policy import VerifyPolicy


@dataclass
class DecoderOptions:
    # how tokens are picked (sampling.py): greedy at temperature 0 (output == plain greedy
    # decoding token for token), else distributed exactly as the target's warped distribution;
    # the decoder reads it on every call, so a caller may swap it between calls
    sampling: Sampling = field(default_factory=Sampling)
    # which drafts each request verifies (verify_policy.py; default `full`); it keeps the draft
    # gate's history across calls, so give each decoder options of its own
    policy: VerifyPolicy = field(default_factory=VerifyPolicy)
    # prompt + new tokens (+ gamma spare slots) may not exceed it; it bounds the caches
    max_length: int = 2048
    # wrap the target's layer loop in torch.compile(dynamic=True) (the first compile takes
    # minutes: meant for GPUs)
    compile: bool = False
    # attended KV lengths are rounded up to a multiple of it (fewer shapes); None: 128 with
    # `compile`, else 16
    kv_bucket: int | None = None
    # record per-round draft / verify times exactly (a device sync at the boundary)
    time_rounds: bool = True
    # told which request each live row serves every round and handed each finished request's
    # caches (tests; the decoder itself keeps neither)
    observer: DecodeObserver | None = None
    # the CPU-only lm_head and T = 0 Markov-pruning shortcuts of cpu_paths.py; off runs the
    # plain path everywhere (same greedy tokens)
    cpu_fast_paths: bool = True
    # batch-1 verify passes run row-exact (row_attention.py); None: the default for the
    # target's device and its dtype at each pass
    exact_rows: bool | None = None

    @property
    def bucket(self) -> int:
        """The KV bucket the decoder rounds attended lengths to (`kv_bucket` resolved)."""
        return self.kv_bucket or (128 if self.compile else 16)
