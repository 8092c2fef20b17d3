"""Every writer holds its output's lock: two jobs on one output give one good output and one
`error:` line (exit 2), started together or 1 s apart, and the output equals a lone run's.

The two probes a user meets first run as real processes (regeneration, training); the other
writers are each called while another process holds their output (tests/test_locking.py's
`held_elsewhere`), which is the same lock a second job would meet.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import debug_cfg
from test_locking import REPO, _env, held_elsewhere

from dspark.locking import OutputBusyError, exclusive_output, holder, lock_file_for

BUSY = "is being written by pid"


def _start(args: list[str], cache: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(DSPARK_CACHE=str(cache)),
    )


def _race(args: list[str], cache: Path, delay: float) -> list[tuple[int, str]]:
    first = _start(args, cache)
    time.sleep(delay)
    second = _start(args, cache)
    out = []
    for proc in (first, second):
        _, err = proc.communicate(timeout=300)
        out.append((proc.returncode, err))
    return out


def _one_ran_one_refused(results: list[tuple[int, str]]) -> None:
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    err = next(e for rc, e in results if rc == 2)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and BUSY in errors[0] and "Traceback" not in err, err


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


REGEN = ["data_scripts/regenerate.py", "--target", "tiny-qwen3", "--input", "embedded",
         "--split", "train", "--limit", "24", "--max-new-tokens", "24", "--no-progress",
         "--tokenize"]  # fmt: skip


@pytest.mark.parametrize("delay", [0.0, 1.0], ids=["together", "1s-apart"])
def test_two_regenerations_into_one_output(tmp_path, dspark_cache, tiny_target_dir, delay):
    import datasets

    tiny_target_dir("qwen3")
    out, lone = tmp_path / "D", tmp_path / "lone"
    _one_ran_one_refused(_race([*REGEN, "--output", str(out)], dspark_cache, delay))
    rows = _rows(out / "regenerated.jsonl")
    assert sorted(r["index"] for r in rows) == list(range(24))  # none twice, none lost
    subprocess.run([sys.executable, *REGEN, "--output", str(lone)], cwd=REPO, check=True,
                   env=_env(DSPARK_CACHE=str(dspark_cache)), capture_output=True)  # fmt: skip
    assert rows == _rows(lone / "regenerated.jsonl")
    ds, ref = (datasets.load_from_disk(str(d / "tokenized")) for d in (out, lone))
    assert len(ds) == 24 and ds["input_ids"] == ref["input_ids"]


def test_two_trainings_into_one_run_directory(tmp_path, dspark_cache, debug_data):
    """The data is made once beforehand; the two trainings, started together, race on the run
    directory only (a second one started after the first finished would resume that finished
    run, which is no race: on a fast machine 6 tiny steps end within the start-up of another)."""
    run = tmp_path / "R"
    args = ["train/distill.py", "recipe=debug", "tracking=none", f"hydra.run.dir={run}",
            f"data.train={debug_data}", "trainer.max_steps=6", "trainer.save_every=3",
            "trainer.eval_every=0"]  # fmt: skip
    _one_ran_one_refused(_race(args, dspark_cache, 0.0))
    steps = [r["step"] for r in _rows(run / "metrics.jsonl") if "train/loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 6  # one run's lines only
    assert (run / "draft" / "config.json").is_file()


def test_training_refuses_a_data_dir_being_written(tmp_path, debug_data):
    from dspark.training.loop import run

    with held_elsewhere(debug_data):
        with pytest.raises(OutputBusyError, match="data dir .* reading it now"):
            run(debug_cfg(tmp_path / "r", debug_data, "trainer.max_steps=1"))
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_training_holds_its_run_directory(tmp_path, debug_data):
    from dspark.training.loop import run

    out = tmp_path / "r"
    with held_elsewhere(out):
        with pytest.raises(OutputBusyError, match="the training run directory"):
            run(debug_cfg(out, debug_data, "trainer.max_steps=1"))
    assert not out.exists()


def test_tokenize_cli_refused_while_another_job_writes(tmp_path, dspark_cache, tiny_target_dir):
    tiny_target_dir("llama")
    src = tmp_path / "in.jsonl"
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    src.write_text(json.dumps({"messages": conv}) + "\n")
    out = tmp_path / "tok"
    cmd = [sys.executable, "data_scripts/tokenize_data.py", "--target", "tiny-llama",
           "--input", str(src), "--output", str(out)]  # fmt: skip
    env = _env(DSPARK_CACHE=str(dspark_cache))
    with held_elsewhere(out) as proc:
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == 2 and f"pid {proc.pid}" in res.stderr and not out.exists()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (out / "manifest.json").is_file()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tok")]  # no temp, no lock


def test_a_rewritten_tokenized_set_is_replaced_whole(tmp_path, tiny_target):
    """The second set lands by rename: the directory holds one set's files, never a mix."""
    from dspark.data.tokenize import load_manifest, save_tokenized, tokenize_rows

    _, tok = tiny_target("llama")
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    out = tmp_path / "tok"
    for n in (3, 1):
        ds, stats = tokenize_rows([{"index": i, "messages": conv} for i in range(n)], tok)
        save_tokenized(ds, out, stats, target="tiny-llama", tokenizer=tok, max_length=64)
        assert load_manifest(out)["rows"] == n
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".arrow") == [
        "data-00000-of-00001.arrow"
    ]


def test_feature_cache_magpie_export_refused_while_held(tmp_path, tiny_sets, tiny_target):
    from helpers import make_draft

    from dspark.data.features import feature_cache as fc
    from dspark.data.regeneration.magpie import generate_prompts
    from dspark.export.api import export_draft

    target, tok, data, _ = tiny_sets("llama")
    out = tmp_path / "feats"
    with held_elsewhere(out):
        with pytest.raises(OutputBusyError, match="the feature cache"):
            fc.write_cache(target, data, out, layer_ids=[0], target_name="tiny-llama",
                           pad_token_id=0)  # fmt: skip
    assert not out.exists()
    magpie = tmp_path / "magpie"
    with held_elsewhere(magpie):
        with pytest.raises(OutputBusyError, match="the Magpie prompt set"):
            generate_prompts(None, tok, magpie, num=2, target="tiny-llama", sampling=None)
    assert not magpie.exists()
    model, tok2 = tiny_target("llama")
    exp = tmp_path / "export"
    with held_elsewhere(exp):
        with pytest.raises(OutputBusyError, match="the export"):
            export_draft(make_draft(model, tok2), exp)
    assert not exp.exists()


def test_cache_entries_wait_for_their_writer(tmp_path, tiny_target, monkeypatch):
    """Two probes of one cache entry: the second waits, then reads what the first cached."""
    from dspark import dtype_probe

    model, _ = tiny_target("llama")
    calls = []
    real = dtype_probe.probe

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(dtype_probe, "probe", counted)
    kw = dict(candidates=["float32"], batch=1, tokens=(2,), rounds=1, repeats=1, context_len=8)
    key = dtype_probe.probe_key(model, batch=1, tokens=(2,), taps=[], draft=None)
    path = dtype_probe.cache_path(key)
    with exclusive_output(path):  # a job measuring this entry now, in another thread
        import threading

        got = {}
        t = threading.Thread(target=lambda: got.update(dtype_probe.load_or_probe(model, **kw)))
        t.start()
        time.sleep(0.5)
        assert t.is_alive() and not calls  # waiting, not measuring
        first = dtype_probe.load_or_probe(model, **kw)  # the holder measures and caches
    t.join(60)
    assert len(calls) == 1 and got["cached"] and got["profile"] == first["profile"]
    assert holder(path) is None and not lock_file_for(path).exists()


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["-m", "draft.markov_rank=0,16", "trainer.output_dir=runs/x"], True),
        (["-m", "draft.markov_rank=0,16", "trainer.output_dir=runs/a,runs/a"], True),
        (["-m", "optim.lr=range(1,3)", "hydra.sweep.subdir=same"], True),
        (["-m", "draft.markov_rank=0,16"], False),  # Hydra's subdirectory per job
        (["-m", "draft.markov_rank=0,16", "trainer.output_dir=runs/a,runs/b"], True),  # 4 jobs
        (["-m", "trainer.output_dir=runs/a,runs/b"], False),
        (["-m", "draft.markov_rank=0,16", "trainer.output_dir=r/${hydra.job.num}"], False),
        (["draft.markov_rank=0", "trainer.output_dir=runs/x"], False),  # not a sweep
        (["-m", "trainer.output_dir=runs/x"], False),  # a sweep of one job
    ],
)
def test_a_sweep_whose_jobs_share_an_output_is_refused(args, refused):
    from dspark.errors import UserError
    from dspark.overrides import check_sweep_outputs

    if refused:
        with pytest.raises(UserError, match="jobs would overwrite each other's runs"):
            check_sweep_outputs(args, "trainer.output_dir")
    else:
        check_sweep_outputs(args, "trainer.output_dir")


def test_the_sweep_refusal_comes_before_any_job(tmp_path):
    out = tmp_path / "shared"
    res = subprocess.run(
        [
            sys.executable,
            "train/distill.py",
            "-m",
            "recipe=debug",
            "draft.markov_rank=0,16",
            f"trainer.output_dir={out}",
        ],  # fmt: skip
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,  # fmt: skip
    )
    assert res.returncode == 2 and res.stderr.count("error:") == 1, res.stderr
    assert "2 jobs" in res.stderr and not out.exists()
