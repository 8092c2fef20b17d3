"""`make smollm2-served`: the served GGUF answers, is cached and is the training's target, and
the draft it starts from is measured beside the fine-tuned one, or a fresh draft trains alone;
the mix it answers comes from `make smollm2-large-prompts`, run as far as the rows asked need
(make -n, or make with a stand-in Python that logs the scripts: nothing real runs)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def run_make(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """make ARGS in the checkout, the larger build and the cache under `tmp_path`."""
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            *args,
            f"LARGE={tmp_path}/large",
            f"DSPARK_CACHE={tmp_path}/cache",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def served_commands(tmp_path: Path, goal: str, *args: str) -> list[str]:
    out = run_make(tmp_path, "-n", goal, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.replace("\\\n", " ").splitlines()


def two_row_mix(tmp_path: Path) -> Path:
    """A served GGUF stand-in and a mix of 2 prompts under `tmp_path`; the GGUF's path."""
    gguf = tmp_path / "t.q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    (tmp_path / "large").mkdir()
    (tmp_path / "large" / "mix.jsonl").write_text('{"turns": ["q"]}\n' * 2)
    return gguf


def test_the_served_gguf_is_the_answers_the_features_and_the_training_target(tmp_path):
    gguf = tmp_path / "t.q4_0.gguf"
    gguf.write_bytes(b"GGUF")  # present: not made again
    run = "runs/smollm2-served/q4_0_n500"
    lines = served_commands(tmp_path, f"{run}/results.json", f"SERVED_GGUF={gguf}",
                            "SERVED_QUANT=q4_0", "SERVED_ROWS=500", "SERVED_FROM=d0")  # fmt: skip
    assert not any("quantize_target.py" in x for x in lines)
    regen, test_regen = [x for x in lines if "regenerate.py" in x]
    data = f"{tmp_path}/cache/data/smollm2-served/q4_0"
    for want in ("--backend llama-cpp", f"--target-gguf {gguf}", "--limit 500",
                 f"--input {tmp_path}/large/mix.jsonl", f"--output {data}/answers"):  # fmt: skip
        assert want in regen
    assert f"--target-gguf {gguf}" in test_regen and "--split test" in test_regen
    # the answers' tokenizer and their agreement record's reference: the served GGUF itself
    # (dequantized), so the record measures the engine, not the quant
    (tokenize,) = [x for x in lines if "tokenize_data.py" in x]
    assert all(f"--target {gguf} " in x for x in (regen, test_regen, tokenize))
    for want in (f"--input {data}/answers/regenerated.jsonl", "--limit 500",
                 f"--output {data}/n500/tokenized"):  # fmt: skip
        assert want in tokenize
    caches = [x for x in lines if "cache_features.py" in x]
    assert len(caches) == 2 and all(f"--target {gguf}" in x for x in caches)
    (train,) = [x for x in lines if "distill.py" in x]
    for want in (f"target.name={gguf}", "draft.init_from=d0", "draft.vocab_size=null",
                 f"data.train={data}/n500/tokenized", f"data.features={data}/n500/features",
                 f"trainer.output_dir={run}"):  # fmt: skip
        assert want in train
    assert lines.index(regen) < lines.index(tokenize) < lines.index(caches[0]) < lines.index(train)


def test_q8_0_features_are_written_and_read_beside_the_bf16_ones(tmp_path):
    gguf = two_row_mix(tmp_path)
    run = "runs/smollm2-served/q4_k_m_n2_fresh_q8_0"  # not a bf16 run's, so never resumed from
    data = f"{tmp_path}/cache/data/smollm2-served/q4_k_m"
    lines = served_commands(tmp_path, f"{run}/results.json", f"SERVED_GGUF={gguf}",
                            "SERVED_ROWS=2", "SERVED_FROM=", "FEATURES_DTYPE=q8_0")  # fmt: skip
    train_cache, test_cache = [x for x in lines if "cache_features.py" in x]
    assert f"--output {data}/n2/features_q8_0 " in train_cache and "--dtype q8_0" in train_cache
    assert "--dtype" not in test_cache  # the held-out rows: bf16, as every arm's
    (train,) = [x for x in lines if "distill.py" in x]
    assert f"data.features={data}/n2/features_q8_0 " in train
    assert f"data.eval_features={data}/embedded_test/features " in train
    assert f"trainer.output_dir={run} " in train


def test_a_larger_n_grows_the_same_answers_and_links_the_smaller_n_cache(tmp_path):
    gguf = two_row_mix(tmp_path)
    data = tmp_path / "cache" / "data" / "smollm2-served" / "q4_k_m"
    for n, dtype in ((1, "q8_0"), (3, "bf16")):  # caches of 1 row: one of each kind
        cache = data / f"n{n}" / ("features_q8_0" if dtype == "q8_0" else "features")
        cache.mkdir(parents=True)
        (cache / "manifest.json").write_text("{}")
    lines = served_commands(tmp_path, "runs/smollm2-served/q4_k_m_n2_fresh_q8_0/results.json",
                            f"SERVED_GGUF={gguf}", "SERVED_ROWS=2", "SERVED_FROM=",
                            "FEATURES_DTYPE=q8_0")  # fmt: skip
    regen = next(x for x in lines if "regenerate.py" in x)
    assert f"--output {data}/answers " in regen and "--limit 2 " in regen  # one run, grown
    (tokenize,) = [x for x in lines if "tokenize_data.py" in x]
    assert "--partial" in tokenize and "--limit 2 " in tokenize  # the answers may run on past N
    train_cache = next(x for x in lines if f"{data}/n2/features_q8_0" in x)
    # the smaller N's cache of the same kind is linked from; a bf16 cache never is
    assert train_cache.split().count("--reuse-from") == 1
    assert f"--reuse-from {data}/n1/features_q8_0" in train_cache
    assert not any(x.startswith("rm ") for x in lines)  # and kept


def test_a_missing_gguf_is_made_first_and_both_drafts_are_measured_on_it(tmp_path):
    gguf = tmp_path / "absent.q4_k_m.gguf"
    run = "runs/smollm2-served/q4_k_m_n3000"
    lines = served_commands(tmp_path, f"{run}/results.json", f"SERVED_GGUF={gguf}")
    assert "quantize_target.py" in lines[0] and "--quants q4_k_m" in lines[0]
    benches = served_commands(tmp_path, f"{run}/llama_cpp_from/results.json",
                              f"{run}/llama_cpp/results.json", f"SERVED_GGUF={gguf}",
                              "SERVED_FROM=d0")  # fmt: skip
    from_bench, served_bench = [x for x in benches if "llama_cpp_bench.py" in x]
    assert f"--target-gguf {gguf}" in from_bench and f"--target-gguf {gguf}" in served_bench
    assert "--draft d0 " in from_bench and f"--draft {run}/draft " in served_bench


def test_an_empty_served_from_trains_a_fresh_draft_and_measures_only_it(tmp_path):
    gguf = tmp_path / "t.q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    run = "runs/smollm2-served/q4_k_m_n3000_fresh"
    lines = served_commands(tmp_path, "smollm2-served", f"SERVED_GGUF={gguf}", "SERVED_FROM=")
    assert any(f"{run}/results.json" in x for x in lines)
    sub = served_commands(tmp_path, f"{run}/results.json", f"SERVED_GGUF={gguf}", "SERVED_FROM=")
    (train,) = [x for x in sub if "distill.py" in x]
    assert "init_from" not in train and "vocab_size" not in train and "epochs" not in train
    assert f"trainer.output_dir={run} " in train
    benches = [x for x in lines if "llama_cpp_from" in x]
    assert not benches  # no draft to start from, none measured beside it


def test_the_served_answers_wait_for_a_mix_long_enough(tmp_path):
    gguf = two_row_mix(tmp_path)
    out = run_make(tmp_path, "runs/smollm2-served/q4_k_m_n3_fresh/results.json",
                   f"SERVED_GGUF={gguf}", "SERVED_FROM=", "SERVED_ROWS=3")  # fmt: skip
    assert out.returncode != 0
    assert "error: " in out.stdout
    assert "make smollm2-large-prompts LARGE_MIX_ROWS=3" in out.stdout  # the fix, with its N
    assert "regenerate.py" not in out.stdout + out.stderr  # refused before answering


def test_the_prompt_steps_run_alone_without_answering(tmp_path):
    lines = served_commands(tmp_path, "smollm2-large-prompts")
    magpie = [x for x in lines if "magpie_prompts.py" in x]
    assert len(magpie) == 2 and all(f"{tmp_path}/large/magpie_" in x for x in magpie)
    assert any("mix_prompts.py" in x and f"--output {tmp_path}/large/mix.jsonl" in x
               for x in lines)  # fmt: skip
    assert not any("regenerate.py" in x or "cache_features.py" in x for x in lines)
    full = served_commands(tmp_path, "smollm2-large-data")
    assert [x for x in full if "magpie_prompts.py" in x] == magpie  # the same steps, then answers
    assert any("regenerate.py" in x and "--output " + f"{tmp_path}/large/answers" in x
               for x in full)  # fmt: skip


def stand_in_run(
    tmp_path: Path, goal: str, mix_rows: int, *args: str, magpie_rc: int = 75
) -> tuple[int, list[str], str]:
    """Run `make GOAL ARGS` for real with a stand-in Python that logs each script it is given
    and ends every Magpie run with `magpie_rc` (75: work left; 0: every sample drawn), over a
    mix of `mix_rows` rows; make's exit status, the scripts run, in order, and its output."""
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        f'#!/bin/bash\necho "$1" >> {log}\n[[ $1 != *magpie* ]] || exit {magpie_rc}\n'
    )
    python.chmod(0o755)
    (venv / ".installed").touch()  # newer than pyproject.toml: set up
    (tmp_path / "large").mkdir()
    (tmp_path / "large" / "mix.jsonl").write_text('{"turns": ["q"]}\n' * mix_rows)
    out = run_make(tmp_path, goal, f"VENV={venv}", *args)
    calls = log.read_text().split() if log.exists() else []
    return out.returncode, [Path(c).name for c in calls], out.stdout


def prompt_steps(tmp_path: Path, mix_rows: int, *args: str, **kw) -> tuple[int, list[str]]:
    rc, calls, _ = stand_in_run(tmp_path, "smollm2-large-prompts", mix_rows, *args, **kw)
    return rc, calls


def test_the_prompt_steps_stop_sampling_once_the_mix_holds_the_rows_asked(tmp_path):
    magpie, mix = "magpie_prompts.py", "mix_prompts.py"
    # enough rows: no more samples, the mix rebuilt, and the goal succeeds
    rc, calls = prompt_steps(tmp_path / "held", 3, "LARGE_MIX_ROWS=3")
    assert rc == 0 and magpie not in calls and mix in calls
    # one row short: both sets sample on and the step ends with work left (make's Error 75)
    rc, calls = prompt_steps(tmp_path / "short", 2, "LARGE_MIX_ROWS=3")
    assert rc != 0 and calls.count(magpie) == 2 and calls[-1] == mix
    # unset: the sample counts decide, however long the mix already is
    rc, calls = prompt_steps(tmp_path / "unset", 3)
    assert rc != 0 and calls.count(magpie) == 2
    rc, calls = prompt_steps(tmp_path / "drawn", 2, magpie_rc=0)
    assert rc == 0  # every sample drawn: done
    # every sample drawn and the mix still short of the rows asked: an error naming the fix
    rc, calls, out = stand_in_run(tmp_path / "short_drawn", "smollm2-large-prompts", 2,
                                  "LARGE_MIX_ROWS=3", "LARGE_CHAT_SAMPLES=9", magpie_rc=0)  # fmt: skip
    assert rc != 0 and "error: the mix holds fewer than LARGE_MIX_ROWS=3 rows" in out
    assert "LARGE_CHAT_SAMPLES=9 chat" in out and "raise those counts" in out


def test_the_status_reads_the_answers_cache_and_run_the_build_writes(tmp_path):
    args = ("SERVED_FROM=", "SERVED_ROWS=24000", "FEATURES_DTYPE=q8_0")
    build = served_commands(tmp_path, "runs/smollm2-served/q4_k_m_n24000_fresh_q8_0/results.json",
                            "SERVED_GGUF=t.gguf", *args)  # fmt: skip
    (status,) = served_commands(tmp_path, "smollm2-served-status", *args)
    answers = next(x for x in build if "regenerate.py" in x).split("--output ")[1].split()[0]
    cache = next(x for x in build if "cache_features.py" in x).split("--output ")[1].split()[0]
    run = next(x for x in build if "distill.py" in x).split("trainer.output_dir=")[1].split()[0]
    assert "build_status.py" in status and f" {answers} --rows 24000 " in status
    assert f"--features {cache} " in status and status.endswith(f"--run {run}")


def test_one_command_samples_the_mix_it_needs_then_answers_caches_trains_and_measures(tmp_path):
    gguf = tmp_path / "t.q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    args = (f"SERVED_GGUF={gguf}", "SERVED_FROM=", "SERVED_ROWS=3")
    # the mix one row short: a prompts step, then make stops with work left before answering
    rc, calls, _ = stand_in_run(tmp_path / "short", "smollm2-served", 2, *args)
    assert rc != 0 and "magpie_prompts.py" in calls and "regenerate.py" not in calls
    # long enough: no more samples, then every step of the served draft, in order
    rc, calls, _ = stand_in_run(tmp_path / "held", "smollm2-served", 3, *args)
    assert rc == 0 and "magpie_prompts.py" not in calls
    served = calls[calls.index("mix_prompts.py") + 1 :]
    assert served == ["regenerate.py", "regenerate.py", "tokenize_data.py", "cache_features.py",
                      "cache_features.py", "distill.py", "llama_cpp_bench.py"]  # fmt: skip
    # another prompt file: nothing of the mix is sampled or built
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["q"]}\n' * 3)
    rc, calls, _ = stand_in_run(tmp_path / "file", "smollm2-served", 0, *args,
                                f"SERVED_PROMPTS={prompts}")  # fmt: skip
    assert rc == 0 and calls == served


def test_another_prompt_file_is_answered_and_guarded_in_place_of_the_mix(tmp_path):
    gguf = tmp_path / "t.q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    prompts = tmp_path / "recipe_prompts.jsonl"
    prompts.write_text('{"turns": ["q"]}\n' * 2)
    # its answers and run are named after it, apart from the mix's of as many rows
    run = "runs/smollm2-served/q4_k_m_n2_recipe_prompts_fresh/results.json"
    lines = served_commands(tmp_path, run, f"SERVED_GGUF={gguf}", "SERVED_FROM=",
                            "SERVED_ROWS=2", f"SERVED_PROMPTS={prompts}")  # fmt: skip
    regen = next(x for x in lines if "regenerate.py" in x and "--split test" not in x)
    assert f"--input {prompts} " in regen and "mix.jsonl" not in regen
    assert "smollm2-served/q4_k_m_recipe_prompts/answers " in regen
    (train,) = [x for x in lines if "distill.py" in x]
    assert f"trainer.output_dir={run.removesuffix('/results.json')} " in train
    assert any(f"cat {prompts} " in x and "-ge 2" in x for x in lines)  # the guard counts it
    out = run_make(tmp_path, run.replace("_n2_", "_n3_"), f"SERVED_GGUF={gguf}", "SERVED_FROM=",
                   "SERVED_ROWS=3", f"SERVED_PROMPTS={prompts}")  # fmt: skip
    assert out.returncode != 0 and f"error: {prompts} holds fewer than SERVED_ROWS=3" in out.stdout


def test_a_missing_draft_to_start_from_is_refused_before_answering(tmp_path):
    gguf = two_row_mix(tmp_path)
    missing = tmp_path / "no_draft"
    missing.mkdir()  # a run dir whose draft is not written yet
    out = run_make(tmp_path, "runs/smollm2-served/q4_k_m_n3/results.json", f"SERVED_GGUF={gguf}",
                   f"SERVED_FROM={missing}", "SERVED_ROWS=3")  # fmt: skip
    assert out.returncode != 0
    assert f"error: SERVED_FROM={missing} holds no draft" in out.stdout
    assert "SERVED_FROM= for a fresh draft" in out.stdout
    assert "regenerate.py" not in out.stdout + out.stderr
    # a draft dir passes this guard: the mix's (too short here) is the one that refuses
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    out = run_make(tmp_path, "runs/smollm2-served/q4_k_m_n3/results.json", f"SERVED_GGUF={gguf}",
                   f"SERVED_FROM={draft}", "SERVED_ROWS=3")  # fmt: skip
    assert out.returncode != 0 and "holds no draft" not in out.stdout
    assert "holds fewer than SERVED_ROWS=3" in out.stdout
