"""Sequential (Markov) heads and the confidence head (method doc, section 1).

Markov heads add a bias to slot k's backbone logits U_k from the previous token x_{k-1}
(x_{-1} = the anchor), restoring the intra-block dependency a parallel backbone lacks:

- `vanilla`: bias_k = W2(W1[x_{k-1}])
- `gated`:   bias_k = W2(g_k * W1[x_{k-1}]), g_k = sigmoid(gate_proj([h_k ; W1[x_{k-1}]]))
- `rnn`:     DeepSpec's exact recurrence (s_{-1} = 0), so its checkpoints and ours load
             into each other: [g ; c ; o] = joint_proj([s_{k-1} ; W1[x_{k-1}] ; h_k])
             (Linear(2r + H -> 3r)), s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c),
             bias_k = W2(tanh(o)): the output reads the previous state s_{k-1} (through o),
             not s_k.

W1 = `markov_w1` Embedding(V, r), W2 = `markov_w2` Linear(r, K, bias=False) (weight [K, r]):
W1 reads the previous token's target id (V rows), W2 scores the draft's K ids (K = V unless
the draft vocabulary is reduced, `config.draft_vocab_size`).
The feature a head hands the confidence head (`feat`) is the raw W1[x_{k-1}] for every type.

Confidence head: `proj` Linear(H + r -> 1) on [h_k ; W1[x_{k-1}]] (or Linear(H -> 1) on h_k);
sigmoid(logit) = P(draft k accepted | drafts before it accepted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from dspark.config import DSparkConfig

# The Markov heads a draft can name (`markov_head_type`), keyed by name; each head registers
# itself here (`register_markov_head`), and the run schema's allowed names are these keys
# (`markov_head_types`): a new head is one module, registered on import.
MARKOV_HEADS: dict[str, type[MarkovHead]] = {}


def markov_head_types() -> tuple[str, ...]:
    """The Markov head types, the one list: the registered heads' names (a module that
    registers another head adds its name). The run schema's choices and the draft's build
    read it."""
    return tuple(MARKOV_HEADS)


def register_markov_head(name: str):
    """Class decorator: the head `markov_head_type=NAME` builds (its `head_type` is set)."""

    def register(cls: type[MarkovHead]) -> type[MarkovHead]:
        cls.head_type = name
        MARKOV_HEADS[name] = cls
        return cls

    return register


@register_markov_head("vanilla")
class MarkovHead(nn.Module):
    """`vanilla` head; subclasses change only `mix` (and `init_state`)."""

    head_type = "vanilla"

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        V, K, r = config.vocab_size, config.num_draft_tokens, int(config.markov_rank)
        self.rank = r
        self.markov_w1 = nn.Embedding(V, r)  # indexed by target ids
        self.markov_w2 = nn.Linear(r, K, bias=False)  # one row per draft id

    def init_state(self, batch: int) -> torch.Tensor | None:
        """State before slot 0 (None for stateless heads)."""
        return None

    def mix(
        self, h: torch.Tensor, emb: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(h_k [.., H], W1[x_{k-1}] [.., r], state)` -> `(mixed [.., r], new_state)`."""
        return emb, state

    def step(
        self, h_k: torch.Tensor, prev_token: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One serial slot: `(h_k [B,H], prev_token [B], state) -> (bias [B,K], feat [B,r], state)`;
        `prev_token` holds target ids, `bias` scores draft ids.

        Draft logits of the slot = `U_k + bias`; `feat` feeds the confidence head.
        """
        emb = self.markov_w1(prev_token)
        mixed, state = self.mix(h_k, emb.to(h_k.dtype), state)
        return self.markov_w2(mixed), emb, state

    def teacher_forced(
        self, h: torch.Tensor, prev_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """All slots at once with given previous tokens.

        `h [..., gamma, H]`, `prev_tokens [..., gamma]` -> `(mixed [..., gamma, r], feat [..., gamma, r])`;
        the bias of every slot is `markov_w2(mixed)`.
        """
        emb = self.markov_w1(prev_tokens)
        mixed, _ = self.mix(h, emb.to(h.dtype), None)
        return mixed, emb

    def bias(self, mixed: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(mixed)


@register_markov_head("gated")
class GatedMarkovHead(MarkovHead):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        self.gate_proj = nn.Linear(config.hidden_size + self.rank, self.rank)

    def mix(
        self, h: torch.Tensor, emb: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        gate = torch.sigmoid(self.gate_proj(torch.cat([h, emb], dim=-1)))
        return gate * emb, state


@register_markov_head("rnn")
class RNNMarkovHead(MarkovHead):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        self.joint_proj = nn.Linear(2 * self.rank + config.hidden_size, 3 * self.rank)

    def init_state(self, batch: int) -> torch.Tensor:
        w = self.markov_w2.weight
        return torch.zeros(batch, self.rank, device=w.device, dtype=w.dtype)

    def mix(
        self, h: torch.Tensor, emb: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if state is None:
            state = torch.zeros(*h.shape[:-1], self.rank, device=h.device, dtype=h.dtype)
        state = state.to(h.dtype)
        g, c, o = self.joint_proj(torch.cat([state, emb, h], dim=-1)).chunk(3, dim=-1)
        z = torch.sigmoid(g)
        new_state = z * state + (1 - z) * torch.tanh(c)
        return torch.tanh(o), new_state

    def teacher_forced(
        self, h: torch.Tensor, prev_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.markov_w1(prev_tokens)
        e = emb.to(h.dtype)
        state = None
        mixed = []
        for k in range(h.shape[-2]):
            m, state = self.mix(h[..., k, :], e[..., k, :], state)
            mixed.append(m)
        return torch.stack(mixed, dim=-2), emb


def build_markov_head(config: DSparkConfig) -> MarkovHead | None:
    if int(config.markov_rank) == 0:
        return None
    if config.markov_head_type not in MARKOV_HEADS:
        raise ValueError(
            f"unknown markov_head_type {config.markov_head_type!r}; use one of "
            f"{markov_head_types()}"
        )
    return MARKOV_HEADS[config.markov_head_type](config)


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, markov_rank: int = 0) -> None:
        super().__init__()
        self.with_markov = markov_rank > 0
        self.proj = nn.Linear(hidden_size + markov_rank, 1)

    def forward(self, h_k: torch.Tensor, feat: torch.Tensor | None = None) -> torch.Tensor:
        """`h_k [.., H]`, `feat [.., r] | None` -> logit `[..]`."""
        if self.with_markov:
            if feat is None:
                raise ValueError("this confidence head reads [h_k ; W1[x_{k-1}]]: pass feat")
            h_k = torch.cat([h_k, feat.to(h_k.dtype)], dim=-1)
        return self.proj(h_k).squeeze(-1)


def build_confidence_head(config: DSparkConfig) -> ConfidenceHead | None:
    if not config.enable_confidence_head:
        return None
    rank = int(config.markov_rank) if config.confidence_head_with_markov else 0
    return ConfidenceHead(config.hidden_size, rank)
