"""llama.cpp as a decoding engine: plain, `draft-dspark` with our GGUF draft, and its n-gram
speculation, on the same prompts (token ids) as the bundled decoder.

Two ways in, one request format (the server's OpenAI-style `/v1/completions`, whose reply
carries llama.cpp's own `timings`):
- `xllamacpp` (the optional extra `pip install 'dspark[llama-cpp]'`): llama.cpp's server
  inside this process, asked without HTTP;
- a natively built `llama-server` (`server_bin`), started on 127.0.0.1 and asked over HTTP.
Starting either is `dspark/engines/llama_server.py`'s (regeneration uses it too).

Per request llama.cpp reports `predicted_n` tokens in `predicted_ms` (decode only, prefill
excluded) and, when it speculates, `draft_n` drafted and `draft_n_accepted` accepted tokens.
A verify round yields its accepted drafts plus one target token, so rounds = predicted_n -
draft_n_accepted, and tau (mean accepted length, bonus counted) = predicted_n / rounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from dspark.engines.llama_server import (  # noqa: F401  (the engine's names, re-exported here)
    INSTALL_HINT,
    NGRAM_MOD_N_MIN,
    SPEC_TYPES,
    EngineSettings,
    InProcessServer,
    Mode,
    NativeServer,
    engine_conditions,
    free_port,
    gguf_file_type,
    server_args,
    target_gguf_of,
)


@dataclass
class Completion:
    text: str
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0
    draft_accepted: int = 0


def _request(prompt: list[int], max_new_tokens: int) -> dict:
    # greedy (top_k 1, T 0), no prompt cache: every mode decodes each prompt from scratch
    return {
        "prompt": list(prompt),
        "max_tokens": max_new_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "cache_prompt": False,
    }


def _completion(reply: dict) -> Completion:
    t = reply.get("timings") or {}
    if "error" in reply or not reply.get("choices"):
        raise RuntimeError(f"llama.cpp answered without a completion: {str(reply)[:300]}")
    return Completion(
        text=reply["choices"][0].get("text", ""),
        predicted_n=int(t.get("predicted_n", 0)),
        predicted_ms=float(t.get("predicted_ms", 0.0)),
        draft_n=int(t.get("draft_n", 0)),
        draft_accepted=int(t.get("draft_n_accepted", 0)),
    )


class InProcessEngine(InProcessServer):
    """llama.cpp's server inside this process (`xllamacpp`), asked without HTTP."""

    def complete(self, prompt: list[int], max_new_tokens: int) -> Completion:
        return _completion(self._server.handle_completions(_request(prompt, max_new_tokens)))


class NativeServerEngine(NativeServer):
    """A natively built `llama-server` on 127.0.0.1, asked over HTTP."""

    def complete(self, prompt: list[int], max_new_tokens: int) -> Completion:
        return _completion(self.post("/v1/completions", _request(prompt, max_new_tokens)))


Engine = InProcessEngine | NativeServerEngine


def open_engine(settings: EngineSettings, mode: Mode) -> Engine:
    if settings.server_bin:
        return NativeServerEngine(settings, mode)
    return InProcessEngine(settings, mode)


@dataclass
class ModeRun:
    """One mode over one prompt set: per-request completions and their sums."""

    mode: Mode
    completions: list[Completion] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(c.predicted_n for c in self.completions)

    @property
    def seconds(self) -> float:
        return sum(c.predicted_ms for c in self.completions) / 1e3

    @property
    def accepted(self) -> int:
        return sum(c.draft_accepted for c in self.completions)

    @property
    def drafted(self) -> int:
        return sum(c.draft_n for c in self.completions)

    @property
    def rounds(self) -> int:
        """Target passes of the decode phase (a plain step is a round of one token)."""
        return self.tokens - self.accepted

    def summary(self, plain: ModeRun | None) -> dict:
        tok_s = self.tokens / self.seconds if self.seconds > 0 else None
        round_ms = 1e3 * self.seconds / self.rounds if self.rounds > 0 else None
        out: dict = {
            "mode": asdict(self.mode),
            "name": self.mode.name,
            "requests": len(self.completions),
            "tokens": self.tokens,
            "decode_s": round(self.seconds, 4),
            "tokens_per_s": tok_s,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "tau": self.tokens / self.rounds if self.rounds > 0 else None,
            "round_ms": round_ms,
        }
        if plain is not None and plain.tokens and plain.seconds > 0:
            step_ms = 1e3 * plain.seconds / plain.tokens
            out["plain_step_ms"] = step_ms
            if round_ms is not None:
                # a round's cost in plain steps is the tau it needs to break even
                out["break_even_tau"] = round_ms / step_ms
            out["speedup_vs_plain"] = tok_s / (plain.tokens / plain.seconds) if tok_s else None
            same = [a.text == b.text for a, b in zip(self.completions, plain.completions)]
            out["output_equals_plain"] = sum(same) / len(same) if same else None
        return out


def pooled(runs: dict[str, dict[str, ModeRun]], mode: Mode) -> ModeRun:
    """One mode's completions over every prompt set of `run_modes`' result, as one run."""
    return ModeRun(mode, [c for s in runs.values() for c in s[mode.name].completions])


def decode_all(
    engine: Engine, prompts: list[list[int]], max_new_tokens: int, mode: Mode
) -> ModeRun:
    run = ModeRun(mode)
    for prompt in prompts:
        run.completions.append(engine.complete(prompt, max_new_tokens))
    return run


def run_modes(
    settings: EngineSettings,
    modes: list[Mode],
    prompt_sets: dict[str, list[list[int]]],
    max_new_tokens: int,
    warmup: int = 1,
    progress=print,
    draft_timers: dict | None = None,
) -> dict[str, dict[str, ModeRun]]:
    """`{set: {mode name: ModeRun}}`, the modes interleaved prompt by prompt. With
    `draft_timers` (a dict) and `settings.draft_timer`, each drafting mode's llama.cpp timer
    over the whole run (warm-up included) is put there under its name (`NativeServer.draft_timer`).

    Every mode's engine is open at once (each holds its own copy of the models and its KV
    cache) and warmed up on the first prompt; then each prompt is decoded by every mode in
    turn, the order rotating by one mode from prompt to prompt. A drift of the machine's
    speed (a shared host, a throttled CPU) then falls on every mode alike: run one mode after
    another instead, and whichever mode met the slow minutes looked slower, by 30% or more
    between two runs of the same draft on a shared VM."""
    names = [m.name for m in modes]
    if len(set(names)) != len(names):
        raise ValueError(f"modes must differ: {names}")
    out = {name: {m.name: ModeRun(m) for m in modes} for name in prompt_sets}
    first = next(iter(prompt_sets.values()))[:1]
    engines: list[tuple[Mode, Engine]] = []
    try:
        for mode in modes:
            engines.append((mode, open_engine(settings, mode)))
        for mode, engine in engines:
            for _ in range(warmup):
                decode_all(engine, first, min(16, max_new_tokens), mode)
        turn = 0
        for name, prompts in prompt_sets.items():
            progress(f"llama.cpp, {len(modes)} modes interleaved: {name} ({len(prompts)} prompts)")
            for prompt in prompts:
                k = turn % len(engines)
                for mode, engine in engines[k:] + engines[:k]:
                    done = engine.complete(prompt, max_new_tokens)
                    out[name][mode.name].completions.append(done)
                turn += 1
        if draft_timers is not None:
            for mode, engine in engines:
                timer = engine.draft_timer() if hasattr(engine, "draft_timer") else None
                if timer is not None:
                    draft_timers[mode.name] = timer
    finally:
        for _, engine in engines:
            engine.close()
    return out


def draft_gguf_of(draft_dir: str | None, draft_gguf: str | None, out: Path, target: str,
                  outtype: str = "q4_0") -> str | None:  # fmt: skip
    """`draft_gguf`, else `draft_dir` written as `out/draft.gguf` in `outtype`, else None."""
    if not draft_dir:
        return draft_gguf
    from dspark.export.gguf import write_gguf  # optional: gguf

    return str(write_gguf(draft_dir, out / "draft.gguf", target=target, outtype=outtype,
                          overwrite=True))  # fmt: skip
