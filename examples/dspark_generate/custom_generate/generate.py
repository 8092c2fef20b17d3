"""transformers `custom_generate` entry point: DSpark speculative decoding inside
`model.generate(..., custom_generate="examples/dspark_generate", trust_remote_code=True,
draft=DRAFT)`. Needs the `dspark` package importable (pip install -e . from the repo)."""

from dspark.hf_generate import generate as _dspark_generate


def generate(model, *args, **kwargs):
    return _dspark_generate(model, *args, **kwargs)
