"""optim.name=muon: which parameters Muon trains, one Muon step against a by-hand Newton-Schulz
reference, the schedule over both groups, exact resume, a tiny run that learns, bad values."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import debug_cfg, kill_then_resume, losses, make_draft
from omegaconf import OmegaConf

from dspark.errors import BadInputError
from dspark.training.optim import build_optimizer, warmup_cosine
from dspark.training.schema import OptimConfig

# Keller Jordan's quintic Newton-Schulz coefficients (the Muon post), written here, not imported
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def _optim(**kw):
    return OmegaConf.structured(OptimConfig(name="muon", **kw))


def _groups_by_name(model, optimizer) -> list[set[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [{names[id(p)] for p in g["params"]} for g in optimizer.param_groups]


def test_hidden_matrices_go_to_muon_and_the_rest_to_adamw(tiny_target):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, markov_head_type="gated", enable_confidence_head=True)
    adamw, muon = _groups_by_name(draft, build_optimizer(draft, _optim()))
    layer = "layers.0."
    assert muon == {
        "fc.weight",
        *(f"{layer}self_attn.{m}.weight" for m in ("q_proj", "k_proj", "v_proj", "o_proj")),
        *(f"{layer}mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")),
    }
    assert adamw == {
        "hidden_norm.weight",
        f"{layer}self_attn.q_norm.weight",
        f"{layer}self_attn.k_norm.weight",
        f"{layer}input_layernorm.weight",
        f"{layer}post_attention_layernorm.weight",
        "norm.weight",
        "markov_head.markov_w1.weight",  # [V, r], an embedding
        "markov_head.markov_w2.weight",  # [K, r], an output head
        "markov_head.gate_proj.weight",
        "markov_head.gate_proj.bias",
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
    }
    # the frozen copies of the target train in neither group
    assert not {"embed_tokens.weight", "lm_head.weight"} & (adamw | muon)


def test_lora_factors_train_with_adamw_so_muon_is_refused(tiny_target, tmp_path):
    from dspark.modeling.lora import apply_lora
    from dspark.training.muon import split_parameters

    target, tok = tiny_target("llama")
    draft = make_draft(target, tok)
    apply_lora(draft, r=4, alpha=8.0, target_modules=["q_proj", "down_proj"])
    muon, adamw = split_parameters(draft.named_parameters())
    assert muon == [] and adamw and all("lora_" in n for n, _ in adamw)
    with pytest.raises(ValueError, match="use optim.name=adamw"):
        build_optimizer(draft, _optim())
    with pytest.raises(BadInputError, match="optim.name=muon with draft.lora.r > 0"):
        debug_cfg(tmp_path, tmp_path / "data", "optim=muon", "draft.lora.r=16")


def _newton_schulz(g: torch.Tensor, steps: int, coefficients=NS_COEFFICIENTS) -> torch.Tensor:
    """X <- a X + (b A + c A^2) X with A = X X^T, from X = G / ||G||_F, in float64, on the wide
    orientation (the Gram matrix of the shorter side)."""
    a, b, c = coefficients
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _muon_reference(
    before,
    grads,
    lr,
    momentum,
    weight_decay,
    ns_steps=5,
    nesterov=True,
    shape_scale=True,
    coefficients=NS_COEFFICIENTS,
) -> list[torch.Tensor]:
    """The Muon paper's step for each (parameter before it, gradient): B <- mu B + g,
    u = g + mu B (Nesterov), O = NS(u), p <- p (1 - lr wd) - lr sqrt(max(1, rows/cols)) O."""
    buf = torch.zeros_like(grads[0], dtype=torch.float64)
    out = []
    for p, g in zip(before, grads):
        g = g.double()
        buf = momentum * buf + g
        u = g + momentum * buf if nesterov else buf
        rows, cols = p.shape
        scale = math.sqrt(max(1.0, rows / cols)) if shape_scale else 1.0
        o = _newton_schulz(u, ns_steps, coefficients)
        out.append(p.double() * (1 - lr * weight_decay) - lr * scale * o)
    return out


def _step_error(before, after, want) -> float:
    """The largest relative error of a step over the steps: |after - want| / |want - before|."""
    return max(
        float((a.double() - w).norm() / (w - b.double()).norm())
        for b, a, w in zip(before, after, want)
    )


def test_a_muon_step_is_the_orthogonalised_nesterov_momentum_update():
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.fc = torch.nn.Linear(10, 6, bias=False)  # wide [6, 10]
    model.layers = torch.nn.ModuleList([torch.nn.Linear(6, 10, bias=False)])  # tall [10, 6]
    model.head = torch.nn.Linear(6, 3)  # 2-D but not hidden: AdamW
    lr, ratio, mu, wd = 2e-3, 10.0, 0.95, 0.1
    opt = build_optimizer(
        model, _optim(lr=lr, muon_lr_ratio=ratio, muon_momentum=mu, muon_weight_decay=wd)
    )
    assert _groups_by_name(model, opt) == [{"head.weight", "head.bias"},
                                           {"fc.weight", "layers.0.weight"}]  # fmt: skip
    matrices = [model.fc.weight, model.layers[0].weight]
    before: dict[int, list] = {0: [], 1: []}
    after: dict[int, list] = {0: [], 1: []}
    grads: dict[int, list] = {0: [], 1: []}
    for _ in range(3):  # three steps: the momentum buffer carries over
        for i, w in enumerate(matrices):
            before[i].append(w.detach().clone())
            grads[i].append(torch.randn_like(w))
            w.grad = grads[i][-1].clone()
        for p in model.head.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        for i, w in enumerate(matrices):
            after[i].append(w.detach().clone())
    # torch runs Newton-Schulz in bf16: a step is within 3% of the float64 reference, while
    # each slip below (one NS step fewer, no Nesterov, no tall-matrix scale, no weight decay,
    # momentum 0.9, other coefficients) moves it by over 4.5%
    tol = 0.03
    muon_lr = lr * ratio
    for i in (0, 1):
        b, a, g = before[i], after[i], grads[i]
        assert _step_error(b, a, _muon_reference(b, g, muon_lr, mu, wd)) < tol
        slips = [
            {"ns_steps": 4},
            {"nesterov": False},
            {"weight_decay": 0.0},
            {"momentum": 0.9},
            {"coefficients": (3.0, -3.2, 1.2)},
            *([{"shape_scale": False}] if i == 1 else []),  # the scale is 1 for a wide matrix
        ]
        for slip in slips:
            kw = {"lr": muon_lr, "momentum": mu, "weight_decay": wd, **slip}
            assert _step_error(b, a, _muon_reference(b, g, **kw)) > 1.5 * tol, slip


def test_the_schedule_scales_both_groups_and_the_state_round_trips(tmp_path):
    torch.manual_seed(0)

    def model_and_opt():
        torch.manual_seed(0)
        m = torch.nn.Module()
        m.layers = torch.nn.ModuleList([torch.nn.Linear(8, 12)])  # weight: Muon, bias: AdamW
        return m, build_optimizer(m, _optim(lr=1e-3, muon_lr_ratio=7.0))

    def step(m, opt, sched, seed):
        gen = torch.Generator().manual_seed(seed)
        for p in m.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
        sched.step()

    m, opt = model_and_opt()
    sched = warmup_cosine(opt, total_steps=10, warmup_ratio=0.2)
    for s in range(4):
        adamw_lr, muon_lr = (g["lr"] for g in opt.param_groups)
        assert muon_lr == pytest.approx(7.0 * adamw_lr) and (s == 0 or adamw_lr > 0)
        assert opt.muon.param_groups[0]["lr"] == muon_lr  # the part steps with the shared group
        step(m, opt, sched, s)
    torch.save((opt.state_dict(), sched.state_dict()), tmp_path / "state.pt")

    m2, opt2 = model_and_opt()
    m2.load_state_dict(m.state_dict())
    sched2 = warmup_cosine(opt2, total_steps=10, warmup_ratio=0.2)
    saved_opt, saved_sched = torch.load(tmp_path / "state.pt", weights_only=True)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    for s in range(4, 6):
        step(m, opt, sched, s)
        step(m2, opt2, sched2, s)
    for (name, p), p2 in zip(m.named_parameters(), m2.parameters()):
        assert torch.equal(p, p2), name


SHORT = ("trainer.log_every=1", "trainer.eval_every=0")


def test_a_tiny_muon_run_learns_and_checkpoints_muon_state(tmp_path, debug_data):
    from dspark.training.loop import run

    cfg = debug_cfg(tmp_path, debug_data, "optim=muon", *SHORT, "trainer.max_steps=20",
                    "trainer.save_every=0", "data.shuffle=false")  # fmt: skip
    assert cfg.optim.name == "muon"
    run(cfg)
    got = losses(tmp_path)
    first, last = sum(got[s] for s in (1, 2, 3)) / 3, sum(got[s] for s in (18, 19, 20)) / 3
    assert last < 0.9 * first, got
    (ckpt,) = (tmp_path / "checkpoints").iterdir()
    state = torch.load(ckpt / "optimizer.bin", weights_only=True)
    adamw, muon = state["param_groups"]
    assert muon["lr"] == pytest.approx(cfg.optim.muon_lr_ratio * adamw["lr"])
    assert muon["ns_steps"] == 5 and len(muon["params"]) == 8  # fc + 7 matrices of one layer
    assert all("momentum_buffer" in state["state"][i] for i in muon["params"])
    assert all("exp_avg" in state["state"][i] for i in adamw["params"])


def test_a_resumed_muon_run_continues_exactly(tmp_path, debug_data, monkeypatch):
    from safetensors.torch import load_file

    from dspark.training import loop

    common = ("optim=muon", *SHORT, "trainer.max_steps=6", "trainer.save_every=3",
              "trainer.keep_last=3")  # fmt: skip
    loop.run(debug_cfg(tmp_path / "whole", debug_data, *common))

    # the 5th objective step raises: after the checkpoint at step 3
    split_cfg = debug_cfg(tmp_path / "split", debug_data, *common)
    res = kill_then_resume(monkeypatch, split_cfg, kill_at=5)
    assert res["resumed_from"].endswith("step_00000003")
    whole, split = losses(tmp_path / "whole"), losses(tmp_path / "split")
    for s in range(1, 7):
        assert split[s] == pytest.approx(whole[s], rel=1e-5, abs=1e-6), (s, split, whole)
    # the weights after the resumed steps: Muon's momentum and AdamW's moments were restored
    w_whole = load_file(str(tmp_path / "whole" / "draft" / "model.safetensors"))
    w_split = load_file(str(tmp_path / "split" / "draft" / "model.safetensors"))
    for k, v in w_whole.items():
        torch.testing.assert_close(w_split[k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_resuming_with_another_optimizer_is_refused(tmp_path):
    import json

    from dspark.training.run_dir import check_resume_config

    def config(**optim):
        return {"draft": {"num_hidden_layers": 1}, "target": {"name": "tiny-qwen3"},
                "optim": {"lr": 1e-3, **optim}}  # fmt: skip

    (tmp_path / "run_config.json").write_text(json.dumps(config(name="adamw")))
    with pytest.raises(BadInputError, match="optim.name: 'adamw' -> 'muon'"):
        check_resume_config(tmp_path, config(name="muon"))
    check_resume_config(tmp_path, config(name="adamw", lr=3e-4))  # other settings may change
    # a run recorded before optim.name existed trained with AdamW
    (tmp_path / "run_config.json").write_text(json.dumps(config()))
    check_resume_config(tmp_path, config(name="adamw"))
    with pytest.raises(BadInputError, match="optim.name: 'adamw' -> 'muon'"):
        check_resume_config(tmp_path, config(name="muon"))


def test_sharded_draft_optimizers_are_refused():
    from dspark.training.muon import check_distribution

    for kind in ("FSDP", "DEEPSPEED"):
        with pytest.raises(BadInputError, match=f"{kind} shards them"):
            check_distribution(kind)
    for kind in ("NO", "MULTI_CPU", "MULTI_GPU"):  # DDP: every rank holds whole gradients
        check_distribution(kind)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("optim.name=sgd", r"optim.name='sgd' is not one of \('adamw', 'muon'\)"),
        ("optim.muon_lr_ratio=0", "optim.muon_lr_ratio=0.0 is out of range"),
        ("optim.muon_momentum=-0.1", "optim.muon_momentum=-0.1 is out of range"),
        ("optim.muon_momentum=1", r"optim.muon_momentum=1.0 must be in \[0, 1\)"),
        ("optim.muon_weight_decay=-1", "optim.muon_weight_decay=-1.0 is out of range"),
        ("optim.muon_ns_steps=0", "optim.muon_ns_steps=0 is out of range"),
        ("optim.muon_ns_steps=100", "optim.muon_ns_steps=100 must be below 100"),
    ],
)
def test_bad_muon_values_are_one_user_error(override, needle, tmp_path):
    with pytest.raises(BadInputError, match=needle):
        debug_cfg(tmp_path, tmp_path / "data", "optim=muon", override)


def test_the_distill_job_prints_one_error_line_for_a_bad_muon_value(tmp_path, capsys):
    from helpers import compose_config

    import dspark.cli
    from dspark.errors import EXIT_USER_ERROR

    cfg = compose_config(["recipe=debug", f"trainer.output_dir={tmp_path}", "optim=muon",
                          "optim.muon_ns_steps=0"])  # fmt: skip
    with pytest.raises(SystemExit) as e:
        dspark.cli._distill_job(cfg)
    assert e.value.code == EXIT_USER_ERROR
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert lines == [
        "distill: error: optim.muon_ns_steps=0 is out of range: Muon's Newton-Schulz steps, >= 1"
    ]


def test_newton_schulz_in_bf16_is_torchs_own_iteration_and_fp32_is_closer_to_exact():
    from torch.optim._muon import _zeropower_via_newtonschulz as torch_ns

    from dspark.training.muon import newton_schulz

    torch.manual_seed(0)
    for shape in ((6, 10), (10, 6)):  # wide, tall
        g = torch.randn(*shape)
        exact = _newton_schulz(g, 5)
        ours_bf16 = newton_schulz(g, NS_COEFFICIENTS, 5, 1e-7, torch.bfloat16)
        assert torch.equal(ours_bf16, torch_ns(g, NS_COEFFICIENTS, 5, 1e-7))
        ours_fp32 = newton_schulz(g, NS_COEFFICIENTS, 5, 1e-7, torch.float32)
        assert ours_fp32.dtype == torch.float32 and ours_fp32.shape == g.shape
        err32 = float((ours_fp32.double() - exact).norm() / exact.norm())
        err16 = float((ours_bf16.double() - exact).norm() / exact.norm())
        assert err32 < 1e-5 < err16
        # one step fewer is far from both: the comparison can fail
        assert float((ours_fp32.double() - _newton_schulz(g, 4)).norm() / exact.norm()) > 1e-2


def test_newton_schulz_runs_in_fp32_on_cpus_without_native_bf16(tmp_path):
    from dspark.training.muon import newton_schulz_dtype

    avx2 = tmp_path / "avx2"
    avx2.write_text("processor : 0\nflags : fpu sse2 avx avx2 fma\n")
    amx = tmp_path / "amx"
    amx.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16 amx_bf16\n")
    cpu = torch.device("cpu")
    assert newton_schulz_dtype(cpu, str(avx2)) == torch.float32
    assert newton_schulz_dtype(cpu, str(amx)) == torch.bfloat16
    assert newton_schulz_dtype(torch.device("cuda"), str(avx2)) == torch.bfloat16


@pytest.mark.parametrize("ns_dtype", [torch.float32, torch.bfloat16])
def test_a_muon_step_iterates_in_the_chosen_dtype(ns_dtype):
    from dspark.training.muon import MuonWithAdamW

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 10))
    h = torch.nn.Parameter(torch.randn(3))
    opt = MuonWithAdamW(
        torch.optim.AdamW([h], lr=1e-3),
        torch.optim.Muon([w], lr=0.02, momentum=0.95, weight_decay=0.1),
        ns_dtype=ns_dtype,
    )
    before = w.detach().clone()
    w.grad, h.grad = torch.randn_like(w), torch.randn_like(h)
    want = _muon_reference([before], [w.grad.clone()], 0.02, 0.95, 0.1)
    opt.step()
    err = _step_error([before], [w.detach()], want)
    # fp32: the float64 reference to rounding; bf16 (torch's own): within its 3%
    assert err < (1e-4 if ns_dtype == torch.float32 else 0.03)
    import torch.optim._muon as m

    assert m._zeropower_via_newtonschulz.__module__ == "torch.optim._muon"  # restored
