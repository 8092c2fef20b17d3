"""LoRA fine-tuning of an existing draft through `peft` (run config `draft.lora`).

The adapters are injected in place (`peft.inject_adapter_in_model`): the model stays a
`DSparkDraftModel`, so the objective, the loop and the checkpoints use it unchanged; only the
LoRA matrices train. Whenever the draft is written as a draft (save_pretrained, export) the
adapters are merged into a copy first (W + B A * alpha/r), so every saved draft is the plain
serving layout; the training checkpoints (Accelerate state) keep the unmerged LoRA weights so a
resumed run continues exactly.
"""

from __future__ import annotations

import copy
from typing import TypeVar

from torch import nn

# The frozen copies of the target's embeddings / lm_head are never adapted.
FROZEN = ("embed_tokens", "lm_head")

M = TypeVar("M", bound=nn.Module)


def has_lora(model: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer  # heavy: peft takes seconds to import

    return any(isinstance(m, LoraLayer) for m in model.modules())


def apply_lora(draft: nn.Module, r: int, alpha: float, target_modules, dropout: float = 0.0) -> int:
    """Inject LoRA adapters into `draft` in place and freeze everything else; returns the
    number of trainable parameters."""
    from peft import LoraConfig, inject_adapter_in_model  # heavy: peft takes seconds to import

    mods = list(target_modules)
    bad = [m for m in mods if m in FROZEN]
    if bad:
        raise ValueError(
            f"draft.lora.target_modules {bad} are the target's frozen copies; drop them"
        )
    if r < 1:
        raise ValueError(f"draft.lora.r must be >= 1 (got {r})")
    cfg = LoraConfig(
        r=int(r),
        # peft annotates lora_alpha as int, but it is only a scale (alpha / r): floats work
        lora_alpha=float(alpha),  # type: ignore[arg-type]
        lora_dropout=float(dropout),
        target_modules=mods,
    )
    inject_adapter_in_model(cfg, draft)
    if not has_lora(draft):
        raise ValueError(f"draft.lora.target_modules {mods} match no module of the draft")
    n = 0
    for name, p in draft.named_parameters():
        p.requires_grad_("lora_" in name)
        n += p.numel() if p.requires_grad else 0
    return n


def merged_copy(model: M) -> M:
    """A copy of `model` with every LoRA adapter merged into its base layer and removed."""
    from peft.tuners.lora import LoraLayer  # heavy: peft takes seconds to import

    out = copy.deepcopy(model)
    for name, module in list(out.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            parent = out.get_submodule(parent_name) if parent_name else out
            setattr(parent, child, module.get_base_layer())
    for p in out.parameters():
        p.requires_grad_(False)
    return out
