"""Linear layers of an n-token target pass computed one row at a time where the CPU's GEMM
rounds n rows unlike one (exact verification, beside row_attention.py).

A CPU BLAS runs one row as a matrix-vector product and n rows as a GEMM; in bf16 the two can
sum the K axis in another order, and the rounded output then differs by an ulp in some rows.
Measured on an AMD EPYC with AVX-512-BF16 (no AMX), torch 2.13.0: SmolLM2's `down_proj`
(1536 -> 576) differed from the 1-row call in ~6-8% of rows at n = 2-5, its K = 576 layers in
none; with only that layer run per row the verify pass equalled the 1-token steps bit for bit.

`row_dependent_linears(model, n)` finds those layers by measuring: for each distinct kind of
linear layer in the target (class, shape, layout, dtype; the head aside), seeded random rows
through one of its modules as n rows and one by one (`trials` times). The probe runs on the
first pass of each length n (50-110 ms for SmolLM2), then its verdict is looked up.
`dispatching_row_linears` runs the flagged modules per row within a block: row i calls the
module on that row alone, as the 1-token step does. Elsewhere the batched GEMM stays, so a CPU
whose GEMM is row-independent pays nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# model -> {n: flagged modules}; weak keys, so a dropped target frees its entry
_FLAGGED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _shape_key(mod: torch.nn.Linear) -> tuple:
    w = mod.weight
    # what picks the kernel: the module's code, the weight's shape, layout and dtype
    return (type(mod), mod.in_features, mod.out_features, w.dtype, w.device, w.stride(),
            mod.bias is None)  # fmt: skip


def differs_by_rows(mod: torch.nn.Linear, n: int, trials: int = 16) -> bool:
    """Whether `mod` on `n` rows `[1, n, K]` gives any row other than `mod` on that row alone
    `[1, 1, K]`, on `trials` seeded random inputs in the module's dtype."""
    param = next(mod.parameters())
    gen = torch.Generator().manual_seed(n)
    with torch.inference_mode():
        for _ in range(trials):
            x = torch.randn(1, n, mod.in_features, generator=gen).to(param.device, param.dtype)
            many = mod(x)
            for i in range(n):
                if not torch.equal(many[:, i : i + 1], mod(_own(x[:, i : i + 1]))):
                    return True
    return False


def row_dependent_linears(model, n: int, trials: int = 16) -> list[torch.nn.Module]:
    """The `nn.Linear` modules of `model` but its head whose n-row output differs from their
    1-row output here (`differs_by_rows` on one module per kind, `_shape_key`), measured once per
    model and n. The head is left out: cpu_paths.py computes its rows as one matrix product."""
    flagged: dict[int, list[torch.nn.Module]] = _FLAGGED.setdefault(model, {})
    if n not in flagged:
        head = model.get_output_embeddings()
        groups: dict[tuple, list[torch.nn.Linear]] = {}
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear) and mod is not head:
                groups.setdefault(_shape_key(mod), []).append(mod)
        flagged[n] = [
            mod for mods in groups.values() if differs_by_rows(mods[0], n, trials) for mod in mods
        ]
    return flagged[n]


def _own(row: torch.Tensor) -> torch.Tensor:
    return row.clone(memory_format=torch.contiguous_format)


def _per_row(forward):
    def run(x: torch.Tensor) -> torch.Tensor:  # x [B, n, K] -> [B, n, N]
        if x.shape[-2] == 1:
            return forward(x)
        # each row as a tensor of its own strides [K, K, 1], as the 1-token step passes it:
        # a view (or a stride-preserving clone) keeps x's row stride n*K, which sent the bf16
        # matrix-vector call down a 7x slower path on the EPYC above
        rows = [_own(x[..., i : i + 1, :]) for i in range(x.shape[-2])]
        return torch.cat([forward(row) for row in rows], -2)

    return run


@contextmanager
def dispatching_row_linears(modules: list[torch.nn.Module]) -> Iterator[None]:
    """Within the block, each of `modules` computes its input's rows one at a time."""
    before = [mod.__dict__.get("forward") for mod in modules]  # an instance's own (hooks)
    for mod in modules:
        mod.forward = _per_row(mod.forward)
    try:
        yield
    finally:
        for mod, fwd in zip(modules, before):
            if fwd is None:
                del mod.forward  # back to the class's forward
            else:
                mod.forward = fwd
