"""The README written beside an export: what it is and the exact engine commands."""

from __future__ import annotations

import json
import shlex


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
