"""Metrics sinks: W&B through Accelerate's trackers (offline without an API key), and a local
JSONL file that is always written so a run is readable with no account at all."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def wandb_mode(mode: str) -> str:
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def init_tracking(accelerator, cfg, output_dir: Path, run_config: dict) -> None:
    if cfg.backend == "none" or wandb_mode(cfg.mode) == "disabled":
        return
    accelerator.init_trackers(
        cfg.project,
        config=run_config,
        init_kwargs={
            "wandb": {"mode": wandb_mode(cfg.mode), "name": cfg.run_name, "dir": str(output_dir)}
        },
    )


class JsonlLog:
    """Append-only metrics log (`metrics.jsonl`), main process only."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")
