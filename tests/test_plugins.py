"""A method plugs in from its own module: an objective (with its own settings) and a Markov head
registered here, in this test file only, train through the real loop on the debug recipe."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from helpers import debug_cfg

from dspark.errors import BadInputError
from dspark.modeling.heads import MARKOV_HEADS, MarkovHead, register_markov_head
from dspark.objectives import (
    OBJECTIVES,
    DSparkObjective,
    ObjectiveBase,
    register_objective,
)

CALLS = {"head": 0}


@register_markov_head("toy_counting")
class CountingMarkovHead(MarkovHead):
    """The vanilla head, counting its teacher-forced passes."""

    def teacher_forced(self, h, prev_tokens):
        CALLS["head"] += 1
        return super().teacher_forced(h, prev_tokens)


@dataclass
class ToySettings:
    scale: float = 0.5
    anchors: int = 4


@register_objective("toy_scaled", settings=ToySettings)
class ToyScaledObjective(ObjectiveBase):
    """DSpark's loss times `scale`, with metrics of its own."""

    count_metrics = ("toy_tokens",)
    progress_metrics = ("loss", "toy_loss")
    curve_metrics = ("toy_loss",)

    def __init__(self, target, draft_config, scale: float = 0.5, anchors: int = 4) -> None:
        self.scale = scale
        self.inner = DSparkObjective(target, draft_config, num_anchors=anchors)

    def _metrics(self, loss, m: dict) -> dict:
        return {
            "loss": self.scale * float(m["loss"]),
            "toy_loss": self.scale * float(loss),
            "toy_scale": self.scale,
            "toy_tokens": float(m["supervised_tokens"]),
        }

    def step(self, draft, batch, reducer=None):
        loss, m = self.inner.step(draft, batch, reducer)
        return self.scale * loss, self._metrics(loss.detach(), m)

    def evaluate(self, draft, batch, reducer=None):
        m = self.inner.evaluate(draft, batch, reducer)
        return self._metrics(m["loss"], m)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


def _rows(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_registered_here_only():
    assert "toy_scaled" in OBJECTIVES and "toy_counting" in MARKOV_HEADS
    assert ToyScaledObjective.name == "toy_scaled"
    assert CountingMarkovHead.head_type == "toy_counting"


def test_a_toy_objective_and_head_train_through_the_loop(tmp_path, debug_data):
    from dspark.training.loop import run

    cfg = debug_cfg(
        tmp_path / "run",
        debug_data,
        "objective=toy_scaled",
        "objective.scale=0.25",
        "draft.markov_head_type=toy_counting",
        "trainer.max_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.save_every=0",
    )
    assert dict(cfg.objective) == {"name": "toy_scaled", "scale": 0.25, "anchors": 4}
    CALLS["head"] = 0
    results = run(cfg)
    assert CALLS["head"] >= 3  # the draft's Markov head is the toy one
    rows = _rows(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["train/toy_scale"] == 0.25 and "train/toy_loss" in r for r in train)
    final = results["final_eval"]
    assert final["eval/toy_scale"] == pytest.approx(0.25) and final["eval/toy_tokens"] > 0
    assert results["curve_metrics"] == ["toy_loss"]
    assert results["train_seconds"] > 0
    saved = json.loads((tmp_path / "run" / "draft" / "config.json").read_text())
    assert saved["markov_head_type"] == "toy_counting"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("+objective.scael=1", "objective.scael is not a key of objective 'toy_scaled'.*'objective.scale'"),
        ("objective.scale=abc", "objective.scale='abc' .objective 'toy_scaled'.: .*Float"),
    ],
)  # fmt: skip
def test_a_toy_objective_key_is_checked(tmp_path, override, needle):
    with pytest.raises(BadInputError, match=needle):
        debug_cfg(tmp_path, tmp_path / "data", "objective=toy_scaled", override)


def test_a_misspelt_dspark_key_is_one_error(tmp_path):
    with pytest.raises(BadInputError, match="Did you mean 'objective.ce_weight'"):
        debug_cfg(tmp_path, tmp_path / "data", "+objective.ce_wieght=1")
    with pytest.raises(BadInputError, match="objective.l1_weight=-1.0 is out of range"):
        debug_cfg(tmp_path, tmp_path / "data", "objective.l1_weight=-1")
