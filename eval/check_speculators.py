"""Independent check of the speculators export: the `speculators` package itself loads it.

python eval/check_speculators.py                     # tiny Qwen3 + tiny Llama targets
python eval/check_speculators.py --arch llama --out runs/speculators_check

Builds a random draft for each tiny target, exports it (speculators format, float32), then in a
separate venv with speculators 0.9 (created at --venv when missing: torch 2.13 first, then
speculators, whose install moves torch to the newest release its pin allows, 2.14.1 on
2026-12-01, then torchvision / torchaudio removed; the JSON records the versions) loads it with
`speculators.models.dspark.DSparkDraftModel` and compares: the tensors it holds vs the file,
its tapped features (from HF hidden_states at aux_hidden_state_layer_ids) vs dspark's capture,
and its Markov-corrected draft logits and confidence logits on a sequence (every position an
anchor) vs dspark's. Writes <out>/speculators_check.json and .md.

Reduced draft vocabulary (--reduced-arch, default qwen3): speculators 0.9 supports it for
DSpark (`DSparkDraftModel` inherits `DraftVocabMixin._init_vocab`, speculators/model.py: `d2t
[K]` / `t2d [V]` buffers, `lm_head` [K, H] kept from the checkpoint; its `MarkovHead` has
`markov_w1` over the verifier vocabulary and `markov_w2` [K, r], models/dspark/core.py). That
arm exports the reduced twin of the full random draft (`from_target(..., kept_ids=)`, then the
full draft's weights with `lm_head` / `markov_w2` at the kept rows) and compares speculators'
[., K] logits with dspark's reduced draft, and, through the d2t speculators holds, with the
full draft's logits at the kept target ids; the top-1 draft ids mapped to target ids
(id + d2t[id]) must be dspark's `to_target_ids`.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

VENV_STEPS = (
    ["pip", "install", "-q", "torch==2.13.0"],
    ["pip", "install", "-q", "speculators==0.9.*"],
    ["pip", "uninstall", "-y", "-q", "torchvision", "torchaudio"],
)


def ensure_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        for step in VENV_STEPS:
            subprocess.run([str(venv / "bin" / step[0]), *step[1:]], check=step[1] != "uninstall")
    return py


KEPT_SEED = 0


def kept_target_ids(vocab_size: int, k: int, mask_token_id: int):
    """`k` sorted target ids, seeded; the mask token (an input id only) is left out."""
    import torch

    g = torch.Generator().manual_seed(KEPT_SEED)
    ids = [i for i in torch.randperm(vocab_size, generator=g).tolist() if i != mask_token_id]
    return torch.tensor(sorted(ids[:k]))


def reduced_twin(draft, target, kept):
    """`draft` restricted to the target ids `kept`: built by `from_target(kept_ids=)` (the
    target head's rows, d2t / t2d), then every other weight of `draft`, its `markov_w2` at the
    kept rows (increasing target-id order)."""
    import copy

    from dspark.modeling import DSparkDraftModel

    cfg = copy.deepcopy(draft.config)
    cfg.draft_vocab_size = int(kept.numel())
    red = DSparkDraftModel.from_target(target, cfg, kept_ids=kept)
    weights = dict(draft.state_dict())
    for name in ("lm_head.weight", "markov_head.markov_w2.weight"):
        weights[name] = weights[name][kept]
    weights["d2t"], weights["t2d"] = red.d2t, red.t2d
    red.load_state_dict(weights)
    return red.eval()


def check_arch(arch: str, out: Path, py: Path, vocab: str = "full") -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    from dspark.config import DSparkConfig, choose_mask_token_id
    from dspark.export import export_draft
    from dspark.export.reference import all_anchor_outputs
    from dspark.modeling import DSparkDraftModel
    from dspark.target import load_target

    target, tok = load_target(f"tiny-{arch}")
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=2,
        markov_rank=16,
        block_size=4,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
        target_name_or_path=f"tiny-{arch}",
    )
    torch.manual_seed(0)
    draft = DSparkDraftModel.from_target(target, cfg).eval()
    with torch.no_grad():  # no trivial (ones / zeros) tensors that would hide a swap
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    ids = tok("def add(a, b):\n    return a + b. The answer is 42.", return_tensors="pt")[
        "input_ids"
    ][:, :24]
    full = None
    if vocab == "reduced":
        V = int(cfg.vocab_size)
        kept = kept_target_ids(V, V // 4, int(cfg.mask_token_id))
        full = all_anchor_outputs(draft, target, ids)
        draft = reduced_twin(draft, target, kept)
        assert draft.config.draft_vocab_size == kept.numel()
    name = arch if vocab == "full" else f"{arch}-reduced"
    export = export_draft(
        draft, out / f"export-{name}", "speculators", dtype="float32", overwrite=True
    )
    ours = all_anchor_outputs(draft, target, ids)
    save_file({"input_ids": ids.contiguous()}, str(out / f"inputs-{name}.safetensors"))
    res = subprocess.run(
        [
            str(py),
            str(Path(__file__).with_name("speculators_child.py")),
            str(export),
            str(out / f"inputs-{name}.safetensors"),
            str(out / f"theirs-{name}.safetensors"),
        ],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise RuntimeError(f"speculators child failed:\n{res.stderr[-4000:]}")
    report = json.loads(res.stdout.strip().splitlines()[-1])
    theirs = load_file(str(out / f"theirs-{name}.safetensors"))
    if theirs["logits"].shape != ours["logits"].shape:
        raise RuntimeError(
            f"speculators' logits are {tuple(theirs['logits'].shape)}, dspark's "
            f"{tuple(ours['logits'].shape)}"
        )
    diff = {
        k: float((ours[k] - theirs[k]).abs().max())
        for k in ("tapped", "logits", "confidence_logits")
    }
    same_top1 = bool((ours["logits"].argmax(-1) == theirs["logits"].argmax(-1)).all())
    row = {
        "arch": arch,
        "vocab": vocab,
        **report,
        "draft_vocab_size": int(ours["logits"].shape[-1]),
        "max_abs_diff": diff,
        "same_argmax": same_top1,
        "positions": int(ours["logits"].shape[0]),
        "logit_scale": float(ours["logits"].abs().max()),
    }
    if vocab == "reduced":
        # speculators' d2t (the buffer it loaded: max_abs_diff_tensors covers it) maps its
        # draft ids to target ids; dspark's full draft scores those target ids the same way
        assert full is not None
        full_logits = full["logits"]
        d2t = load_file(str(export / "model.safetensors"))["d2t"]
        K = d2t.numel()
        their_ids = d2t + torch.arange(K)
        top = theirs["logits"].argmax(-1)
        row["d2t_is_kept_ids"] = bool(torch.equal(their_ids, kept))
        row["same_target_top1"] = bool(
            torch.equal(top + d2t[top], draft.to_target_ids(ours["logits"].argmax(-1)))
        )
        row["max_abs_diff"]["logits_vs_full_at_d2t"] = float(
            (full_logits[:, their_ids] - theirs["logits"]).abs().max()
        )
    return row


def passed(r: dict) -> bool:
    ok = (
        r["max_abs_diff"]["logits"] < 1e-3
        and r["max_abs_diff"]["confidence_logits"] < 1e-3
        and r["max_abs_diff_tensors"] == 0
        and not r["missing_in_model"]
        and r["same_argmax"]
    )
    if r["vocab"] == "reduced":
        ok = ok and (
            r["d2t_is_kept_ids"]
            and r["same_target_top1"]
            and r["max_abs_diff"]["logits_vs_full_at_d2t"] < 1e-3
        )
    return bool(ok)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--arch", nargs="+", default=["qwen3", "llama"])
    p.add_argument(
        "--reduced-arch",
        nargs="*",
        default=["qwen3"],
        help="targets of the reduced-vocabulary arm (K = V/4); none to skip it",
    )
    p.add_argument("--venv", default="/work/spec-venv")
    p.add_argument("--out", default="runs/speculators_check")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    py = ensure_venv(Path(a.venv))
    version = subprocess.run(
        [
            str(py),
            "-c",
            "from importlib.metadata import version as v; print(v('speculators'), v('transformers'), v('torch'))",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    results = [check_arch(arch, out, py) for arch in a.arch]
    results += [check_arch(arch, out, py, "reduced") for arch in a.reduced_arch]
    for r in results:
        r["ok"] = passed(r)
    ok = all(r["ok"] for r in results)
    summary = {
        "speculators/transformers/torch": version,
        "conditions": "CPU, float32, 1 thread, random tiny drafts (2 layers, block 4, rank 16)",
        "reduced_vocab": (
            "supported by speculators 0.9's DSpark model (DraftVocabMixin: d2t [K] / t2d [V] "
            "buffers, lm_head [K, H] from the checkpoint, MarkovHead.markov_w2 [K, r]); the "
            "reduced arm keeps K = V/4 target ids"
        ),
        "ok": ok,
        "results": results,
    }
    (out / "speculators_check.json").write_text(json.dumps(summary, indent=2))
    rows = [
        "| target | vocab (K) | class | tensors | max diff tensors | tapped | logits | confidence | same argmax | ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d = r["max_abs_diff"]
        rows.append(
            f"| tiny-{r['arch']} | {r['vocab']} ({r['draft_vocab_size']}) | {r['class']} | {r['tensors_in_file']} | {r['max_abs_diff_tensors']:.1e} | {d['tapped']:.1e} | {d['logits']:.1e} | {d['confidence_logits']:.1e} | {r['same_argmax']} | {r['ok']} |"
        )
    reduced = [
        f"- tiny-{r['arch']}, K={r['draft_vocab_size']}: d2t = the kept ids {r['d2t_is_kept_ids']}; "
        f"speculators' logits vs dspark's full draft at target ids d2t + arange(K): "
        f"{d['logits_vs_full_at_d2t']:.1e}; top-1 through d2t = dspark's target ids "
        f"{r['same_target_top1']}"
        for r in results
        if r["vocab"] == "reduced"
        for d in [r["max_abs_diff"]]
    ]
    md = (
        f"# speculators check ({version})\n\n{summary['conditions']}\n\n"
        + "\n".join(rows)
        + f"\n\nReduced draft vocabulary: {summary['reduced_vocab']}.\n\n"
        + "\n".join(reduced)
        + f"\n\nok: {ok}\n"
    )
    (out / "speculators_check.md").write_text(md)
    print(md)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
