"""Export drafts for serving engines (DeepSpec / vLLM / SGLang layout, speculators) and read
any supported layout back (`load_draft`). See `api.export_draft`."""

from dspark.export.api import FORMATS, NotServableError, OutputExistsError, export_draft
from dspark.export.checks import serving_problems
from dspark.export.load import layout_of, load_draft

__all__ = [
    "FORMATS",
    "NotServableError",
    "OutputExistsError",
    "export_draft",
    "layout_of",
    "load_draft",
    "serving_problems",
]
