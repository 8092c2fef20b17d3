"""Load on a native llama-server on this machine: plain, DSpark and n-gram decoding at several
concurrency levels, streamed, bounded in requests and time (dspark/bench/load_server.py).

    make llama-server
    python eval/load_server.py --server-bin $DSPARK_CACHE/llama_cpp/build-native/bin/llama-server \
        --draft runs/quickstart/draft --levels 1,2,4,8,16 --requests 32 --max-new-tokens 128

Writes OUTPUT/load.json, load.md and load.png (throughput and p90 latency against concurrency).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import BadInputError, user_errors


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-bin", required=True, help="a natively built llama-server")
    ap.add_argument("--target", default="embedded", help="HF id / dir for the tokenizer")
    ap.add_argument("--target-gguf", default=None, help="default: the embedded target's GGUF")
    ap.add_argument("--draft", default=None, help="a DSpark draft dir (written as a Q4_0 GGUF)")
    ap.add_argument("--draft-gguf", default=None, help="or a draft GGUF")
    ap.add_argument("--n-max", type=int, default=2)
    ap.add_argument("--p-min", type=float, default=0.0)
    ap.add_argument("--ngram-n-max", type=int, default=4, help="0: no n-gram mode")
    ap.add_argument("--levels", default="1,2,4,8,16", help="concurrent clients per level")
    ap.add_argument("--requests", type=int, default=32, help="requests per level, at most")
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per level, at most")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--datasets", default="gsm8k,humaneval,mt-bench")
    ap.add_argument("--num-prompts", type=int, default=16, help="prompts per set, cycled")
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slot-ctx", type=int, default=2048, help="context per server slot")
    ap.add_argument("--output-dir", default="runs/load_server")
    a = ap.parse_args(argv)
    levels = [int(x) for x in a.levels.split(",") if x.strip()]
    if not levels or min(levels) < 1 or a.requests < 1 or a.time_limit <= 0:
        raise BadInputError("--levels must be positive integers, --requests >= 1, --time-limit > 0")
    a.levels = levels
    return a


def main(argv=None) -> None:
    with user_errors("load_server"):
        a = parse(argv)
        from dspark.bench import load_server as ls
        from dspark.bench.llama_cpp import (
            EngineSettings,
            Mode,
            NativeServerEngine,
            draft_gguf_of,
            target_gguf_of,
        )
        from dspark.bench.llama_cpp_report import prompt_sets
        from dspark.fileio import dumps_strict, write_text_atomic
        from dspark.machine import cpu_kind
        from dspark.target import load_tokenizer

        out = Path(a.output_dir)
        target_gguf = target_gguf_of(a.target, a.target_gguf)
        draft_gguf = draft_gguf_of(a.draft, a.draft_gguf, out, a.target)
        modes = [Mode("none")]
        if draft_gguf:
            modes.append(Mode("draft-dspark", a.n_max, a.p_min))
        if a.ngram_n_max:
            modes.append(Mode("ngram-mod", a.ngram_n_max))
        sets = [d.strip() for d in a.datasets.split(",") if d.strip()]
        ids = prompt_sets(load_tokenizer(a.target), sets, a.bench_dir, 0, a.num_prompts)
        prompts = [p for name in sets for p in ids[name]]
        parallel = max(a.levels)
        settings = EngineSettings(target_gguf, draft_gguf, threads=a.threads,
                                  ctx=a.slot_ctx * parallel, server_bin=a.server_bin,
                                  parallel=parallel)  # fmt: skip
        by_mode: dict[str, list[dict]] = {}
        for mode in modes:
            engine = NativeServerEngine(settings, mode)
            try:
                url = f"http://127.0.0.1:{engine.port}"
                by_mode[mode.name] = []
                for c in a.levels:
                    print(f"{mode.name}: {c} concurrent clients", flush=True)
                    res, wall = ls.run_level(url, prompts, c, a.max_new_tokens, a.requests,
                                             a.time_limit)  # fmt: skip
                    by_mode[mode.name].append(ls.summarize(res, wall, c))
            finally:
                engine.close()
        conditions = {"cpu": cpu_kind(), "threads": a.threads, "parallel": parallel,
                      "target_gguf": target_gguf, "draft_gguf": draft_gguf,
                      "max_new_tokens": a.max_new_tokens,
                      "prompts": f"first {a.num_prompts} of {', '.join(sets)}",
                      "requests_per_level": a.requests, "levels": a.levels}  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "load.json", dumps_strict(
            {"conditions": conditions, "modes": by_mode}, indent=2) + "\n")  # fmt: skip
        ls.plot(by_mode, out / "load.png")
        report = write_text_atomic(out / "load.md", ls.render(by_mode, conditions))
    print(report.read_text())


if __name__ == "__main__":
    main()
