"""Batch collation for the tokenized training set (see docs/contracts.md)."""

from __future__ import annotations

import torch

FEATURE_KEYS = ("tapped", "final_hidden")  # cached target features, [n, D] per row
# per-position summaries of the target's logits beside a cache ([n] per row, zero-padded)
SUMMARY_KEYS = ("final_logsumexp", "final_argmax")


class PadCollator:
    """Right-pad rows of `input_ids` / `loss_mask` into `[B, S]` long tensors.

    Returns `{"input_ids", "attention_mask", "loss_mask"}`; pads get `pad_token_id`,
    attention 0 and loss mask 0. `max_length` truncates longer rows; `pad_to_multiple_of`
    rounds S up (e.g. 8 or 64 for tensor cores / static shapes). Rows that carry cached target
    features (`FEATURE_KEYS`, each `[n, D]`) get them truncated and zero-padded the same way,
    to `[B, S, D]` in their own dtype; their per-position summaries (`SUMMARY_KEYS`, `[n]`)
    to `[B, S]`.

    Packed rows (`dspark.data.packing.PackedDataset`) also carry `document_ids` and
    `position_ids`: they come out as `[B, S]` long too, pads get document -1 and position 0.
    """

    PACKED_KEYS = {"document_ids": -1, "position_ids": 0}  # key -> pad value

    def __init__(
        self,
        pad_token_id: int,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
    ):
        if pad_token_id is None:
            raise ValueError("PadCollator needs a pad_token_id (the tokenizer's pad or eos id)")
        self.pad_token_id = int(pad_token_id)
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("PadCollator got an empty batch")
        seqs = [self._as_list(f["input_ids"]) for f in features]
        masks = [self._as_list(f["loss_mask"]) for f in features]
        if self.max_length is not None:
            seqs = [s[: self.max_length] for s in seqs]
            masks = [m[: self.max_length] for m in masks]
        width = max(len(s) for s in seqs)
        if self.pad_to_multiple_of:
            mult = self.pad_to_multiple_of
            width = (width + mult - 1) // mult * mult
        packed = [k for k in self.PACKED_KEYS if k in features[0]]
        extra = {k: [self._as_list(f[k])[: len(s)] for f, s in zip(features, seqs)] for k in packed}
        b = len(seqs)
        input_ids = torch.full((b, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((b, width), dtype=torch.long)
        loss_mask = torch.zeros((b, width), dtype=torch.long)
        for i, (s, m) in enumerate(zip(seqs, masks)):
            if len(s) != len(m):
                raise ValueError(f"row {i}: input_ids ({len(s)}) and loss_mask ({len(m)}) differ")
            n = len(s)
            input_ids[i, :n] = torch.as_tensor(s, dtype=torch.long)
            attention[i, :n] = 1
            loss_mask[i, :n] = torch.as_tensor(m, dtype=torch.long)
        out = {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}
        for key in (*FEATURE_KEYS, *SUMMARY_KEYS):  # [n, D] -> [B, S, D]; [n] -> [B, S]
            if key in features[0]:
                rows = [torch.as_tensor(f[key])[: len(s)] for f, s in zip(features, seqs)]
                padded = rows[0].new_zeros((b, width, *rows[0].shape[1:]))
                for i, r in enumerate(rows):
                    padded[i, : len(r)] = r
                out[key] = padded
        for k in packed:
            t = torch.full((b, width), self.PACKED_KEYS[k], dtype=torch.long)
            for i, row in enumerate(extra[k]):
                if len(row) != len(seqs[i]):
                    raise ValueError(f"row {i}: {k} ({len(row)}) and input_ids differ in length")
                t[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
            out[k] = t
        return out

    @staticmethod
    def _as_list(x):
        return x.tolist() if hasattr(x, "tolist") else list(x)
