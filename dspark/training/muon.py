"""Muon for the draft's hidden weight matrices, AdamW for everything else (`optim.name=muon`).

Muon (torch.optim.Muon: Nesterov momentum, then the update matrix orthogonalised by a quintic
Newton-Schulz iteration, scaled by sqrt(max(1, rows / cols))) is meant for the 2-D weights of
hidden layers, whose input and output are both hidden activations. What goes where:
- Muon: the trainable 2-D weights of the backbone, i.e. `fc` ([H, L*H], the tapped features'
  projection) and every matrix of the decoder layers (`layers.*`: q/k/v/o, gate/up/down).
- AdamW: everything else. Embeddings and output heads (`markov_head.markov_w1` [V, r] is a
  lookup table, `markov_w2` [K, r] and `confidence_head` produce logits), the Markov head's
  small gate / joint projections with them (they read and write the head's rank-r state), the
  norms, the biases and every other 1-D tensor.
- LoRA factors (`lora_A` [r, in], `lora_B` [out, r]) train with AdamW: orthogonalising each
  rank-r factor's update does not orthogonalise the update of the product B A that Muon is
  about, so a LoRA run has no Muon matrix at all (the run config refuses optim.name=muon with
  draft.lora.r > 0).
The frozen copies of the target (`embed_tokens`, `lm_head`) and any other parameter with
requires_grad False appear in neither group.

Distributed: under DDP every rank holds the full, averaged gradient of every matrix, so Muon
runs as on one process. Under FSDP a rank holds only a shard of each matrix and DeepSpeed ZeRO
hands the optimizer flattened 1-D partitions; Newton-Schulz needs the whole matrix, so the
loop refuses both (`check_distribution`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.optim._muon as _torch_muon

from dspark.errors import BadInputError
from dspark.training.precision import cpu_bf16_support

# First components of the parameter names that hold the backbone's hidden matrices.
HIDDEN_MODULES = ("fc", "layers")


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Whether the trainable parameter `name` is one of the matrices Muon trains."""
    return (
        param.ndim == 2
        and name.split(".", 1)[0] in HIDDEN_MODULES
        and "lora_" not in name  # LoRA factors: AdamW (module docstring)
    )


def split_parameters(
    named: Iterable[tuple[str, torch.Tensor]],
) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
    """(Muon's, AdamW's) trainable (name, parameter) pairs, in the model's order."""
    muon: list[tuple[str, torch.Tensor]] = []
    adamw: list[tuple[str, torch.Tensor]] = []
    for name, p in named:
        if p.requires_grad:
            (muon if is_hidden_matrix(name, p) else adamw).append((name, p))
    return muon, adamw


def newton_schulz(
    grad: torch.Tensor,
    ns_coefficients: tuple[float, float, float],
    ns_steps: int,
    eps: float,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz iteration, operation for operation, in `dtype`.

    torch always iterates in bf16, which is cheap on GPUs and on CPUs with native bf16 (AVX-512
    BF16 / AMX) but falls back to a scalar kernel elsewhere: a 2-layer SmolLM2 draft's Muon
    step took ~45 s on an AVX2-only CPU against ~1.3 s for the whole AdamW step. In fp32 the
    same iteration costs milliseconds there and is closer to the exact one, not further.
    `grad` [rows, cols] -> the orthogonalised update, same shape, in `dtype`."""
    a, b, c = ns_coefficients
    x = grad.to(dtype)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def newton_schulz_dtype(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> torch.dtype:
    """bf16 (torch's own choice) where bf16 matmuls are native, fp32 on CPUs without it."""
    if device.type != "cpu":
        return torch.bfloat16

    return torch.bfloat16 if cpu_bf16_support(cpuinfo)["bf16"] else torch.float32


@contextlib.contextmanager
def _iterate_in(dtype: torch.dtype) -> Iterator[None]:
    """torch.optim.Muon's step with its Newton-Schulz iteration run in `dtype`: the step looks
    the iteration up in its module at call time, so everything else (momentum, Nesterov, the
    shape scale, weight decay) stays torch's."""
    name = "_zeropower_via_newtonschulz"
    if dtype == torch.bfloat16 or not hasattr(_torch_muon, name):
        yield
        return
    own = getattr(_torch_muon, name)

    def in_dtype(grad, ns_coefficients, ns_steps, eps):
        return newton_schulz(grad, ns_coefficients, ns_steps, eps, dtype)

    setattr(_torch_muon, name, in_dtype)
    try:
        yield
    finally:
        setattr(_torch_muon, name, own)


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer (as Accelerate, the LR scheduler and the checkpoints expect) made of an
    AdamW and a Muon over disjoint parameters.

    `param_groups` are the parts' own group dicts, AdamW's first (so the loop's logged
    `get_last_lr()[0]` stays the AdamW lr), and `state` is one dict both parts write, so the
    scheduler's per-group lr reaches both and the standard `state_dict` holds both parts'
    state (AdamW's moments and step, Muon's momentum buffers) with each group's settings."""

    def __init__(
        self,
        adamw: torch.optim.AdamW,
        muon: torch.optim.Muon,
        ns_dtype: torch.dtype | None = None,
    ) -> None:
        self.adamw, self.muon = adamw, muon
        # None: by the device of Muon's first matrix (newton_schulz_dtype)
        params = [p for g in muon.param_groups for p in g["params"]]
        self.ns_dtype = ns_dtype or newton_schulz_dtype(params[0].device)
        # add_param_group keeps each dict it is given, so the groups stay shared with the parts
        super().__init__([*adamw.param_groups, *muon.param_groups], defaults={})
        self._share()

    def _share(self) -> None:
        """Point the parts at this optimizer's groups and state (again after a load, which
        replaces both)."""
        n = len(self.adamw.param_groups)
        self.adamw.param_groups = self.param_groups[:n]
        self.muon.param_groups = self.param_groups[n:]
        # a defaultdict keyed by parameter; the parts' parameters are disjoint
        self.adamw.state = self.muon.state = self.state

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.adamw.step()
        with _iterate_in(self.ns_dtype):
            self.muon.step()
        return loss


def check_distribution(distributed_type: str) -> None:
    """Refuse optim.name=muon where the optimizer would not see whole matrices (docstring)."""
    if distributed_type in ("FSDP", "DEEPSPEED"):
        raise BadInputError(
            f"optim.name=muon needs each hidden weight matrix whole on every rank, and "
            f"{distributed_type} shards them: launch with DDP (conf/accelerate/ddp.yaml; "
            "target.shard=true still shards the frozen target), or use optim.name=adamw"
        )
