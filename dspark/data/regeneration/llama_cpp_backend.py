"""`LlamaCppBackend`: regeneration by llama.cpp's server on the target's GGUF.

Why: on a CPU, llama.cpp decodes a quantized GGUF in its own kernels, and its `-np` slots batch
the requests sent concurrently (continuous batching), so a data build can run faster there
than on the bundled decoder. For a target served as a GGUF, answers written by that same GGUF
are exactly the served model's (on-policy for what users run).

Prompts are the ids `DecoderBackend` feeds (the HF chat template, no added specials) sent to
llama.cpp's native `/completion` with `return_tokens`, so both backends decode the same tokens
and their answers can be compared token for token; the reply's ids (a final end-of-generation
id included, as llama.cpp returns it) are cut at the stop ids like the decoder's.

Sampling: greedy at T = 0; otherwise only llama.cpp's temperature, top-k and top-p samplers
run, in the bundled decoder's order (llama.cpp's defaults would add min-p 0.05 and top-k 40,
which the other backends do not apply), seeded per row with `row_seed`, so a row's answer depends on its own seed, not on its slot or
neighbours. llama.cpp's random stream differs from torch's: sampled rows differ between
backends, drawn from the same warped distribution.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from dspark.data.regeneration.decoder_backend import DecoderBackend
from dspark.data.regeneration.sampling import (
    GenerationFailed,
    SamplingConfig,
    TokenIdBackend,
    stop_token_ids,
)
from dspark.engines.llama_server import (
    EngineSettings,
    Server,
    engine_conditions,
    native_server_bin,
    open_server,
    target_gguf_of,
)
from dspark.errors import MissingPathError
from dspark.fileio import write_text_atomic
from dspark.target import load_target, load_tokenizer

# llama.cpp's seed field is a uint32; LLAMA_DEFAULT_SEED (0xFFFFFFFF) means "random"
SEED_MODULUS = 0xFFFFFFFF


def completion_body(prompt: list[int], seed: int, sampling: SamplingConfig) -> dict:
    """The `/completion` request for one row: its ids, its seed, only the samplers asked for."""
    body: dict = {
        "prompt": list(prompt),
        "n_predict": sampling.max_new_tokens,
        "return_tokens": True,
        "cache_prompt": False,
        "seed": int(seed) % SEED_MODULUS,
    }
    if sampling.temperature <= 0:
        return body | {"temperature": 0.0, "top_k": 1, "samplers": ["top_k"]}
    return body | {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,  # 0: off in llama.cpp too
        "top_p": sampling.top_p,
        "min_p": 0.0,
        # the bundled decoder's order (dspark/decoding/sampling.py `warp`): scale, then cut
        "samplers": ["temperature", "top_k", "top_p"],
    }


class LlamaCppBackend(TokenIdBackend):
    """Answer chat prompts with llama.cpp's server, `settings.parallel` requests in flight.

    `generate(convs, seeds, sampling)` returns one `Reply` per conversation, or a
    `GenerationFailed` for a row the server could not answer (prompt too long for a slot, a
    server error), so one bad row never fails its neighbours.
    """

    name = "llama-cpp"

    def __init__(self, settings: EngineSettings, tokenizer, chat_template_kwargs=None, server=None):
        self.settings = settings
        self.tok = tokenizer
        self.kw = chat_template_kwargs or {}
        self.stop_ids = stop_token_ids(tokenizer, self.kw)
        self.server: Server = server or open_server(settings)
        self.slot_ctx = settings.ctx // max(1, settings.parallel)  # llama.cpp splits -c per slot

    def conditions(self) -> dict:
        """What the answers depend on: the engine, its build, threads, slots, the GGUF's quant."""
        return engine_conditions(self.settings)

    def _one(self, prompt: list[int], seed: int, s: SamplingConfig) -> list[int] | GenerationFailed:
        if not prompt:
            return GenerationFailed("the chat template rendered an empty prompt")
        if len(prompt) + s.max_new_tokens > self.slot_ctx:
            return GenerationFailed(
                f"prompt of {len(prompt)} tokens + max_new_tokens {s.max_new_tokens} exceeds a "
                f"llama.cpp slot's context {self.slot_ctx} (-c / -np); raise --slot-ctx or "
                "lower --max-new-tokens"
            )
        try:
            reply = self.server.post("/completion", completion_body(prompt, seed, s))
        except OSError as e:  # HTTP errors are OSErrors (urllib)
            return GenerationFailed(f"llama.cpp server: {type(e).__name__}: {e}")
        tokens = reply.get("tokens")
        if not isinstance(tokens, list):
            return GenerationFailed(f"llama.cpp answered without tokens: {str(reply)[:300]}")
        stop = set(self.stop_ids)
        cut = next((j for j, t in enumerate(tokens) if t in stop), None)
        return [int(t) for t in (tokens if cut is None else tokens[: cut + 1])]

    def generate_ids(
        self, ids: list[list[int]], seeds, sampling: SamplingConfig
    ) -> list[list[int] | GenerationFailed]:
        """Generated ids per prompt (a final stop id included), in the order of `ids`."""
        if not ids:
            return []
        workers = max(1, min(self.settings.parallel, len(ids)))
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda a: self._one(a[0], a[1], sampling), zip(ids, seeds)))

    def server_cpu_s(self) -> float | None:
        """CPU seconds the engine spent outside this process so far: a native server's (0.0 for
        xllamacpp, which decodes in this process's own threads); None where it cannot be read."""
        return self.server.cpu_seconds()

    def close(self) -> None:
        self.server.close()


def resolve_server_bin(choice: str | None) -> str | None:
    """`--server-bin`: auto (the native build `make llama-server` made, else xllamacpp),
    xllamacpp (in process), or a llama-server binary's path. None means xllamacpp."""
    if choice in (None, "auto"):
        native = native_server_bin()
        return str(native) if native else None
    if choice == "xllamacpp":
        return None
    if not Path(choice).expanduser().is_file():
        raise MissingPathError(
            f"--server-bin {choice}: no such file; build one with `make llama-server`, or pass "
            "auto or xllamacpp"
        )
    return str(Path(choice).expanduser())


def agreement(answers: list, reference: list) -> dict:
    """How far answers (token lists or texts) follow the reference's, row by row: rows equal,
    and the share of the reference's tokens (characters) before the first difference (1
    where equal)."""
    if len(answers) != len(reference):
        raise ValueError(f"{len(answers)} answers against {len(reference)} reference rows")
    equal, shares = 0, []
    for a, r in zip(answers, reference):
        same = next((j for j, (x, y) in enumerate(zip(a, r)) if x != y), min(len(a), len(r)))
        equal += a == r
        shares.append(1.0 if a == r else same / max(1, len(r)))
    return {
        "rows": len(reference),
        "rows_equal": equal,
        "rows_equal_share": equal / len(reference) if reference else None,
        "common_prefix_share": sum(shares) / len(shares) if shares else None,
    }


def open_backend(
    target: str,
    target_gguf: str | None,
    server_bin: str | None,
    threads: int,
    slots: int,
    slot_ctx: int = 2048,
    chat_template_kwargs: dict | None = None,
) -> LlamaCppBackend:
    """llama.cpp's server on `target_gguf` (default: the embedded target's file), `slots`
    requests decoded together, the HF tokenizer of `target` rendering the prompts."""
    settings = EngineSettings(
        target_gguf_of(target, target_gguf),
        threads=threads,
        ctx=slots * slot_ctx,
        server_bin=resolve_server_bin(server_bin),
        parallel=slots,
    )
    return LlamaCppBackend(settings, load_tokenizer(target), chat_template_kwargs)


def probe_agreement(
    backend: LlamaCppBackend, target: str, rows: list[dict], sampling: SamplingConfig, path: Path
) -> dict:
    """Greedy answers of `rows`' first turns (at most 128 tokens) by llama.cpp and by the
    bundled `target` in float32, compared token for token; written to `path` (JSON) with the
    engine's conditions: the answers' provenance."""
    convs = [
        [m for m in r["messages"][:1] if m["role"] == "system"]
        + [next(m for m in r["messages"] if m["role"] == "user")]
        for r in rows
    ]
    greedy = replace(sampling, temperature=0.0, max_new_tokens=min(128, sampling.max_new_tokens))
    ids = backend.encode(convs)
    ours = backend.generate_ids(ids, [0] * len(ids), greedy)
    model, tok = load_target(target, dtype="float32", device="cpu")
    ref = DecoderBackend(model, tok, backend.kw, batch_size=max(1, len(ids)))
    theirs = ref.generate_ids(ids, [0] * len(ids), greedy)
    pairs = [(x, y) for x, y in zip(ours, theirs) if isinstance(x, list) and isinstance(y, list)]
    result = {
        **agreement([x for x, _ in pairs], [y for _, y in pairs]),
        "max_new_tokens": greedy.max_new_tokens,
        "reference": f"the bundled decoder, {target}, float32, greedy",
        **backend.conditions(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(result, indent=2) + "\n")
    print(
        f"llama.cpp ({result['engine']}, {result['target_file_type']}) against the bundled "
        f"target, greedy, first {len(pairs)} rows: {result['rows_equal']} equal, "
        f"{result['common_prefix_share'] or 0:.3f} of tokens before the first difference",
        file=sys.stderr,
    )
    return result
