"""Independent check of the speculators export: the `speculators` package itself loads it.

python eval/check_speculators.py                     # tiny Qwen3 + tiny Llama targets
python eval/check_speculators.py --arch llama --out runs/speculators_check

Builds a random draft for each tiny target, exports it (speculators format, float32), then in a
separate venv with speculators 0.9 (created at --venv when missing: torch 2.13 first, then
speculators, then torchvision / torchaudio removed) loads it with
`speculators.models.dspark.DSparkDraftModel` and compares: the tensors it holds vs the file,
its tapped features (from HF hidden_states at aux_hidden_state_layer_ids) vs dspark's capture,
and its Markov-corrected draft logits and confidence logits on a sequence (every position an
anchor) vs dspark's. Writes <out>/speculators_check.json and .md.
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


def check_arch(arch: str, out: Path, py: Path) -> dict:
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
    export = export_draft(
        draft, out / f"export-{arch}", "speculators", dtype="float32", overwrite=True
    )
    ids = tok("def add(a, b):\n    return a + b. The answer is 42.", return_tensors="pt")[
        "input_ids"
    ][:, :24]
    ours = all_anchor_outputs(draft, target, ids)
    save_file({"input_ids": ids.contiguous()}, str(out / f"inputs-{arch}.safetensors"))
    res = subprocess.run(
        [
            str(py),
            str(Path(__file__).with_name("speculators_child.py")),
            str(export),
            str(out / f"inputs-{arch}.safetensors"),
            str(out / f"theirs-{arch}.safetensors"),
        ],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise RuntimeError(f"speculators child failed:\n{res.stderr[-4000:]}")
    report = json.loads(res.stdout.strip().splitlines()[-1])
    theirs = load_file(str(out / f"theirs-{arch}.safetensors"))
    diff = {
        k: float((ours[k] - theirs[k]).abs().max())
        for k in ("tapped", "logits", "confidence_logits")
    }
    same_top1 = bool((ours["logits"].argmax(-1) == theirs["logits"].argmax(-1)).all())
    return {
        "arch": arch,
        **report,
        "max_abs_diff": diff,
        "same_argmax": same_top1,
        "positions": int(ours["logits"].shape[0]),
        "logit_scale": float(ours["logits"].abs().max()),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--arch", nargs="+", default=["qwen3", "llama"])
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
    ok = all(
        r["max_abs_diff"]["logits"] < 1e-3
        and r["max_abs_diff_tensors"] == 0
        and not r["missing_in_model"]
        and r["same_argmax"]
        for r in results
    )
    summary = {
        "speculators/transformers/torch": version,
        "conditions": "CPU, float32, 1 thread, random tiny drafts (2 layers, block 4, rank 16)",
        "ok": ok,
        "results": results,
    }
    (out / "speculators_check.json").write_text(json.dumps(summary, indent=2))
    rows = [
        "| target | class | tensors | max diff tensors | tapped | logits | confidence | same argmax |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d = r["max_abs_diff"]
        rows.append(
            f"| tiny-{r['arch']} | {r['class']} | {r['tensors_in_file']} | {r['max_abs_diff_tensors']:.1e} | {d['tapped']:.1e} | {d['logits']:.1e} | {d['confidence_logits']:.1e} | {r['same_argmax']} |"
        )
    md = (
        f"# speculators check ({version})\n\n{summary['conditions']}\n\n"
        + "\n".join(rows)
        + f"\n\nok: {ok}\n"
    )
    (out / "speculators_check.md").write_text(md)
    print(md)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
