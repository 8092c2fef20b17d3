"""STS that ships with the draft: the config key, the decoder applying it, the command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import make_draft

from dspark.calibration import metrics as cal
from dspark.calibration.fit import write_temperatures
from dspark.config import DSparkConfig
from dspark.decoding import DecoderOptions, SpeculativeDecoder, VerifyPolicy

REPO = Path(__file__).resolve().parents[1]


def test_temperatures_round_trip_through_config_json(tiny_target, tmp_path):
    model, tok = tiny_target("qwen3")
    draft = make_draft(model, tok, block_size=3)
    draft.save_pretrained(tmp_path)
    assert DSparkConfig.from_pretrained(tmp_path).confidence_temperatures is None
    write_temperatures(tmp_path, [1.5, 0.7, 2.0])
    assert DSparkConfig.from_pretrained(tmp_path).confidence_temperatures == [1.5, 0.7, 2.0]
    write_temperatures(tmp_path, [1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="confidence_temperatures"):
        DSparkConfig.from_pretrained(tmp_path)
    write_temperatures(tmp_path, None)
    assert "confidence_temperatures" not in json.loads((tmp_path / "config.json").read_text())


def test_decoder_applies_the_drafts_temperatures(tiny_target):
    model, tok = tiny_target("llama")
    draft = make_draft(model, tok, block_size=3).eval().requires_grad_(False)
    temps = [2.0, 0.5, 3.0]
    draft.config.confidence_temperatures = temps
    prompts = [[3, 5, 7, 9], [4, 6]]
    raw = SpeculativeDecoder(
        model, draft, DecoderOptions(policy=VerifyPolicy(calibrate=False))
    ).generate(prompts, 8)
    calibrated = SpeculativeDecoder(model, draft).generate(prompts, 8)
    assert raw.sequences == calibrated.sequences and raw.accept_lengths == calibrated.accept_lengths
    for req_raw, req_cal in zip(raw.confidences, calibrated.confidences):
        for c_raw, c_cal in zip(req_raw, req_cal):
            if not c_raw:  # the last round may verify nothing (token budget)
                continue
            z = cal.to_logits(np.array(c_raw))
            expect = 1 / (1 + np.exp(-z / np.array(temps[: len(c_raw)])))
            np.testing.assert_allclose(c_cal, expect, rtol=1e-4, atol=1e-6)
            assert not np.allclose(c_cal, c_raw)


def test_sts_split_fit_recovers_a_known_temperature():
    rng = np.random.default_rng(0)
    per_request = []
    for _ in range(40):
        z = rng.normal(1.0, 2.0, size=(30, 3))
        true_c = 1 / (1 + np.exp(-z / 2.5))  # the raw head is over-confident by T = 2.5
        ok = rng.random((30, 3)) < true_c
        acc_len = np.cumprod(ok, axis=1).sum(1)
        raw_c = 1 / (1 + np.exp(-z))
        per_request.append(cal.round_matrices([raw_c.tolist()], [acc_len.tolist()], [[3] * 30], 3))
    fit = cal.sts_split_fit(per_request, 20)
    assert fit["temperatures"][0] == pytest.approx(2.5, rel=0.25)
    assert fit["ece_after"] < 0.5 * fit["ece_before"]


def test_calibrate_command_writes_the_key(tiny_target, tmp_path):
    model, tok = tiny_target("qwen3")
    draft_dir = tmp_path / "draft"
    draft = make_draft(model, tok, block_size=3)
    draft.config.target_name_or_path = "tiny-qwen3"
    draft.save_pretrained(draft_dir)
    bench = tmp_path / "bench"
    bench.mkdir()
    rows = [{"turns": [f"Count to {i}."]} for i in range(4)]
    (bench / "tiny.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [
        sys.executable, "eval/calibrate.py", "--draft", str(draft_dir), "--datasets", "tiny",
        "--bench-dir", str(bench), "--num-prompts", "4", "--max-new-tokens", "8",
        "--batch-size", "2", "--threads", "1",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((draft_dir / "calibration.json").read_text())
    temps = DSparkConfig.from_pretrained(draft_dir).confidence_temperatures
    assert temps == res["temperatures"] and len(temps) == 3
    assert res["conditions"]["requests"] == 4 and res["n_test"] > 0
    assert (draft_dir / "calibration_reliability.png").exists()
    assert "ECE" in (draft_dir / "calibration.md").read_text()
