"""Small builders shared by test modules (fixtures live in conftest.py)."""

import torch

from dspark.config import DSparkConfig, choose_mask_token_id
from dspark.modeling import DSparkDraftModel


def make_draft(target, tok, num_hidden_layers: int = 1, markov_rank: int = 8, **kw):
    """A randomly initialised (seed 0) draft for `target`, small unless told otherwise."""
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=num_hidden_layers,
        markov_rank=markov_rank,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
        **kw,
    )
    torch.manual_seed(0)
    return DSparkDraftModel.from_target(target, cfg)
