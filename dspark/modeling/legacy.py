"""Convert a draft in the earlier per-family layout (`LlamaDSparkModel` / `Qwen2DSparkModel`,
decoder layers without q/k norms) to today's layout.

Those drafts used their target family's own layer style (no q/k norms; q/k/v biases for Qwen2
targets; an rnn head of another formula), which no engine serves. The conversion keeps every
tensor that still has a place, adds q/k norms at ones, drops q/k/v biases and an old-formula
rnn `joint_proj` (re-initialised), and says so: the result is a warm start to fine-tune
(`draft.init_from=NEW_DIR`), not the old function.

    python -m dspark.modeling.legacy OLD_DIR NEW_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from dspark.config import LEGACY_ARCHITECTURES, DSparkConfig
from dspark.modeling.draft import DSparkDraftModel


def convert_legacy_draft(src: str | Path, dst: str | Path) -> list[str]:
    """Write the converted draft to `dst` (atomically); return the notes on what changed."""
    src, dst = Path(src), Path(dst)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found: {src} is not a draft directory")
    raw = json.loads(cfg_path.read_text())
    archs = raw.get("architectures") or []
    if not any(a in LEGACY_ARCHITECTURES for a in archs):
        raise ValueError(f"{src} declares {archs}, not a legacy dspark draft: nothing to convert")
    if dst.exists():
        raise FileExistsError(f"{dst} exists; choose a new output directory")
    keep = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    keep["attention_bias"] = False
    config = DSparkConfig(**keep)
    model = DSparkDraftModel(config)
    state = load_file(str(src / "model.safetensors"))
    own = model.state_dict()
    notes = []
    dropped = sorted(k for k in state if k not in own)
    if dropped:
        notes.append(
            f"dropped {len(dropped)} tensors with no place in Qwen3-style layers: {dropped}"
        )
    loadable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    reshaped = sorted(k for k in state if k in own and own[k].shape != state[k].shape)
    if reshaped:
        notes.append(f"re-initialised (old formula, new shape): {reshaped}")
    missing = sorted(k for k in own if k not in loadable and k not in reshaped)
    if missing:
        notes.append(f"new tensors at their init (q/k norms at ones): {missing}")
    with torch.no_grad():
        model.load_state_dict(loadable, strict=False)
    tmp = Path(
        tempfile.mkdtemp(prefix=".convert-", dir=dst.parent if dst.parent.exists() else None)
    )
    try:
        model.save_pretrained(tmp)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return notes


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m dspark.modeling.legacy OLD_DIR NEW_DIR", file=sys.stderr)
        return 2
    for note in convert_legacy_draft(*args):
        print(note)
    print(f"wrote {args[1]}: fine-tune it (draft.init_from={args[1]}) before serving")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
