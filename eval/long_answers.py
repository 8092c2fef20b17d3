"""512-token answers in the bundled decoder, batch 1: per-request latency and throughput of
plain decoding against DSpark, and what the draft costs in resources (resident memory it adds,
CPU seconds per generated token), beside the method's claims (-82% latency at 512 tokens,
3.5x throughput, +15-20% resources). The two modes alternate prompt by prompt.

    python eval/long_answers.py --draft runs/smollm2/draft --datasets gsm8k,mt-bench \
        --num-prompts 4 --max-new-tokens 512 --dtype bfloat16

Writes OUTPUT/long_answers.json and long_answers.md. In llama.cpp the same lengths run with
`eval/llama_cpp_bench.py --max-new-tokens 512`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.errors import user_errors

CLAIMS = {"latency": -0.82, "throughput": 3.5, "resources": (0.15, 0.20)}


def rss_mb() -> float:
    """This process's resident memory now (Linux /proc), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def summarize(runs: list[dict]) -> dict:
    lat = [r["wall_s"] for r in runs]
    tokens = sum(r["tokens"] for r in runs)
    return {"requests": len(runs), "tokens": tokens,
            "latency_s_mean": statistics.fmean(lat), "latency_s_p50": statistics.median(lat),
            "tokens_per_s": tokens / sum(lat),
            "cpu_s_per_token": sum(r["cpu_s"] for r in runs) / max(tokens, 1)}  # fmt: skip


def compare(ar: dict, spec: dict, rss: dict) -> dict:
    """The figures set beside the claims: latency change, throughput ratio, resource change."""
    return {
        "latency_change": spec["latency_s_mean"] / ar["latency_s_mean"] - 1,
        "throughput_ratio": spec["tokens_per_s"] / ar["tokens_per_s"],
        "cpu_per_token_change": spec["cpu_s_per_token"] / ar["cpu_s_per_token"] - 1,
        "memory_change": rss["draft_mb"] / rss["target_mb"],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--datasets", default="gsm8k,mt-bench")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="end an answer at its end-of-turn token (default: every answer runs to "
        "--max-new-tokens, as serving benchmarks' ignore_eos, so each request is that long)",
    )
    ap.add_argument("--output-dir", default="runs/long_answers")
    a = ap.parse_args(argv)
    with user_errors("long_answers"):
        import torch

        from dspark.decoding import DecoderOptions, SpeculativeDecoder
        from dspark.eval.prompts import load_dataset, render
        from dspark.export.load import load_draft
        from dspark.fileio import dumps_strict, write_text_atomic
        from dspark.machine import cpu_kind
        from dspark.target import load_target

        torch.set_num_threads(a.threads)
        dtype = getattr(torch, a.dtype)
        before = rss_mb()
        target, tok = load_target(a.target, dtype=a.dtype)
        with_target = rss_mb()
        draft = load_draft(a.draft, dtype=dtype)
        rss = {"target_mb": with_target - before, "draft_mb": rss_mb() - with_target}
        dec = SpeculativeDecoder(target, draft, DecoderOptions(max_length=4096))
        eos = tok.eos_token_id if a.stop_at_eos else None
        prompts = [list(render(tok, c[:1], [])) for name in a.datasets.split(",")
                   for c in load_dataset(name.strip(), a.bench_dir, a.num_prompts)]  # fmt: skip
        dec.generate_autoregressive([prompts[0]], 16, eos)  # warm-up, both paths
        dec.generate([prompts[0]], 16, eos)
        runs: dict[str, list[dict]] = {"plain": [], "dspark": []}
        for i, p in enumerate(prompts):
            order = ("plain", "dspark") if i % 2 == 0 else ("dspark", "plain")
            for mode in order:
                fn = dec.generate_autoregressive if mode == "plain" else dec.generate
                c0, t0 = time.process_time(), time.perf_counter()
                out = fn([p], a.max_new_tokens, eos)
                runs[mode].append({"wall_s": time.perf_counter() - t0,
                                   "cpu_s": time.process_time() - c0,
                                   "tokens": out.new_tokens[0]})  # fmt: skip
            print(f"prompt {i + 1}/{len(prompts)}", flush=True)
        ar, spec = summarize(runs["plain"]), summarize(runs["dspark"])
        figures = compare(ar, spec, rss)
        cond = {"cpu": cpu_kind(), "threads": a.threads, "dtype": a.dtype, "batch": 1,
                "temperature": 0.0, "max_new_tokens": a.max_new_tokens,
                "prompts": len(prompts), "datasets": a.datasets, "draft": a.draft,
                "answers_end_at_eos": a.stop_at_eos,
                "engine": "bundled decoder"}  # fmt: skip
        res = {"conditions": cond, "plain": ar, "dspark": spec, "memory_mb": rss,
               "figures": figures, "claims": CLAIMS, "runs": runs}  # fmt: skip
        out = Path(a.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "long_answers.json", dumps_strict(res, indent=2) + "\n")
        md = "\n".join([
            f"# {a.max_new_tokens}-token answers, {cond['cpu']}, {a.threads} threads, {a.dtype}, "
            f"batch 1, T=0, {len(prompts)} prompts ({a.datasets})", "",
            "| | plain | DSpark | measured | claimed |", "|---|---|---|---|---|",
            f"| mean latency (s) | {ar['latency_s_mean']:.2f} | {spec['latency_s_mean']:.2f} | "
            f"{100 * figures['latency_change']:+.0f}% | -82% |",
            f"| throughput (tok/s) | {ar['tokens_per_s']:.1f} | {spec['tokens_per_s']:.1f} | "
            f"{figures['throughput_ratio']:.2f}x | 3.5x |",
            f"| CPU s per token | {ar['cpu_s_per_token']:.4f} | {spec['cpu_s_per_token']:.4f} | "
            f"{100 * figures['cpu_per_token_change']:+.0f}% | +15-20% resources |",
            f"| resident memory (MiB) | {rss['target_mb']:.0f} | +{rss['draft_mb']:.0f} | "
            f"{100 * figures['memory_change']:+.0f}% | +15-20% resources |",
        ]) + "\n"  # fmt: skip
        report = write_text_atomic(out / "long_answers.md", md)
    print(report.read_text())


if __name__ == "__main__":
    main()
