"""pyplot for the PNGs that reports write, on its file-only backend (Agg): reports run on
machines without a display, and the backend must be chosen before pyplot first loads."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt"]
