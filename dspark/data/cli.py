"""The command line behind data_scripts/regenerate.py (the tokenize one: tokenize_cli.py).

Parallels `dspark/export/cli.py` (export's command line); `dspark/cli.py` holds the console
entry points that call both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from dspark.data.prompts.prompt_set import RowSelection, require_rows
from dspark.data.prompts.sources import load_prompts
from dspark.data.regeneration.openai_backend import OpenAIBackend
from dspark.data.regeneration.regenerate import regenerate
from dspark.data.regeneration.run_files import AGREEMENT, SUMMARY, check_output, run_settings
from dspark.data.regeneration.sampling import SamplingConfig
from dspark.data.tokenize import check_tokenized_output, tokenize_file
from dspark.data.tokenize_cli import json_arg, print_tokenized, tokenize_args
from dspark.errors import EXIT_UNFINISHED
from dspark.locking import exclusive_output

TARGET_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")


def check_device(p: argparse.ArgumentParser, device: str | None, key: str = "--device") -> None:
    """`p.error` (one line, status 2) for a device torch does not know or this machine lacks."""
    if device is None:
        return
    import torch  # after argument parsing: --help stays instant

    try:
        dev = torch.device(device)
    except RuntimeError:
        p.error(f"{key} {device!r}: not a device; use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            p.error(f"{key} {device}: this machine has no CUDA device; use --device cpu")
        if dev.index is not None and dev.index >= n:
            p.error(f"{key} {device}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")


def regenerate_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Regenerate every assistant turn of a prompt set with the target "
        "(resumable: rerun the same command to continue)."
    )
    p.add_argument(
        "--target",
        default="embedded",
        help="embedded | tiny-llama|tiny-qwen2|tiny-qwen3 | model dir | hub id",
    )
    p.add_argument(
        "--input",
        default="embedded",
        help="embedded | a .json/.jsonl/.parquet/.arrow file | a dataset dir | hub name",
    )
    p.add_argument("--split", default="train")
    p.add_argument("--config-name", default=None, help="hub dataset config name")
    p.add_argument("--output", required=True, help="output directory")
    p.add_argument("--limit", type=int, default=None, help="use the first N (selected) source rows")
    p.add_argument(
        "--grow",
        type=int,
        default=None,
        metavar="N",
        help="N more rows than the output's last run took (its summary.json), i.e. --limit "
        "of that run + N; on a new output, --limit N",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="MINUTES",
        help="stop at the first chunk boundary past this many minutes, exit "
        f"{EXIT_UNFINISHED}; rerun the same command to continue (a long build in bounded steps)",
    )
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        help="skip the first N source rows (e.g. rows an earlier job regenerated into another dir)",
    )
    p.add_argument(
        "--where",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="keep only rows whose field KEY equals VALUE, e.g. source=gsm8k-train (repeatable)",
    )
    p.add_argument(
        "--backend",
        default="decoder",
        choices=("decoder", "hf", "llama-cpp"),
        help="decoder: dspark's static-cache decoder, batched continuously in prompt-length "
        "order (fast); hf: batched HF generate (the fallback); llama-cpp: llama.cpp's server "
        "on the target's GGUF, --batch-size slots (docs/usage.md). --server overrides them",
    )
    p.add_argument(
        "--target-gguf",
        default=None,
        help="llama-cpp: the GGUF llama.cpp serves (default: the embedded target's own file); "
        "--target names its HF tokenizer and the bundled reference",
    )
    p.add_argument(
        "--server-bin",
        default="auto",
        help="llama-cpp: auto (the llama-server `make llama-server` built for this CPU, else "
        "xllamacpp in process) | xllamacpp | a llama-server binary",
    )
    p.add_argument(
        "--slot-ctx",
        type=int,
        default=2048,
        help="llama-cpp: context tokens per slot (prompt + answer; -c is slots x this)",
    )
    p.add_argument(
        "--agreement-rows",
        type=int,
        default=8,
        help="llama-cpp: on a new output, answer this many first rows greedily with both "
        "llama.cpp and the bundled target and record how far they agree (agreement.json); 0: "
        "skip",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows decoded together (default: 32 for the decoder backend, whose finished rows "
        "take the next waiting ones; 8 for hf), llama.cpp slots (default 8) or "
        "concurrent requests to --server (default 8)",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=None,
        help="rows handed to the backend at once and written together when done; the decoder "
        "sorts them by prompt length and keeps --batch-size of them decoding (default: 4 x batch size for the decoder, "
        "the batch size otherwise)",
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if any)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=TARGET_DTYPES,
        help="float32 | bfloat16 | float16 | auto (a short probe of the batched AR step in "
        "float32 and bfloat16 picks the faster, cached per device; default: bfloat16 on GPU, "
        "float32 on CPU)",
    )
    p.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice; use fewer on a shared CPU)",
    )
    p.add_argument(
        "--server",
        default=None,
        help="URL of an OpenAI-compatible server (vLLM/SGLang), e.g. http://127.0.0.1:8000",
    )
    p.add_argument("--server-model", default=None, help="model name on the server")
    p.add_argument("--server-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument(
        "--server-retries", type=int, default=2, help="retries per request (429 / 5xx / network)"
    )
    p.add_argument(
        "--keep-reasoning",
        action="store_true",
        help="keep the server's reasoning_content (vLLM/SGLang reasoning parsers) as the "
        "assistant message's `reasoning_content` field",
    )
    p.add_argument(
        "--chat-template-kwargs",
        type=json_arg,
        default=None,
        help="JSON passed to the chat template, e.g. '{\"enable_thinking\": false}'",
    )
    p.add_argument(
        "--tokenize", action="store_true", help="also write the tokenized set to OUTPUT/tokenized"
    )
    p.add_argument("--no-progress", action="store_true")
    tokenize_args(p)
    a = p.parse_args(argv)
    if a.max_new_tokens < 1:
        p.error(f"--max-new-tokens {a.max_new_tokens}: must be >= 1")
    if a.temperature < 0 or not 0 < a.top_p <= 1 or a.top_k < 0:
        p.error("--temperature must be >= 0 (0 = greedy), --top-p in (0, 1], --top-k >= 0")
    if not a.server:
        check_device(p, a.device)
    if a.max_length < 1:
        p.error(f"--max-length {a.max_length}: must be >= 1")
    if a.grow is not None and (a.limit is not None or a.grow < 1):
        p.error("--grow N takes N >= 1 and replaces --limit; pass one of them")
    if a.stop_after is not None and a.stop_after <= 0:
        p.error(f"--stop-after {a.stop_after}: must be > 0 minutes")
    if a.slot_ctx < 16 or a.agreement_rows < 0:
        p.error("--slot-ctx must be >= 16 and --agreement-rows >= 0")
    if a.target_gguf and not Path(a.target_gguf).is_file():
        p.error(f"--target-gguf {a.target_gguf}: no such file")
    # Held before the prompts and the target load (minutes): a second job on the same
    # output is refused at once.
    with exclusive_output(a.output, "the regeneration output"):
        return _regenerate(p, a)


def _regenerate(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    import torch  # after argument parsing: --help stays instant

    if a.num_threads:
        torch.set_num_threads(a.num_threads)
    # The output is checked before the prompts and the target load, which can take minutes.
    check_output(a.output)
    if a.tokenize:
        check_tokenized_output(Path(a.output) / "tokenized", key="--output (its tokenized/)")
    if a.grow is not None:
        a.limit = rows_of_last_run(Path(a.output)) + a.grow
        print(f"--grow {a.grow}: the first {a.limit} selected rows", file=sys.stderr)
    selection = RowSelection.parse(limit=a.limit, skip=a.skip, where=a.where)
    prompts = load_prompts(a.input, split=a.split, name=a.config_name, selection=selection)
    require_rows(prompts, a.input, "--input", selection)
    for note in prompts.notes:
        print("note:", note, file=sys.stderr)
    if prompts.rejected:
        print(
            f"{len(prompts.rejected)} input rows rejected (see {a.output}/rejected.jsonl); "
            f"first: row {prompts.rejected[0].index}: {prompts.rejected[0].reason}",
            file=sys.stderr,
        )
    sampling = SamplingConfig(
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        max_new_tokens=a.max_new_tokens,
        seed=a.seed,
    )
    tokenizer = None
    backend_name = "server" if a.server else a.backend
    batch = a.batch_size or (32 if backend_name == "decoder" else 8)
    # a chunk is written when its last row ends: backends that keep their batch full (a
    # finished row's slot taking the next) get several batches' worth per chunk
    chunk = a.chunk_rows or (4 * batch if backend_name in ("decoder", "llama-cpp") else batch)
    if batch < 1 or chunk < 1:
        p.error("--batch-size and --chunk-rows must be >= 1")
    backend: Any  # one of the backends, by the flags
    if a.server:
        backend = OpenAIBackend(
            a.server,
            model=a.server_model,
            timeout=a.server_timeout,
            retries=a.server_retries,
            chat_template_kwargs=a.chat_template_kwargs,
            max_workers=batch,
            keep_reasoning=a.keep_reasoning,
        )
        generator = f"server:{a.server}#{backend.model}"
    elif a.backend == "llama-cpp":
        from dspark.data.regeneration.llama_cpp_backend import (  # after argument parsing: --help stays instant
            open_backend,
            probe_agreement,
        )

        llama = open_backend(
            a.target,
            a.target_gguf,
            a.server_bin,
            a.num_threads or os.cpu_count() or 1,
            slots=batch,
            slot_ctx=a.slot_ctx,
            chat_template_kwargs=a.chat_template_kwargs,
        )
        backend = llama
        generator = f"llama-cpp:{os.path.basename(llama.settings.target_gguf)}"
        check_output(a.output, run_settings(prompts, sampling, settings_of(a, generator)))
        tokenizer = llama.tok
        if a.agreement_rows and not (Path(a.output) / AGREEMENT).exists():
            probe_agreement(llama, a.target, prompts.rows[: a.agreement_rows], sampling,
                            Path(a.output) / AGREEMENT)  # fmt: skip
    else:
        from dspark.target import load_target  # after argument parsing: --help stays instant

        generator = f"{a.backend}:{a.target}"
        # An earlier run with other settings is refused before the target loads.
        check_output(a.output, run_settings(prompts, sampling, settings_of(a, generator)))
        device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = a.dtype or ("bfloat16" if str(device).startswith("cuda") else "float32")
        # auto: loaded in fp32, then cast to the dtype whose batched AR step measured fastest
        load_dtype = "float32" if dtype == "auto" else dtype
        model, tokenizer = load_target(a.target, dtype=load_dtype, device=device)
        if dtype == "auto":
            from dspark.dtype_probe import (  # after argument parsing: --help stays instant
                cast_to_fastest,
            )

            cast_to_fastest(model, job="plain", batch=batch, out_dir=a.output)
        backend = make_local_backend(
            a.backend, model, tokenizer, a.chat_template_kwargs, batch_size=batch
        )
    settings = settings_of(a, generator)
    try:
        summary = regenerate(
            prompts,
            backend,
            a.output,
            sampling=sampling,
            batch_size=chunk,
            settings=settings,
            progress=not a.no_progress,
            stop_after_s=None if a.stop_after is None else a.stop_after * 60,
        )
    finally:
        if hasattr(backend, "close"):
            backend.close()  # a llama.cpp server stops with the job
    if not summary["complete"]:
        return EXIT_UNFINISHED  # --tokenize waits for the finished set
    if a.tokenize:
        stats = tokenize_file(
            str(Path(a.output) / "regenerated.jsonl"),
            str(Path(a.output) / "tokenized"),
            target=a.target,
            max_length=a.max_length,
            method=a.mask_method,
            chat_template_kwargs=a.chat_template_kwargs,
            tokenizer=tokenizer,
        )
        print_tokenized(stats, Path(a.output) / "tokenized")
    return 0


def rows_of_last_run(out: Path) -> int:
    """The selected rows (`rows_total`) the last regeneration into `out` took; 0 for none."""
    try:
        return int(json.loads((out / SUMMARY).read_text())["rows_total"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def settings_of(a: argparse.Namespace, generator: str) -> dict:
    """The command line's part of `run.json` (the source and sampling join in regenerate)."""
    return {
        "target": a.target,
        "generator": generator,
        "split": a.split,
        "chat_template_kwargs": a.chat_template_kwargs or {},
        **({"keep_reasoning": True} if a.keep_reasoning else {}),  # absent = old runs resume
    }


def make_local_backend(name: str, model, tokenizer, chat_template_kwargs=None, batch_size=32):
    """`decoder` (dspark's static-cache batched decoder) or `hf` (batched HF generate)."""
    if name == "decoder":
        from dspark.data.regeneration.decoder_backend import (  # after argument parsing: --help stays instant
            DecoderBackend,
        )

        return DecoderBackend(model, tokenizer, chat_template_kwargs, batch_size=batch_size)
    if name == "hf":
        from dspark.data.regeneration.hf_backend import (  # after argument parsing: --help stays instant
            HFBackend,
        )

        return HFBackend(model, tokenizer, chat_template_kwargs=chat_template_kwargs)
    raise ValueError(f"unknown regeneration backend {name!r}; use decoder or hf")


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
