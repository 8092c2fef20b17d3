"""The draft inference API the decoder uses (docs/contracts.md, "Draft model"), as Protocols.

Any model with these members can be decoded by `dspark.decoding`; `DSparkDraftModel` is one
(tests/test_modeling.py checks it). The protocols are `runtime_checkable`, so `isinstance`
checks that the members exist (not their signatures; the type checker does that).
Shapes: gamma = `config.block_size`, H hidden, V vocab, K draft ids (V unless
`config.draft_vocab_size` reduces them), r = `config.markov_rank`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class MarkovHeadInference(Protocol):
    def init_state(self, batch: int) -> Any:
        """The head's recurrent state for `batch` rows (None for stateless heads)."""
        ...

    def step(
        self, h_k: torch.Tensor, prev_token: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """`(bias [B, K], feat [B, r], new_state)` for slot k; `prev_token [B]` (target ids)."""
        ...


@runtime_checkable
class ConfidenceHeadInference(Protocol):
    def __call__(self, h_k: torch.Tensor, feat: torch.Tensor | None) -> torch.Tensor:
        """`logit [B]`; sigmoid = P(draft k accepted | the drafts before it accepted)."""
        ...


@runtime_checkable
class DraftInference(Protocol):
    # The data members are read-only properties: the decoder only reads them, and a plain
    # attribute of a narrower type (DSparkDraftModel's `lm_head: nn.Linear`, `markov_head:
    # MarkovHead | None`) then satisfies them; mutable protocol attributes would have to
    # match exactly. (The runtime check sees them as members all the same.)
    @property
    def config(self) -> Any:
        """block_size, mask_token_id, target_layer_ids (and optional confidence_temperatures)."""
        ...

    @property
    def lm_head(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """U [.., K] = lm_head(h [.., H]): the frozen copy of the target's head (its rows at the
        kept ids of a reduced vocabulary, K = config.draft_vocab_size; else K = V)."""
        ...

    @property
    def markov_head(self) -> MarkovHeadInference | None:
        """None when markov_rank == 0."""
        ...

    @property
    def confidence_head(self) -> ConfidenceHeadInference | None:
        """None when disabled."""
        ...

    def encode_context(self, tapped: torch.Tensor) -> torch.Tensor:
        """`tapped [B, S, L*H] -> ctx [B, S, H]`."""
        ...

    def context_kv(
        self, ctx: torch.Tensor, position_ids: torch.Tensor
    ) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        """One `(k, v)` per draft layer, `[B, n_kv_heads, S, head_dim]`, rotated at
        `position_ids [B, S]`."""
        ...

    def block_hidden(
        self,
        block_ids: torch.Tensor,
        block_position_ids: torch.Tensor,
        ctx_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        ctx_valid: torch.Tensor,
    ) -> torch.Tensor:
        """`h [B, gamma, H]` after the final norm for `block_ids [B, gamma]` at
        `block_position_ids`, attending to the context slots where `ctx_valid [B, C]`."""
        ...
