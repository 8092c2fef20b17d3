"""SPS(B): verify steps per second at token batch B, measured or from a roofline model.

The decoder's verify pass is a padded `[rows, width]` tensor (rows = live requests, width =
1 + drafts verified), so a profile is a grid of step times `t(rows, width)`; the scheduler's
1-D table for R live requests is `SPS(B) = 1 / t(R, B / R)` (fractional widths interpolated),
i.e. the price of B verify tokens spread over R requests. A measured profile also holds the
draft's round time `t_draft(rows)` (the simulator's other half).

Profiles are cached per device, target and dtype under `$DSPARK_CACHE/sps/` (JSON, atomic
writes), and per draft vocabulary size when the draft's is reduced (its round scores K rows,
not V, so a full draft's round times would overprice it); `eval/profile_sps.py` profiles and
plots one. `draft_weight_bytes(draft)` sizes the weights one draft round reads, for a
`Roofline`. Measured step (`dspark.decoding.round_cost`) = target forward with the
tapped features and logits of every position, the argmax the verifier takes, and the draft's
`context_kv` of the new features: what one verify round costs besides drafting and host
bookkeeping.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dspark.decoding.draft_vocab import DraftVocab
from dspark.decoding.round_cost import RoundBench
from dspark.locking import read_or_compute
from dspark.machine import device_kind
from dspark.paths import cache_root

PROFILE_VERSION = 1


class StaleProfileError(ValueError):
    """A profile of another PROFILE_VERSION: its grid may not mean what this code reads."""


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends (floored at 0)."""
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class SPSProfile:
    """Step times `times[i][j]` (seconds) of a verify pass of shape `[rows[i], widths[j]]`.

    `draft_times[i]` (seconds, optional) is one draft round at `rows[i]` requests.
    `meta` names the conditions (device, target, dtype, threads, context length, source).
    """

    rows: list[int]
    widths: list[int]
    times: list[list[float]]
    draft_times: list[float] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if sorted(self.rows) != list(self.rows) or sorted(self.widths) != list(self.widths):
            raise ValueError("profile rows and widths must be increasing")
        if len(self.times) != len(self.rows) or any(len(t) != len(self.widths) for t in self.times):
            raise ValueError("profile times must be a [len(rows), len(widths)] grid")
        self._tables: dict = {}

    # -- lookups --------------------------------------------------------------------------
    def step_time(self, rows: float, width: float) -> float:
        """Seconds for one verify pass of `rows` requests x `width` tokens (interpolated)."""
        per_row = [_interp(self.widths, t, width) for t in self.times]
        return _interp(self.rows, per_row, rows)

    def draft_time(self, rows: float) -> float:
        if not self.draft_times:
            return 0.0
        return _interp(self.rows, self.draft_times, rows)

    def sps(self, tokens: float, rows: int) -> float:
        """Verify steps per second at token batch `tokens` spread over `rows` requests."""
        return 1.0 / max(self.step_time(rows, max(1.0, tokens / rows)), 1e-12)

    def table(self, rows: int, gamma: int, device=None) -> torch.Tensor:
        """`sps [rows * (gamma + 1) + 1]` fp32, index = token batch B (the scheduler's input)."""
        key = (rows, gamma, str(device))
        if key not in self._tables:
            vals = [self.sps(max(b, rows), rows) for b in range(rows * (gamma + 1) + 1)]
            self._tables[key] = torch.tensor(vals, dtype=torch.float32, device=device)
        return self._tables[key]

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = asdict(self)
        out["version"] = PROFILE_VERSION
        return out

    @classmethod
    def from_dict(cls, d: dict) -> SPSProfile:
        # a profile written before versioning has none: the grid it holds is version 1's
        version = d.get("version", 1)
        if version != PROFILE_VERSION:
            raise StaleProfileError(
                f"SPS profile version {version}, this dspark reads version {PROFILE_VERSION}"
            )
        return cls(d["rows"], d["widths"], d["times"], d.get("draft_times"), d.get("meta", {}))

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)  # atomic: a reader never sees half a profile
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> SPSProfile:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except StaleProfileError as e:
            raise StaleProfileError(f"{path}: {e}; re-run eval/profile_sps.py") from e
        except (KeyError, json.JSONDecodeError) as e:
            raise ValueError(
                f"{path} is not an SPS profile ({e}); re-run eval/profile_sps.py"
            ) from e


# -- a roofline model for devices one does not have -----------------------------------------
@dataclass
class Roofline:
    """Step time = overhead + max(bytes / bandwidth, flops / peak) per pass (stated inputs).

    bytes = weight_bytes + KV bytes read (rows x context x kv_bytes_per_token); flops =
    2 x params x tokens with params = weight_bytes / bytes_per_param. The draft round is the
    same model with the draft's weights over rows x gamma tokens plus `draft_overhead_s`.
    Example (an 8B bf16 target on an H200): weight_bytes 16e9, hbm_bytes_per_s 4.8e12,
    flops_per_s 990e12, overhead_s 1e-3.
    """

    weight_bytes: float
    hbm_bytes_per_s: float
    flops_per_s: float
    overhead_s: float = 0.0
    bytes_per_param: float = 2.0
    kv_bytes_per_token: float = 0.0
    context_len: int = 0
    draft_weight_bytes: float = 0.0
    draft_overhead_s: float = 0.0
    gamma: int = 7

    def step_time(self, rows: float, width: float, weight_bytes: float | None = None) -> float:
        w = self.weight_bytes if weight_bytes is None else weight_bytes
        tokens = rows * width
        mem = w + rows * (self.context_len + width) * self.kv_bytes_per_token
        flops = 2.0 * (w / self.bytes_per_param) * tokens
        return max(mem / self.hbm_bytes_per_s, flops / self.flops_per_s)

    def profile(self, rows: list[int], widths: list[int], name: str = "roofline") -> SPSProfile:
        times = [[self.overhead_s + self.step_time(r, w) for w in widths] for r in rows]
        drafts = None
        if self.draft_weight_bytes:
            drafts = [
                self.draft_overhead_s + self.step_time(r, self.gamma, self.draft_weight_bytes)
                for r in rows
            ]
        meta = {"source": "roofline", "device": name, **asdict(self)}
        return SPSProfile(list(rows), list(widths), times, drafts, meta)


# -- measuring on this device ---------------------------------------------------------------
def default_rows(max_rows: int = 32) -> list[int]:
    out, r = [], 1
    while r < max_rows:
        out.append(r)
        r *= 2
    return out + [max_rows]


def default_widths(gamma: int) -> list[int]:
    return sorted({1, 2, 3, (gamma + 2) // 2, gamma + 1} - {0})


def device_name(device: torch.device) -> str:
    """The profile's device: a GPU's name, or the CPU's kind and its threads."""
    kind = device_kind(device)
    return kind if device.type == "cuda" else f"{kind}-{torch.get_num_threads()}threads"


def cache_path(
    target_name: str,
    device: torch.device,
    dtype: torch.dtype,
    gamma: int,
    draft_vocab_size: int | None = None,
) -> Path:
    """The profile's cache file; `draft_vocab_size`: K of a reduced draft (None: full V)."""
    key = f"{device_name(device)}__{Path(str(target_name)).name}__{dtype}__g{gamma}"
    if draft_vocab_size is not None:
        key += f"__dv{int(draft_vocab_size)}"
    return cache_root() / "sps" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", key) + ".json")


@torch.inference_mode()
def measure(
    target,
    draft=None,
    *,
    gamma: int | None = None,
    rows: list[int] | None = None,
    widths: list[int] | None = None,
    context_len: int = 256,
    reps: int = 5,
    progress=None,
) -> SPSProfile:
    """Time verify passes `[r, w]` over a static cache holding `context_len` positions (and the
    draft round at each r when `draft` is given); the median of `reps` after one warm-up."""
    if gamma is None:
        gamma = int(draft.config.block_size) if draft is not None else 7
    rows = rows or default_rows()
    widths = widths or default_widths(gamma)
    device = next(target.parameters()).device
    times, draft_times = [], []
    for r in rows:
        bench = RoundBench(
            target, draft, batch=r, context_len=context_len, max_tokens=max(widths), gamma=gamma
        )
        row_times = []
        for w in widths:
            row_times.append(bench.time_verify(w, reps))
            if progress:
                progress(f"verify [{r} x {w}]: {1e3 * row_times[-1]:.1f} ms")
        times.append(row_times)
        if draft is not None:
            draft_times.append(bench.time_draft(reps))
            if progress:
                progress(f"draft round [{r}]: {1e3 * draft_times[-1]:.1f} ms")
    # cost never falls with more rows or tokens: a lower median is timing noise (shared CPUs)
    for i in range(len(rows)):
        for j in range(len(widths)):
            prev = [times[i][j - 1]] if j else []
            prev += [times[i - 1][j]] if i else []
            times[i][j] = max([times[i][j], *prev])
    param = next(target.parameters())
    meta = {
        "source": "measured",
        "smoothing": "running max over rows and widths",
        "device": device_name(device),
        "target": str(getattr(target.config, "_name_or_path", "") or target.config.model_type),
        "dtype": str(param.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "context_len": context_len,
        "gamma": gamma,
        "draft_vocab_size": _draft_vocab_size(draft),
        "reps": reps,
        "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return SPSProfile(rows, widths, times, draft_times or None, meta)


def _draft_vocab_size(draft) -> int | None:
    """K of a reduced draft vocabulary (None: full, or no draft)."""
    vocab = DraftVocab.of(draft) if draft is not None else None
    return vocab.size if vocab is not None else None


def draft_weight_bytes(draft) -> int:
    """Bytes of the weights one draft round streams through matmuls: every parameter except
    the embedding tables (`embed_tokens`, the Markov `markov_w1`), which a round only gathers
    a few rows of. A reduced draft vocabulary counts its K rows of `lm_head` and `markov_w2`.
    `Roofline(draft_weight_bytes=...)` takes it (flops = 2 x these params x tokens)."""
    gathered = {
        id(p)
        for m in draft.modules()
        if isinstance(m, torch.nn.Embedding)
        for p in m.parameters(recurse=False)
    }
    return sum(p.numel() * p.element_size() for p in draft.parameters() if id(p) not in gathered)


def load_or_measure(
    target, draft=None, *, gamma: int, refresh: bool = False, **kwargs
) -> SPSProfile:
    """The cached profile for this device, target, dtype and gamma, measured on first use."""
    param = next(target.parameters())
    name = getattr(target.config, "_name_or_path", "") or target.config.model_type
    vocab = DraftVocab.of(draft) if draft is not None else None
    path = cache_path(name, param.device, param.dtype, gamma, vocab.size if vocab else None)

    def read() -> SPSProfile | None:
        if refresh or not path.exists():
            return None
        try:
            cached = SPSProfile.load(path)
        except StaleProfileError:  # a cache, not a user's file: measured again
            return None
        return cached if draft is None or cached.draft_times else None

    def compute() -> SPSProfile:
        prof = measure(target, draft, gamma=gamma, **kwargs)
        prof.meta["cache_path"] = str(path)
        prof.save(path)
        return prof

    return read_or_compute(path, "the SPS profile cache entry", read, compute)
