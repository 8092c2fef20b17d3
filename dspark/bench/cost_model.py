"""The decoder's cost model on the actual device: what a speculative round costs against a
plain AR step, and so which tau a draft needs before it pays off.

Its command line is `eval/cost_model.py`, a thin entry script of the same name.

Measured with the decoder's own parts (`dspark.decoding.round_cost.RoundBench`) at batch 1
over a context of `context_len` tokens:
- `t_ar`: one plain AR step (1 token, logits, argmax);
- `t_verify[n]`: one target pass over n = L + 1 tokens (anchor + L drafts) with the tapped
  features, plus writing them into the draft context cache (what a round does after drafting);
- `t_draft[layers]`: one `propose` call (block pass + serial Markov loop + confidence) of a
  draft with that many layers, block size `block_size`, rank `markov_rank`, at T = 0.
A round that verifies L drafts costs `t_draft + t_verify[L + 1]`; it commits tau tokens on
average, so the speedup over plain decoding is `tau * t_ar / (t_draft + t_verify[L + 1])`
and the break-even tau is `(t_draft + t_verify[L + 1]) / t_ar`. Given a per-position
acceptance profile (P(draft k accepted | drafts < k accepted)), `best_verify_length` picks the
L that maximises that speedup.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dspark import dtype_choice as choice
from dspark.config import DSparkConfig
from dspark.decoding.round_cost import RoundBench
from dspark.dtype_choice import break_even_tau, expected_tokens
from dspark.modeling import DSparkDraftModel

__all__ = [
    "best_verify_length",
    "break_even_tau",
    "expected_tokens",
    "measure_costs",
    "measure_draft_costs",
    "speedup",
]


def measure_costs(
    target,
    *,
    draft_layers: Sequence[int] = (1, 2, 3, 5),
    block_size: int = 7,
    markov_rank: int = 64,
    context_len: int = 256,
    repeats: int = 15,
    mask_token_id: int = 0,
    exact_rows: bool | None = None,
) -> dict:
    """Seconds per AR step, per verify pass of n tokens and per draft round (see module doc)."""
    drafts = {}  # built outside inference mode: the T=0 pruner tracks weight versions
    for n_layers in draft_layers:
        cfg = DSparkConfig.from_target_config(
            target.config,
            num_hidden_layers=n_layers,
            block_size=block_size,
            markov_rank=markov_rank,
            mask_token_id=mask_token_id,
        )
        torch.manual_seed(0)
        drafts[n_layers] = DSparkDraftModel.from_target(target, cfg).eval()
    return _measure(target, drafts, block_size, context_len, repeats, markov_rank, exact_rows)


def measure_draft_costs(
    target, draft, *, context_len: int = 256, repeats: int = 15, exact_rows: bool | None = None
) -> dict:
    """`measure_costs` for one trained draft: its own weights and shape (layers, block size,
    Markov rank, reduced vocabulary), so the break-even tau and best L are that draft's."""
    cfg = draft.config
    drafts = {int(cfg.num_hidden_layers): draft.eval()}
    return _measure(
        target, drafts, cfg.block_size, context_len, repeats, cfg.markov_rank, exact_rows
    )


def _measure(
    target, drafts, block_size, context_len, repeats, markov_rank, exact_rows=None
) -> dict:
    g = int(block_size)
    bench = RoundBench(
        target,
        next(iter(drafts.values())),
        context_len=context_len,
        max_tokens=g + 1,
        gamma=g,
        exact_rows=exact_rows,
    )
    out: dict = {"t_ar": bench.time_ar(repeats, warmup=2)}
    out["t_verify"] = {n: bench.time_verify(n, repeats, warmup=2) for n in range(1, g + 2)}
    out["t_draft"] = {
        n_layers: bench.time_draft(repeats, d, warmup=2) for n_layers, d in drafts.items()
    }
    out["conditions"] = {
        "target": getattr(target.config, "_name_or_path", "") or target.config.model_type,
        "dtype": str(next(target.parameters()).dtype).replace("torch.", ""),
        "device": str(bench.device),
        "threads": torch.get_num_threads(),
        "batch": 1,
        "context_len": context_len,
        "block_size": g,
        "markov_rank": markov_rank,
        "temperature": 0.0,
        "repeats": repeats,
        "exact_rows": bench.exact_rows,  # row-exact verify passes (row_attention.py)
    }
    return out


def speedup(tau: float, t_ar: float, t_draft: float, t_verify: float) -> float:
    return tau * t_ar / (t_draft + t_verify)


def best_verify_length(costs: dict, accept: Sequence[float], draft_layers: int) -> dict:
    """The verify length L (1..block size) with the highest predicted speedup for a draft of
    `draft_layers` layers whose conditional acceptance per position is `accept`
    (`dspark.dtype_choice.best_verify_length` on this draft's round cost)."""
    profile = {
        "t_ar": costs["t_ar"],
        "t_verify": costs["t_verify"],
        "t_draft": costs["t_draft"][draft_layers],
    }
    best = choice.best_verify_length(profile, accept)
    rows = [{k: r[k] for k in ("L", "tau", "speedup")} for r in best["curve"]]
    return {k: best[k] for k in ("L", "tau", "speedup")} | {"all": rows}
