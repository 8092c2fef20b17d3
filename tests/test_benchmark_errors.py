"""eval/benchmark.py's ordinary mistakes end as one `benchmark: error:` line naming the key and
the fix, exit status 2: bad values before any model is loaded (the draft path here does not
even exist), and a draft whose dimensions do not fit the target once both are read.
In-process through the Hydra job (`dspark.cli._benchmark_job`), no subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import dspark.cli
from dspark.errors import EXIT_USER_ERROR
from dspark.eval.benchmark_config import register

CONF = Path(__file__).resolve().parents[1] / "conf" / "benchmark"


@pytest.fixture
def bench_dir(tmp_path):
    d = tmp_path / "bench"
    d.mkdir()
    (d / "tiny.jsonl").write_text(json.dumps({"turns": ["Say hi."]}) + "\n")
    return d


def _compose(overrides):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="benchmark", overrides=overrides)


def _job_fails(capsys, overrides) -> str:
    cfg = _compose(overrides)
    with pytest.raises(SystemExit) as e:
        dspark.cli._benchmark_job(cfg)
    err = capsys.readouterr().err
    assert e.value.code == EXIT_USER_ERROR, err
    assert "Traceback" not in err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("benchmark: error: "), last
    return last


@pytest.mark.parametrize(
    "override, needles",
    [
        ("num_prompts=0", ["num_prompts=0", ">= 1"]),
        ("num_prompts=-1", ["num_prompts=-1", ">= 1"]),
        ("max_new_tokens=0", ["max_new_tokens=0", ">= 1"]),
        ("batch_size=0", ["batch_size=0", ">= 1"]),
        ("temperature=-1", ["temperature=-1", ">= 0"]),
        ("top_p=0", ["top_p=0", "(0, 1]"]),
        ("top_p=1.5", ["top_p=1.5", "(0, 1]"]),
        ("top_k=-1", ["top_k=-1"]),
        ("confidence_threshold=2", ["confidence_threshold=2", "[0, 1]"]),
        ("verify_policy=fancy", ["verify_policy='fancy'", "full, threshold, scheduler"]),
        ("verify_policy=threshold", ["verify_policy=threshold needs confidence_threshold"]),
        ("scheduler_batch=wide", ["scheduler_batch='wide'", "padded, ragged"]),
        ("dtype=fp8", ["dtype='fp8'", "bfloat16"]),
        ("baselines.run=[hf_foo]", ["hf_foo", "hf_generate"]),
        ("calibration.bins=0", ["calibration.bins=0"]),
        ("device=tpu", ["device='tpu'", "cpu"]),
        ("datasets=[gsm9k]", ["'gsm9k'", "Known names: gsm8k, humaneval", "tiny, embedded"]),
        ("datasets=[]", ["datasets is empty"]),
        ("datasets=[tiny,tiny]", ["more than once"]),
    ],
)
def test_bad_values_fail_before_any_model_loads(tmp_path, bench_dir, capsys, override, needles):
    line = _job_fails(
        capsys,
        [f"draft={tmp_path / 'no-draft'}", f"bench_dir={bench_dir}", "datasets=[tiny]",
         f"output_dir={tmp_path / 'out'}", override],
    )  # fmt: skip
    for needle in needles:
        assert needle in line, (needle, line)
    assert not (tmp_path / "out").exists()  # refused before the run wrote anything


def _save_draft(tiny_target, path, target_changes=None, **kw):
    """A random tiny-qwen3 draft, its dimensions as if its target had `target_changes`."""
    from dspark.config import DSparkConfig
    from dspark.modeling import DSparkDraftModel

    target, _ = tiny_target("qwen3")
    src = {**target.config.to_dict(), **(target_changes or {})}
    cfg = DSparkConfig.from_target_config(
        src, num_hidden_layers=1, markov_rank=8, block_size=3, mask_token_id=5,
        target_name_or_path="tiny-qwen3", **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    DSparkDraftModel(cfg).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "changes, kw, needle",
    [
        ({"hidden_size": 32, "head_dim": 16}, {}, "hidden size 32 vs the target's 64"),
        ({"vocab_size": 500}, {}, "vocabulary 500 vs the target's 384"),
        ({"num_hidden_layers": 8}, {"target_layer_ids": [0, 5]}, "tapped layers [0, 5]"),
    ],
)
def test_draft_for_another_target_is_refused(
    tiny_target, tmp_path, bench_dir, capsys, changes, kw, needle
):
    draft = _save_draft(tiny_target, tmp_path / "draft", changes, **kw)
    line = _job_fails(
        capsys,
        [f"draft={draft}", "target=tiny-qwen3", f"bench_dir={bench_dir}", "datasets=[tiny]",
         f"output_dir={tmp_path / 'out'}"],
    )  # fmt: skip
    assert f"draft={draft}" in line and "target=tiny-qwen3" in line and needle in line, line


def test_same_dimensions_other_target_warns(tiny_target, capsys):
    from dspark.eval.models import check_draft_fits_target

    qwen, tok = tiny_target("qwen3")
    llama, _ = tiny_target("llama")
    from helpers import make_draft

    draft = make_draft(qwen, tok, target_name_or_path="tiny-qwen3")
    check_draft_fits_target(draft.config, llama.config, "D", "tiny-llama")  # dims fit: runs
    err = capsys.readouterr().err
    assert "warning: draft=D was trained for tiny-qwen3" in err and "llama" in err


def test_confidence_policy_needs_a_confidence_head(tiny_target, tmp_path, bench_dir, capsys):
    draft = _save_draft(tiny_target, tmp_path / "draft", enable_confidence_head=False)
    line = _job_fails(
        capsys,
        [f"draft={draft}", f"bench_dir={bench_dir}", "datasets=[tiny]", "verify_policy=scheduler",
         f"output_dir={tmp_path / 'out'}"],
    )  # fmt: skip
    assert "verify_policy=scheduler" in line and "no confidence head" in line


def test_draft_without_weights_names_the_directory(tiny_target, tmp_path, bench_dir, capsys):
    draft = _save_draft(tiny_target, tmp_path / "draft")
    (draft / "model.safetensors").unlink()  # a copy that lost its weights
    line = _job_fails(
        capsys,
        [f"draft={draft}", f"bench_dir={bench_dir}", "datasets=[tiny]",
         f"output_dir={tmp_path / 'out'}"],
    )  # fmt: skip
    assert f"{draft} cannot be loaded as a draft" in line and "model.safetensors" in line


@pytest.mark.parametrize(
    "arg, needle",
    [("num_prompts=abc", "num_prompts='abc'"), ("temperature=hot", "temperature='hot'")],
)
def test_mistyped_value_is_one_line(arg, needle):
    from dspark.errors import UserError
    from dspark.eval.benchmark_config import check_overrides

    with pytest.raises(UserError, match=needle) as e:
        check_overrides(["draft=x", "datasets=[gsm8k,embedded]", arg])
    assert "\n" not in str(e.value)
    check_overrides(["draft=x", "datasets=[gsm8k,embedded]", "num_prompts=3", "top_p=0.9"])


def test_a_second_benchmark_into_one_output_is_refused(tmp_path, capsys):
    """Another job holds the output folder: one error line naming it, before any model loads."""
    from test_locking import held_elsewhere

    out = tmp_path / "bench"
    with held_elsewhere(out) as proc:
        last = _job_fails(capsys, [f"draft={tmp_path}", f"output_dir={out}"])
    assert f"the benchmark output {out} is being written by pid {proc.pid}" in last
