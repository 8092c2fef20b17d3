"""Export a trained draft for serving engines (DeepSpec / vLLM / SGLang layout, speculators).

    python data_scripts/export.py runs/quickstart/draft exports/smollm2-dspark        # deepspec
    python data_scripts/export.py runs/quickstart/draft exports/smollm2-spec --format speculators

Flags and what is written: `python data_scripts/export.py --help` (dspark/export/cli.py).
Console script: `dspark-export` (dspark/cli.py).
"""

from dspark.cli import export

if __name__ == "__main__":
    export()
