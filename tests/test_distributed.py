"""Multi-process runs that are really multi-process: 2 gloo ranks on this CPU.

Every launched run asserts the world size it believes it runs (the worker checks Accelerate's
process count against WORLD_SIZE and the expected count; the loop refuses a mismatch).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CPU_DDP2 = ROOT / "conf" / "accelerate" / "cpu_ddp2.yaml"


def free_port() -> int:
    """A port nobody listens on now (several test sessions may share this machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env() -> dict:
    return {
        **os.environ,
        "ACCELERATE_USE_CPU": "true",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, debug_data, tiny_target_dir):
    """The worker on 2 gloo ranks through conf/accelerate/cpu_ddp2.yaml, and the 1-process
    reference on the same global batch of 4 rows."""
    from ddp_worker import grads_on_rank_share

    tiny = tiny_target_dir("qwen3")
    out = tmp_path_factory.mktemp("two_ranks") / "two.pt"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_DDP2)]
    cmd += ["--main_process_port", str(free_port()), str(ROOT / "tests" / "ddp_worker.py")]
    cmd += [tiny, str(debug_data), str(out), "2"]
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = grads_on_rank_share(tiny, str(debug_data), world_size=1, rank=0)
    return one, torch.load(out)


def assert_same_step(got: dict, ref: dict) -> None:
    assert float(got["loss"]) == pytest.approx(float(ref["loss"]), rel=1e-5)
    assert got["grads"].keys() == ref["grads"].keys() and ref["grads"]
    for name, g in ref["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_two_process_ddp_equals_one_process_on_the_same_global_batch(two_ranks):
    """Token-pooled normalisation: 2 ranks with uneven token counts give the 1-process loss and
    gradients (on every rank)."""
    one, ranks = two_ranks
    assert len(ranks) == 2
    for r in ranks:
        assert r["world_size"] == 2 and r["distributed_type"] == "MULTI_CPU"
        assert_same_step(r["ddp"], one)


def test_per_rank_normalisation_fails_the_same_comparison(two_ranks):
    """The comparison above has power: a reducer that normalises by each rank's own tokens
    (DDP then averages per-rank means) gives other gradients on this uneven split."""
    one, ranks = two_ranks
    with pytest.raises(AssertionError):
        assert_same_step(ranks[0]["per_rank"], one)


def test_sharded_target_gives_the_unsharded_loss_and_gradients(two_ranks):
    """FSDP2-sharded frozen target (each rank holds half of every decoder weight) under a DDP
    draft: the same loss and draft gradients as one process with the whole target."""
    one, ranks = two_ranks
    for r in ranks:
        assert r["sharded"]["local_fraction"] == pytest.approx(0.5, abs=0.01)
        assert_same_step(r["sharded"], one)


def test_the_loop_refuses_launches_that_are_not_what_they_look_like():
    from dspark.training.loop import check_launch

    check_launch(2, "MULTI_CPU", {"WORLD_SIZE": "2"})
    check_launch(1, "NO", {})
    check_launch(8, "FSDP", {"WORLD_SIZE": "8", "ACCELERATE_USE_FSDP": "true"})
    with pytest.raises(RuntimeError, match="ACCELERATE_USE_CPU=true"):
        check_launch(1, "NO", {"WORLD_SIZE": "2"})  # --multi_gpu on a CPU: 2 lone copies
    with pytest.raises(RuntimeError, match="asks for FSDP but Accelerate runs MULTI_CPU"):
        check_launch(2, "MULTI_CPU", {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"})


def test_multi_gpu_launch_without_the_cpu_flag_is_refused_by_the_loop(tmp_path, debug_data):
    """The CPU launch trap, end to end: `--multi_gpu --num_processes 2` on a CPU starts two
    processes of world size 1; the training loop stops both, naming the fix."""
    env = {k: v for k, v in launch_env().items() if k != "ACCELERATE_USE_CPU"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
    cmd += ["--num_processes=2", f"--main_process_port={free_port()}", "--mixed_precision=no"]
    cmd += ["--dynamo_backend=no", str(ROOT / "train" / "distill.py")]
    cmd += loop_overrides(tmp_path, debug_data, 5)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "WORLD_SIZE=2" in proc.stderr and "joined 1 of them" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before any step


ACCELERATE_CONFIGS = sorted((ROOT / "conf" / "accelerate").glob("*.yaml"))


@pytest.mark.parametrize("config", ACCELERATE_CONFIGS, ids=lambda p: p.stem)
def test_accelerate_configs_pass_the_launchers_own_validation(config):
    """What can be checked without GPUs: Accelerate parses each config and builds the
    environment its launcher would hand to every process (FSDP / DeepSpeed cannot run on a
    CPU: Accelerate needs a device for FSDP, and deepspeed is not installed here)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config), "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    kind = defaults.distributed_type.value
    assert kind in ("MULTI_GPU", "FSDP", "DEEPSPEED")
    assert args.num_processes >= 2
    if kind == "DEEPSPEED":
        assert defaults.deepspeed_config["zero_stage"] == 2
        return
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_MIXED_PRECISION"] == defaults.mixed_precision
    if kind == "FSDP":
        assert env["ACCELERATE_USE_FSDP"] == "true"
        assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
        assert env["FSDP_USE_ORIG_PARAMS"] == "true"  # the draft mixes frozen and trained


def loop_overrides(out_dir, data_dir, batch_size: int) -> list[str]:
    """A 3-step debug run whose every step sees the same rows at any world size and whose
    anchors are every valid position (no sampling). 20 train rows (4 of 24 held out) = 2 full
    global batches of 10 per epoch, so step 3 starts epoch 2 (the sampler's reshuffle). A
    partial last batch would differ on purpose: Accelerate completes it with repeated rows."""
    return [
        "recipe=debug",
        f"trainer.output_dir={out_dir}",
        f"hydra.run.dir={out_dir}/hydra",
        f"data.train={data_dir}",
        f"data.batch_size={batch_size}",
        "data.eval_fraction=0.16",
        "draft.num_anchors=512",
        "trainer.max_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.save_every=0",
    ]


def one_process_losses(out_dir, data_dir) -> dict:
    from helpers import losses
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dspark.training.loop import run
    from dspark.training.schema import check, register_configs

    GlobalHydra.instance().clear()
    register_configs()
    overrides = [o for o in loop_overrides(out_dir, data_dir, 10) if not o.startswith("hydra.")]
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=overrides)
    check(cfg)
    run(cfg)
    return losses(out_dir)


def two_node_cmd(machine_rank: int, port: int, out_dir, data_dir, *extra: str) -> list[str]:
    """README's multi-node command, one process per "node", both nodes on localhost."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines=2",
        "--num_processes=2",
        f"--machine_rank={machine_rank}",
        "--main_process_ip=127.0.0.1",
        f"--main_process_port={port}",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        str(ROOT / "train" / "distill.py"),
        *loop_overrides(out_dir, data_dir, 5),
        *extra,
    ]


def run_two_nodes(out_dir, data_dir, *extra: str) -> dict:
    from helpers import losses

    port = free_port()
    nodes = [
        subprocess.Popen(
            two_node_cmd(r, port, out_dir, data_dir, *extra),
            env=launch_env(),
            cwd=out_dir.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    logs = [n.communicate(timeout=600)[0] for n in nodes]
    for n, log in zip(nodes, logs):
        assert n.returncode == 0, log[-3000:]
    results = json.loads((out_dir / "results.json").read_text())
    assert results["conditions"]["processes"] == 2  # the run says it ran on 2 ranks
    return losses(out_dir)


@pytest.mark.slow
def test_two_nodes_on_localhost_give_the_one_process_losses(tmp_path, debug_data):
    """2 "machines" x 1 process (gloo, static rendezvous on 127.0.0.1), per-rank batch 5, give
    the losses of one process with batch 10 at every step; and so does the same 2-node run with
    the frozen target FSDP2-sharded through the training loop (`target.shard=true`)."""
    one = one_process_losses(tmp_path / "one", debug_data)
    assert sorted(one) == [1, 2, 3]
    replicated = run_two_nodes(tmp_path / "nodes", debug_data)
    sharded = run_two_nodes(tmp_path / "nodes_sharded", debug_data, "target.shard=true")
    for step, loss in one.items():
        assert replicated[step] == pytest.approx(loss, rel=1e-4), (step, replicated, one)
        assert sharded[step] == pytest.approx(loss, rel=1e-4), (step, sharded, one)
    assert one[3] != pytest.approx(one[1], rel=1e-3)  # the draft trained: the steps differ
