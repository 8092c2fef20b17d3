"""Distill a DSpark draft against a frozen target.

accelerate launch train/distill.py recipe=quickstart
accelerate launch train/distill.py recipe=debug draft=dflash optim.lr=1e-3
python train/distill.py -m recipe=debug draft.markov_rank=0,64
"""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from dspark.training.schema import check, register_configs  # noqa: E402

register_configs()


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    check(cfg)
    from dspark.training.loop import run

    if int(os.environ.get("RANK", "0")) == 0:
        print(OmegaConf.to_yaml(cfg, resolve=True))
    results = run(cfg)
    return float(results["final_eval"].get("eval/loss", float("nan")))  # for sweepers


if __name__ == "__main__":
    main()
