"""Regenerate assistant turns with the target (on-policy data), optionally tokenize them.

    python data_scripts/regenerate.py --target embedded --input embedded --split train \
        --output data/embedded-train --max-new-tokens 256 --tokenize

Backends: `--backend decoder` (default; dspark's static-cache decoder, `--batch-size` rows
live at once, 32, in prompt-length order, a finished row's slot taking the next prompt),
`--backend hf` (HF generate, the fallback), `--server URL` (vLLM / SGLang via the openai
client). Rerun the same command to resume after a kill. `--dtype auto` times the batched AR step in float32 and bfloat16 at `--batch-size`
(cached per CPU and target, dspark/dtype_probe.py) and regenerates in the faster, recorded in
`dtype_choice.json`. See dspark/data/regeneration/regenerate.py.
Console script: `dspark-regenerate` (dspark/cli.py).
"""

from dspark.cli import regenerate

if __name__ == "__main__":
    regenerate()
