"""The 512-token report's figures against hand computation."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "long_answers", Path(__file__).resolve().parents[1] / "eval" / "long_answers.py"
)
la = importlib.util.module_from_spec(spec)
spec.loader.exec_module(la)


def test_figures_by_hand():
    ar = la.summarize([{"wall_s": 10.0, "cpu_s": 20.0, "tokens": 500},
                       {"wall_s": 6.0, "cpu_s": 12.0, "tokens": 300}])  # fmt: skip
    spec_ = la.summarize([{"wall_s": 5.0, "cpu_s": 12.0, "tokens": 500},
                          {"wall_s": 3.0, "cpu_s": 6.0, "tokens": 300}])  # fmt: skip
    assert ar["latency_s_mean"] == 8.0 and ar["tokens_per_s"] == 50.0
    assert ar["cpu_s_per_token"] == pytest.approx(32 / 800)
    f = la.compare(ar, spec_, {"target_mb": 500.0, "draft_mb": 80.0})
    assert f["latency_change"] == pytest.approx(-0.5) and f["throughput_ratio"] == 2.0
    assert f["cpu_per_token_change"] == pytest.approx(18 / 32 - 1)
    assert f["memory_change"] == pytest.approx(0.16)
    assert la.rss_mb() > 0
