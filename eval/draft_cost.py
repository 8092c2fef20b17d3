"""The draft's work per round in llama.cpp, per GGUF export of one draft, and the cheapest export
at equal tau (library: dspark/bench/draft_cost.py).

python eval/draft_cost.py --draft runs/smollm2/draft --server-bin BIN --target-gguf Q4_K_M.gguf \
    --outtypes q4_0,q8_0,f16 --datasets embedded --num-prompts 8 --max-new-tokens 96

Per export: the draft's tensors by part (features in, backbone, lm_head over the kept ids,
Markov head, confidence head, embedding) with their bytes and share of a slot's matmuls; plain
decoding and the cost fit's probe modes measured in llama.cpp on the same prompts, prompt by
prompt interleaved, the exports in forward then reverse order (`--repeats`); the fitted draft
work per round (base + per slot) and its share of a round at n_max 1; llama.cpp's own timer
of the draft's block decode per round, per mode. Writes results.json,
report.md and draft_cost.png to --output-dir.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import dspark._entry  # noqa: F401  (offline, quiet: set before transformers loads)
from dspark.bench import draft_cost as dc
from dspark.bench import llama_cpp_report as rep
from dspark.bench.llama_cpp import EngineSettings, Mode, ModeRun, engine_conditions, run_modes
from dspark.bench.llama_cpp_tune import tune_modes
from dspark.engines.llama_server import native_server_bin, target_gguf_of
from dspark.errors import BadInputError, require_draft_dir, user_errors
from dspark.export.gguf import OUTTYPES, write_gguf
from dspark.fileio import dumps_strict, write_text_atomic
from dspark.locking import exclusive_output
from dspark.machine import cpu_name
from dspark.plotting import plt
from dspark.target import load_tokenizer


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--draft", required=True, help="a DSpark draft dir (exported once per type)")
    ap.add_argument("--target", default="embedded", help="HF id / dir for the tokenizer")
    ap.add_argument("--target-gguf", default=None, help="default: the embedded target's GGUF")
    ap.add_argument("--server-bin", default=None, help="native llama-server (default: make's)")
    ap.add_argument("--outtypes", default="q4_0,q8_0,f16", help=f"GGUF types, of {OUTTYPES}")
    ap.add_argument("--datasets", default="embedded")
    ap.add_argument("--bench-dir", default=None)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="passes over the exports, alternating")
    ap.add_argument("--output-dir", default="runs/draft_cost")
    a = ap.parse_args(argv)
    a.outtypes = [t.strip() for t in a.outtypes.split(",") if t.strip()]
    bad = [t for t in a.outtypes if t not in OUTTYPES]
    if bad or not a.outtypes:
        ap.error(f"--outtypes {bad or a.outtypes}: choose from {', '.join(OUTTYPES)}")
    if a.repeats < 1 or a.num_prompts < 1 or a.max_new_tokens < 1:
        ap.error("--repeats, --num-prompts and --max-new-tokens must be >= 1")
    return a


def plot(rows: list[dict], path: Path) -> Path:
    """A round at n_max 1 per export: the plain step, the draft's work, the verify work."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r["export"] for r in rows]
    step = [r["plain_step_ms"] for r in rows]
    draft = [r["n_max_1"]["draft_ms"] for r in rows]
    verify = [r["n_max_1"]["round_ms"] - s - d for r, s, d in zip(rows, step, draft)]
    ax.barh(names, step, label="target step")
    ax.barh(names, draft, left=step, label="draft work")
    ax.barh(names, verify, left=[s + d for s, d in zip(step, draft)], label="verify of drafts")
    ax.set_xlabel("ms per round at n_max 1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    a = parse(argv)
    with user_errors("draft_cost"):
        require_draft_dir(a.draft, "--draft")
        server = a.server_bin or native_server_bin()
        if server is None:
            raise BadInputError("no native llama-server: run `make llama-server` or pass "
                                "--server-bin PATH")  # fmt: skip
        out = Path(a.output_dir)
        with exclusive_output(out, "the draft-cost output"):
            out.mkdir(parents=True, exist_ok=True)
            target_gguf = target_gguf_of(a.target, a.target_gguf)
            ggufs = {t: str(write_gguf(a.draft, out / f"draft.{t}.gguf", target=a.target,
                                       outtype=t, overwrite=True)) for t in a.outtypes}  # fmt: skip
            block, has_conf = rep.draft_gguf_shape(next(iter(ggufs.values())))
            probes = tune_modes(block, has_conf, "model")
            modes = [Mode("none"), *probes]
            sets = [s.strip() for s in a.datasets.split(",") if s.strip()]
            prompts = rep.prompt_sets(load_tokenizer(a.target), sets, a.bench_dir, 0,
                                      a.num_prompts)  # fmt: skip
            runs = {t: {s: {m.name: ModeRun(m) for m in modes} for s in prompts} for t in ggufs}
            timers: dict[str, dict[str, dict]] = {t: {} for t in ggufs}
            for rep_no in range(a.repeats):
                order = list(ggufs) if rep_no % 2 == 0 else list(reversed(ggufs))
                for t in order:
                    print(f"== pass {rep_no + 1}: draft {t}", flush=True)
                    settings = EngineSettings(target_gguf, ggufs[t], threads=a.threads,
                                              server_bin=str(server), draft_timer=True)  # fmt: skip
                    timed: dict[str, dict] = {}
                    got = run_modes(settings, modes, prompts, a.max_new_tokens, draft_timers=timed)
                    dc.add_timers(timers[t], timed)
                    for s, by_mode in got.items():
                        for name, run in by_mode.items():
                            runs[t][s][name].completions += run.completions
            rows = [dc.measured_row(t, dc.tensor_parts(g), runs[t], probes, timers[t])
                    for t, g in ggufs.items()]  # fmt: skip
            chosen = dc.choose(rows)
            settings = EngineSettings(target_gguf, ggufs[chosen["export"]], threads=a.threads,
                                      server_bin=str(server))  # fmt: skip
            conditions = {"cpu": cpu_name(), **engine_conditions(settings),
                          "draft": a.draft, "datasets": sets, "prompts_per_set": a.num_prompts,
                          "max_new_tokens": a.max_new_tokens, "repeats": a.repeats,
                          "block_size": block, "temperature": 0}  # fmt: skip
            for k in ("draft_gguf", "draft_file_type"):
                conditions.pop(k, None)  # per export, in its row
            png = plot(rows, out / "draft_cost.png")
            write_text_atomic(out / "results.json", dumps_strict(
                {"conditions": conditions, "rows": rows, "chosen": chosen["export"]},
                indent=2) + "\n")  # fmt: skip
            report = write_text_atomic(out / "report.md", dc.render(rows, chosen, conditions)
                                       + f"\n![round split]({png.name})\n")  # fmt: skip
    print(report.read_text())


if __name__ == "__main__":
    main()
