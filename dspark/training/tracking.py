"""Metrics sinks, all through Accelerate's trackers (`Accelerator(log_with=...)`, one
`accelerator.log` call per record): the local JSONL log (`metrics.jsonl`, always written, so a
run is readable with no account at all) plus one optional service chosen in `conf/tracking/`:
W&B (offline without an API key), TensorBoard, Trackio or MLflow.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from accelerate.tracking import GeneralTracker, on_main_process
from accelerate.utils import (
    is_mlflow_available,
    is_tensorboard_available,
    is_trackio_available,
    is_wandb_available,
)

from dspark.errors import MissingPackageError
from dspark.fileio import dumps_strict

# tracking.backend -> the pip package Accelerate's tracker of that name needs.
BACKENDS = {
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "trackio": "trackio",
    "mlflow": "mlflow",
}


class JsonlTracker(GeneralTracker):
    """Append-only metrics log, one JSON object per `accelerator.log` call, main process only.

    Each line is `{"time": unix seconds, **values}` (`values` carry their own `step`).
    """

    name = "jsonl"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = Path(path)

    @on_main_process
    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def tracker(self) -> Path:
        return self.path

    def store_init_configuration(self, values: dict) -> None:
        """Nothing: the loop writes the run config to `run_config.json` itself."""

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        record = {"time": round(time.time(), 3), **values}
        if step is not None:
            record.setdefault("step", step)
        with self.path.open("a") as f:
            f.write(dumps_strict(record) + "\n")  # NaN -> null: strict readers reject NaN


def wandb_mode(mode: str) -> str:
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _backend(cfg) -> str | None:
    """The service tracker's Accelerate name, or None (`tracking=none`, or W&B disabled)."""
    if cfg.backend == "none" or (cfg.backend == "wandb" and wandb_mode(cfg.mode) == "disabled"):
        return None
    return cfg.backend


def trackers(cfg, output_dir: Path) -> list:
    """`log_with` for the Accelerator: the JSONL tracker, plus the chosen service.

    Accelerate skips a tracker whose package is missing with only a debug log; a run asked
    to log to TensorBoard must not silently log nowhere, so a missing package is an error.
    """
    out: list = [JsonlTracker(Path(output_dir) / "metrics.jsonl")]
    backend = _backend(cfg)
    if backend is not None:
        available = {
            "wandb": is_wandb_available,
            "tensorboard": is_tensorboard_available,
            "trackio": is_trackio_available,
            "mlflow": is_mlflow_available,
        }[backend]()
        if not available:
            raise MissingPackageError(
                f"tracking={backend} needs the `{BACKENDS[backend]}` package: "
                f"pip install {BACKENDS[backend]}, or train with tracking=none"
            )
        out.append(backend)
    return out


def flat_config(config: dict, prefix: str = "") -> dict:
    """`{"optim": {"lr": 1e-3}}` -> `{"optim.lr": 1e-3}`, lists and None as text: TensorBoard's
    hparams and MLflow's params take scalars only."""
    out: dict = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            keep = isinstance(value, (bool, int, float, str))
            out[f"{prefix}{key}"] = value if keep else str(value)
    return out


def init_tracking(accelerator, cfg, output_dir: Path, run_config: dict) -> None:
    """Start every tracker of `trackers(cfg, ...)` (passed to the Accelerator as `log_with`)."""
    if _backend(cfg) not in (None, "wandb"):  # W&B keeps the nested config (its UI nests it)
        run_config = flat_config(run_config)
    name = cfg.run_name
    init_kwargs = {
        "wandb": {"mode": wandb_mode(cfg.mode), "name": name, "dir": str(output_dir)},
        "trackio": {"name": name} if name else {},
        "mlflow": {"run_name": name} if name else {},
    }
    # TensorBoard writes to <output_dir>/<project>/ (Accelerate's logging_dir = project_dir).
    accelerator.init_trackers(cfg.project, config=run_config, init_kwargs=init_kwargs)
