"""Teacher-forced draft outputs on one sequence, for cross-checks against other implementations.

Every position 0..S-gamma-1 is an anchor (the layout speculators' trainer selects when it may
take every valid position), slot k's previous token is x_{p+k}: the logits are those of
`DSparkDraftModel.forward` with the Markov bias and the confidence logits.
"""

from __future__ import annotations

import torch

from dspark.target.capture import OnlineTargetCapture


@torch.no_grad()
def all_anchor_outputs(draft, target, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """`input_ids [1, S]` -> {"logits" [N*gamma, V], "confidence_logits" [N*gamma], "tapped"}."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError("pass one sequence, input_ids [1, S]")
    g = int(draft.config.block_size)
    S = input_ids.shape[1]
    if S <= g:
        raise ValueError(f"the sequence needs more than block_size={g} tokens")
    feats = OnlineTargetCapture(target, draft.config.target_layer_ids)(
        {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    )
    anchors = torch.arange(S - g)[None]
    out = draft(feats.tapped, input_ids, anchors)
    V = out.logits.shape[-1]
    conf = out.confidence_logits
    return {
        "logits": out.logits.reshape(-1, V).float(),
        "confidence_logits": (conf.reshape(-1).float() if conf is not None else torch.zeros(0)),
        "tapped": feats.tapped.float(),
    }
