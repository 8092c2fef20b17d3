"""Distill a DSpark draft against a frozen target (console script: `dspark-distill`).

accelerate launch train/distill.py recipe=quickstart
accelerate launch train/distill.py recipe=debug draft=dflash optim.lr=1e-3
python train/distill.py -m recipe=debug draft.markov_rank=0,16

Keys and defaults: dspark/training/schema.py; the Hydra main: dspark/cli.py (`distill`).
"""

from pathlib import Path

from dspark.cli import distill

if __name__ == "__main__":
    distill(Path(__file__).resolve().parents[1])
