"""One target forward over a static `TargetKVCache`, shared by speculative and AR decoding.

Fast path (Llama / Qwen2 / Qwen3 / Mistral-shaped HF models): embed, rotary, the decoder
layers with our own 4-D mask and cache, final norm; the tapped layers' raw outputs are the
layer outputs themselves (= HF `hidden_states[i + 1]`), logits only where asked. Other
models go through the HF forward with `output_hidden_states=True` and the same cache/mask.
"""

from __future__ import annotations

import torch

from dspark.decoding.cache import TargetKVCache, causal_mask, row_kv_lengths
from dspark.decoding.cpu_paths import matvec_head_logits
from dspark.decoding.row_attention import base_attention_of, dispatching_rows, exact_rows_for
from dspark.decoding.row_linear import dispatching_row_linears, row_dependent_linears

FAST_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def head_logits(head, hidden: torch.Tensor, cpu_fast_paths: bool = True) -> torch.Tensor:
    """`head(hidden)` in fp32; with `cpu_fast_paths`, the CPU matrix-vector form where it
    applies (`cpu_paths.matvec_head_logits`); GPUs keep `F.linear` either way."""
    if cpu_fast_paths:
        logits = matvec_head_logits(head, hidden)
        if logits is not None:
            return logits
    return head(hidden).float()


class TargetRunner:
    def __init__(
        self,
        model,
        tap_ids: list[int] | tuple[int, ...] = (),
        fast: bool | None = None,
        cpu_fast_paths: bool = True,
        exact_rows: bool | None = None,
    ):
        self.model = model
        self.cpu_fast_paths = cpu_fast_paths  # the CPU lm_head path (cpu_paths.py)
        # row-exact batch-1 passes as asked (None: the default for the device and dtype)
        self.exact_rows_asked, self.compiled = exact_rows, False
        self.tap_ids = list(tap_ids)
        self.num_layers = model.config.num_hidden_layers
        base = getattr(model, "model", None)
        if fast is None:
            fast = (
                model.config.model_type in FAST_MODEL_TYPES
                and base is not None
                and all(hasattr(base, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm"))
            )
        self.fast = fast
        impl = getattr(model.config, "_attn_implementation", "sdpa")
        self.mask_dtype = None if impl in ("sdpa", None) else next(model.parameters()).dtype
        self._row_base: tuple[str | None, object] | None = None  # (implementation, its function)
        self._core = self._fast_core if fast else self._hf_core

    def compile(self, **kwargs):
        self._core = torch.compile(self._core, **kwargs)
        self.compiled = True  # row-exact dispatch sits outside a compiled graph: off by default

    @property
    def exact_rows(self) -> bool:
        """Whether batch-1 passes run row-exact (row_attention.py): as asked, else the default
        for the target's device and its dtype now."""
        return exact_rows_for(self.model, self.exact_rows_asked, self.compiled)

    def row_kv_lens(
        self, positions: list[int], n: int, kv_bucket: int, cap: int
    ) -> list[int] | None:
        """For a pass of `n` tokens from each row's `positions`: where it runs row-exact (one
        row, n > 1, `exact_rows`), the KV length each query row attends, as the 1-token step at
        its position would (`forward(row_kv_lens=)`); else None (one batched pass)."""
        if n > 1 and len(positions) == 1 and self.exact_rows:
            return row_kv_lengths(positions[0], n, kv_bucket, cap)
        return None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: TargetKVCache,
        kv_len: int,
        start: int | None = None,
        tapped: bool = False,
        logits_at: torch.Tensor | None = None,
        row_kv_lens: list[int] | None = None,
    ):
        """Run `input_ids [B, n]` at `positions [B, n]`, writing K/V into `cache`.

        Returns `(logits, tapped)`: logits `[B, n, V]` (or `[B, V]` at the per-row indices
        `logits_at [B]`), fp32; tapped `[B, n, len(tap_ids) * H]` or None.
        `row_kv_lens [n]`: attend one query row at a time, row i to the first `row_kv_lens[i]`
        slots (row_attention.py), and run the linear layers this CPU rounds by row count one
        row at a time (row_linear.py): each row then computes as a 1-token pass there would.
        """
        cache.prepare(positions, kv_len, start)
        mask = causal_mask(positions, kv_len, self.mask_dtype)
        if row_kv_lens is not None and input_ids.shape[1] > 1:
            rows = {"row_kv_lens": row_kv_lens, "base_attention": self._row_base_attention()}
            linears = row_dependent_linears(self.model, input_ids.shape[1])
            with dispatching_rows(self.model), dispatching_row_linears(linears):
                hidden, taps = self._core(input_ids, positions, mask, cache, tapped, rows)
        else:
            hidden, taps = self._core(input_ids, positions, mask, cache, tapped)
        if logits_at is not None:
            hidden = hidden[torch.arange(hidden.shape[0], device=hidden.device), logits_at]
        logits = head_logits(self.model.lm_head, hidden, self.cpu_fast_paths)
        return logits, taps

    def _row_base_attention(self):
        """The attention the layers run now, run per row (row_attention.py); looked up again
        only when the model's implementation changes (eager's lookup walks the modules)."""
        impl = getattr(self.model.config, "_attn_implementation", None)
        if self._row_base is None or self._row_base[0] != impl:
            self._row_base = (impl, base_attention_of(self.model))
        return self._row_base[1]

    def _fast_core(self, input_ids, positions, mask, cache, tapped, attn_kwargs=None):
        base = self.model.model
        h = base.embed_tokens(input_ids)
        rope = base.rotary_emb(h, positions)
        taps = {}
        tapped = tapped and bool(self.tap_ids)
        want = set(self.tap_ids) if tapped else ()
        for i, layer in enumerate(base.layers[: self.num_layers]):
            h = layer(
                h,
                attention_mask=mask,
                position_embeddings=rope,
                position_ids=positions,
                cache=cache,
                **(attn_kwargs or {}),
            )
            if isinstance(h, tuple):
                h = h[0]
            if i in want:
                taps[i] = h
        h = base.norm(h)
        if tapped and self.num_layers - 1 in want:  # HF's hidden_states[-1] is post-norm
            taps[self.num_layers - 1] = h
        feats = torch.cat([taps[i] for i in self.tap_ids], dim=-1) if tapped else None
        return h, feats

    def _hf_core(self, input_ids, positions, mask, cache, tapped, attn_kwargs=None):
        out = self.model.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            output_hidden_states=tapped,
            **(attn_kwargs or {}),
        )
        feats = None
        if tapped:
            feats = torch.cat([out.hidden_states[i + 1] for i in self.tap_ids], dim=-1)
        return out.last_hidden_state, feats
