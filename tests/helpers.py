"""Small builders shared by test modules (fixtures live in conftest.py)."""

import json
import os
import sys
from pathlib import Path

import torch

from dspark.config import DSparkConfig, choose_mask_token_id
from dspark.export.gguf import default_llama_cpp_dir
from dspark.modeling import DSparkDraftModel


def make_draft(target, tok, num_hidden_layers: int = 1, markov_rank: int = 8, **kw):
    """A randomly initialised (seed 0) draft for `target`, small unless told otherwise."""
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=num_hidden_layers,
        markov_rank=markov_rank,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
        **kw,
    )
    torch.manual_seed(0)
    return DSparkDraftModel.from_target(target, cfg)


CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides, return_hydra_config: bool = True):
    """The training run config for `overrides` (conf/ + recipes/), unchecked."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dspark.training.schema import register_configs

    GlobalHydra.instance().clear()
    register_configs(CONF.parent / "recipes")
    with initialize_config_dir(str(CONF), version_base=None):
        return compose("config", overrides=overrides, return_hydra_config=return_hydra_config)


def debug_cfg(tmp_path, data_dir, *overrides):
    """The debug recipe writing to `tmp_path` and training on `data_dir`, checked."""
    from dspark.training.schema import check

    base = ["recipe=debug", f"trainer.output_dir={tmp_path}", f"data.train={data_dir}"]
    cfg = compose_config([*base, *overrides], return_hydra_config=False)
    check(cfg)
    return cfg


def losses(out_dir):
    """{step: train/loss} of a run's metrics.jsonl."""
    rows = [json.loads(x) for x in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


# -- llama.cpp's own converter (tests/test_export_gguf.py, tests/test_llama_cpp_engine.py) --
# resolved at import, before conftest points DSPARK_CACHE at the session's private cache
REFERENCE = Path(os.environ.get("DSPARK_LLAMA_CPP_DIR") or default_llama_cpp_dir())
FETCH = f"{sys.executable} data_scripts/fetch_llama_cpp.py (or set DSPARK_LLAMA_CPP_DIR)"

# The converter picks `tokenizer.ggml.pre` by hashing how the tokenizer splits a fixed text,
# and knows only published vocabularies' hashes; a tiny target's 384-token vocabulary has
# none. Its pre-tokenizer is GPT-2's ByteLevel regex, llama.cpp's "gpt-2", so the run below
# answers that one look-up and leaves the rest of the converter as it is.
CONVERT = """import runpy, sys
ref = sys.argv.pop(1)
sys.path.insert(0, ref)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = ref + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def random_draft(target, tok, arch, **kw):
    kw.setdefault("block_size", 4)
    draft = make_draft(target, tok, num_hidden_layers=2, target_name_or_path=f"tiny-{arch}", **kw)
    with torch.no_grad():  # trained-looking weights (ones / zeros would hide swapped tensors)
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return draft.eval()
