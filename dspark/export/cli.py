"""Export a trained draft for serving engines (`data_scripts/export.py`, console `dspark-export`).

Parallels `dspark/data/cli.py` (the data steps' command lines); `dspark/cli.py` holds the
console entry points that call both.

python data_scripts/export.py runs/quickstart/draft exports/smollm2-dspark            # deepspec, bf16
python data_scripts/export.py runs/quickstart/draft exports/smollm2-spec --format speculators
python data_scripts/export.py DRAFT OUT --dtype float32 --engine any --target Qwen/Qwen3-8B
python data_scripts/export.py runs/quickstart/draft exports/smollm2-gguf --format gguf   # llama.cpp

The output directory holds config.json, model.safetensors, export.json (format, dtype, source,
dspark version) and a README.md with the exact `vllm serve ... --speculative-config '{...}'`
and SGLang commands (num_speculative_tokens = the draft's block size). A draft that vLLM /
SGLang would serve wrong (gated / rnn heads, ...) is refused with the reasons unless
--engine any. --format gguf writes draft.gguf (llama.cpp's `dflash` arch, --outtype) with the
target's tokenizer (--target: an HF dir, `embedded`, or the target's .gguf) and a README with
the llama-server command; what llama.cpp would serve wrong is refused. --overwrite replaces OUT only when it is a previous export (its export.json);
the source draft, a directory around or inside it and a training run directory are refused.
"""

import argparse

from dspark.export import export_draft
from dspark.export.gguf import OUTTYPES


def export_main(argv=None) -> int:
    """Parse `argv`, export, return 0. A refused export raises a `UserError` (bad draft,
    unservable draft, an OUT that must not be replaced), which `dspark.cli.export` prints as
    one `export: error: ...` line with exit status 2."""
    p = argparse.ArgumentParser(
        prog="export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("draft", help="draft directory (ours, DeepSpec or speculators layout)")
    p.add_argument("out", help="output directory (must not exist unless --overwrite)")
    p.add_argument("--format", default="deepspec", choices=["deepspec", "speculators", "gguf"])
    p.add_argument(
        "--outtype",
        default="f16",
        choices=OUTTYPES,
        help="GGUF tensor type (--format gguf)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads in the printed llama-server")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--engine",
        default="vllm",
        choices=["vllm", "any"],
        help="vllm: refuse drafts vLLM/SGLang serve wrong; any: write them anyway",
    )
    p.add_argument("--target", default=None, help="target name for engines (default: the draft's)")
    p.add_argument(
        "--draft-vocab",
        default=None,
        help="reduced draft vocabulary: .json ids / d2t, .safetensors or .pt (d2t or ids)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace OUT if it is a previous export"
    )
    a = p.parse_args(argv)

    out = export_draft(
        a.draft,
        a.out,
        a.format,
        dtype=a.dtype,
        engine=a.engine,
        verifier=a.target,
        draft_vocab=a.draft_vocab,
        overwrite=a.overwrite,
        gguf_outtype=a.outtype,
        threads=a.threads,
    )
    print(f"wrote {out}\n")
    print((out / "README.md").read_text())
    return 0
