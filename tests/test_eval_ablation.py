"""eval/ablation.py over two tiny training runs: one row per draft, its held-out metrics from
results.json, and decoder tau equal to a direct decoder run's (bonus counted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import debug_cfg

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "bench").is_dir(), reason="no ../shared")
def test_ablation_table_over_two_runs(tmp_path, debug_data):  # noqa: F811
    from dspark.decoding import DecoderOptions, SpeculativeDecoder
    from dspark.eval.prompts import load_dataset, render
    from dspark.modeling import DSparkDraftModel
    from dspark.target import load_target
    from dspark.training.loop import run

    # explicit keys: a recipe's draft.* values win over a `draft=` group choice
    dflash = [
        "draft.markov_rank=0",
        "draft.enable_confidence_head=false",
        "draft.confidence_head_with_markov=false",
    ]
    for name, extra in (("vanilla", []), ("dflash", dflash)):
        run(
            debug_cfg(
                tmp_path / name, debug_data, "trainer.max_steps=2", "trainer.eval_every=0", *extra
            )
        )
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "eval/ablation.py"),
            str(tmp_path / "vanilla"),
            str(tmp_path / "dflash"),
            "--sets",
            "gsm8k",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "12",
            "--temperatures",
            "0",
            "--threads",
            "1",
            "--out",
            str(tmp_path / "table"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads((tmp_path / "table/ablation.json").read_text())
    assert [r["run"] for r in res["rows"]] == [str(tmp_path / "vanilla"), str(tmp_path / "dflash")]
    row = res["rows"][1]
    assert json.loads((tmp_path / "dflash/draft/config.json").read_text())["markov_rank"] == 0
    assert "eval/tau_probabilistic" in row["train"]
    # decoder tau == a direct decoder run on the same prompts
    draft = DSparkDraftModel.from_pretrained(tmp_path / "dflash" / "draft").eval()
    target, tok = load_target(draft.config.target_name_or_path)
    prompts = [render(tok, t, []) for t in load_dataset("gsm8k", None, 2)]
    dec = SpeculativeDecoder(target, draft, DecoderOptions(max_length=4096))
    acc = rounds = 0
    for p in prompts:
        o = dec.generate([p], 12, eos_token_id=tok.eos_token_id, seed=0)
        acc += sum(o.accept_lengths[0])
        rounds += len(o.accept_lengths[0])
    assert row["decoder"]["gsm8k@0"]["tau"] == pytest.approx((acc + rounds) / rounds)
    assert (tmp_path / "table/ablation.md").read_text().count("\n| ") == 3  # header + 2 rows
