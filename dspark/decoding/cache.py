"""Static, position-indexed KV caches (gpt-fast style) for the target and the draft context.

Slot s of row b holds the token at position s of request b: no left padding, no copies on
rejection. A forward at positions `pos [B, n]` writes its K/V at those slots and attends to
slots `<= pos` (the causal mask), so stale slots from rejected drafts are never read: the next
round starts writing at the new anchor position, and every slot below the anchor has been
rewritten with committed tokens. "Cropping" is just moving the per-row anchor position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def bucket(n: int, size: int, cap: int) -> int:
    """Round `n` up to a multiple of `size` (fewer distinct shapes), at most `cap`."""
    return min(cap, -(-n // size) * size)


def right_padded(prompts: Sequence[Sequence[int]], device) -> tuple:
    """`(ids [B, W], positions [B, W], lengths)` of prompts right-padded with 0 to the longest
    W: token j of each row sits at position (slot) j."""
    lens = [len(p) for p in prompts]
    ids = torch.zeros((len(prompts), max(lens)), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p, dtype=torch.long)
    pos = torch.arange(ids.shape[1], device=device)[None].expand(ids.shape)
    return ids.to(device), pos, lens


def row_kv_lengths(first: int, n: int, size: int, cap: int) -> list[int]:
    """The KV length a 1-token step attends at each of positions `first .. first + n - 1`
    (`bucket(pos + 1)`): what a row-exact pass gives each of its n rows (row_attention.py)."""
    return [bucket(first + i + 1, size, cap) for i in range(n)]


def causal_mask(positions: torch.Tensor, kv_len: int, dtype: torch.dtype | None = None):
    """`[B, 1, n, kv_len]` mask: query at positions[b, i] sees slots `<= positions[b, i]`.

    Bool (True = attend) for SDPA, or additive float when `dtype` is given (eager attention).
    """
    slots = torch.arange(kv_len, device=positions.device)
    mask = slots[None, None, None, :] <= positions[:, None, :, None]
    if dtype is None:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min
    )


def _move_rows(buffers: list[torch.Tensor], moves: list[tuple[int, int, int]]) -> None:
    """`buf[dst, :, :n] = buf[src, :, :n]` for each `(dst, src, n)`, in order, every buffer."""
    for dst, src, n in moves:
        for buf in buffers:
            buf[dst, :, :n].copy_(buf[src, :, :n])


class _Writer:
    """Writes `[B, h, n, d]` states into a `[B, h, S, d]` buffer at per-row positions `[B, n]`."""

    def __init__(self):
        self.positions = None
        self.start = None  # int when every row writes the same contiguous slots
        self._rows = None  # [B, 1]: the row index beside `positions` [B, n]

    def set_positions(self, positions: torch.Tensor, start: int | None):
        self.positions, self.start = positions, start
        if start is None:
            self._rows = torch.arange(positions.shape[0], device=positions.device)[:, None]

    def write(self, buf: torch.Tensor, states: torch.Tensor):
        n = states.shape[2]
        if self.start is not None:
            buf[:, :, self.start : self.start + n].copy_(states)
            return
        # Advanced indexing (index_put_) writes only the `B * n` slots; `scatter_` along dim 2
        # took as long for one token as for many on the CPU, far longer than the write itself
        # (docs/results.md, "Decoder internals").
        buf[self._rows, :, self.positions] = states.transpose(1, 2)  # [B, n, h, d] slots


class TargetKVCache:
    """The target's KV cache: duck-types the HF `Cache.update` the attention layers call.

    Before each forward the decoder calls `prepare(positions, kv_len, start)`; `update` then
    writes the new K/V at `positions` and returns the first `kv_len` slots.
    """

    is_compileable = True

    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device,
        v_head_dim: int | None = None,
    ):
        shape = (batch, num_kv_heads, max_len, head_dim)
        vshape = (batch, num_kv_heads, max_len, v_head_dim or head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(vshape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.batch = batch
        self.kv_len = max_len
        self._writer = _Writer()

    @classmethod
    def for_model(cls, model, batch: int, max_len: int):
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        param = next(model.parameters())
        return cls(
            cfg.num_hidden_layers, batch, kv_heads, head_dim, max_len, param.dtype, param.device
        )

    def fits(self, batch: int, max_len: int) -> bool:
        return batch == self.batch and max_len <= self.max_len

    def _with(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> TargetKVCache:
        """A cache over the given per-layer buffers (rows = their batch size), same length."""
        new = object.__new__(TargetKVCache)
        new.keys, new.values = keys, values
        new.max_len, new.batch, new.kv_len = self.max_len, keys[0].shape[0], self.kv_len
        new._writer = _Writer()
        return new

    def select(self, rows: torch.Tensor) -> TargetKVCache:
        """A new cache holding only batch rows `rows` (a gather; this cache is unchanged)."""
        return self._with(
            [k.index_select(0, rows) for k in self.keys],
            [v.index_select(0, rows) for v in self.values],
        )

    def compact(self, moves: list[tuple[int, int, int]], rows: int) -> TargetKVCache:
        """Drop finished rows in place: for each `(dst, src, n)` copy row `src`'s first `n`
        slots onto row `dst` (in order), then return a cache of the first `rows` rows (views of
        this cache's storage). Only moved rows are copied, where `select` gathers every live
        row's whole slab; this cache's rows are overwritten, so a caller that keeps a finished
        row copies it first (`select`)."""
        _move_rows(self.keys + self.values, moves)
        return self.rows(0, rows)

    def rows(self, start: int, stop: int) -> TargetKVCache:
        """A cache over batch rows `start .. stop - 1`: views of this cache's storage, so what a
        forward writes through it lands here (continuous batching prefills admitted requests
        into the free rows after the live ones this way)."""
        return self._with([k[start:stop] for k in self.keys], [v[start:stop] for v in self.values])

    def prepare(self, positions: torch.Tensor, kv_len: int, start: int | None = None):
        self.kv_len = kv_len
        self._writer.set_positions(positions, start)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self._writer.write(self.keys[layer_idx], key_states)
        self._writer.write(self.values[layer_idx], value_states)
        return (
            self.keys[layer_idx][:, :, : self.kv_len],
            self.values[layer_idx][:, :, : self.kv_len],
        )

    # what HF's generic forward may ask of a cache
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self):
        return len(self.keys)


class DraftContextCache:
    """Per draft layer K/V of the projected target context, slot = position.

    `write(kv, positions)` stores `context_kv(...)` outputs; `view(n)` gives the first `n`
    slots as the `ctx_kv` list `block_hidden` takes. Which slots a block may see is the
    caller's `ctx_valid` (slot < anchor position).
    """

    def __init__(self, batch: int, max_len: int):
        self.batch, self.max_len = batch, max_len
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._writer = _Writer()

    def fits(self, batch: int, max_len: int) -> bool:
        return batch == self.batch and max_len <= self.max_len

    def write(
        self,
        kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        positions: torch.Tensor,
        start: int | None = None,
    ):
        if not self.keys:  # allocate on first use: dtype / heads come from the draft
            for k, v in kv:
                self.keys.append(k.new_zeros((self.batch, k.shape[1], self.max_len, k.shape[3])))
                self.values.append(v.new_zeros((self.batch, v.shape[1], self.max_len, v.shape[3])))
        self._writer.set_positions(positions, start)
        for (k, v), kb, vb in zip(kv, self.keys, self.values):
            self._writer.write(kb, k)
            self._writer.write(vb, v)

    def select(self, rows: torch.Tensor) -> DraftContextCache:
        """A new cache holding only batch rows `rows` (a gather; this cache is unchanged)."""
        new = DraftContextCache(len(rows), self.max_len)
        new.keys = [k.index_select(0, rows) for k in self.keys]
        new.values = [v.index_select(0, rows) for v in self.values]
        return new

    def view(self, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self.keys, self.values)]

    def compact(self, moves: list[tuple[int, int, int]], rows: int) -> DraftContextCache:
        """In-place row moves, then the first `rows` rows: as `TargetKVCache.compact`."""
        _move_rows(self.keys + self.values, moves)
        new = DraftContextCache(rows, self.max_len)
        new.keys = [k[:rows] for k in self.keys]
        new.values = [v[:rows] for v in self.values]
        return new
