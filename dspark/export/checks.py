"""Which engines can serve a draft faithfully, and why not (method doc, section 7).

Upstream vLLM's `Qwen3DSparkModel` (what both export formats load as, `method: dspark`) builds
Qwen3 decoder layers (q/k RMSNorm always applied; one `attention_bias` flag for q/k/v *and* o;
an MLP without biases) sized from the draft's config and a vanilla Markov head only
(`markov_w1` / `markov_w2`; `markov_head_type` is not read). SGLang's `DSPARK` loads the same
DeepSpec layout; we hold it to the same rules. A draft outside them is not an error to load:
it is served *wrong*, silently (acceptance collapses), so the export refuses it by default.

The rules read the weights themselves (which tensors exist), not only the config, so a
checkpoint whose config and weights disagree is caught as well.
"""

from __future__ import annotations

import re

ENGINES = ("vllm", "sglang")


def serving_problems(config, state_keys) -> list[str]:
    """Reasons upstream vLLM / SGLang cannot serve this draft as trained ([] = servable).

    `config` is a `DSparkConfig`; `state_keys` the draft's state-dict keys (unprefixed).
    """
    keys = set(state_keys)
    problems: list[str] = []
    rank = int(config.markov_rank)
    head = config.markov_head_type
    if rank == 0:
        problems.append(
            "markov_rank=0 (a pure DFlash draft): Qwen3DSparkModel always builds a Markov head "
            "of markov_rank; serve it as a DFlash draft or train with markov_rank > 0"
        )
    elif head != "vanilla" or any(
        k.startswith(("markov_head.gate_proj", "markov_head.joint_proj")) for k in keys
    ):
        problems.append(
            f"markov_head_type={head!r}: vLLM's Qwen3DSparkModel builds a vanilla Markov head "
            "only (markov_w1/markov_w2; markov_head_type is not read), so the gate/joint_proj "
            "weights would be dropped and the draft served as vanilla. Train with "
            "draft.markov_head_type=vanilla, or export with engine='any' for DeepSpec / the "
            "speculators package, which implement every head"
        )
    if not getattr(config, "sample_from_anchor", True):
        problems.append("sample_from_anchor is false: dspark drafts are anchor-first")
    layers = range(int(config.num_hidden_layers))
    no_qk = [
        i
        for i in layers
        if f"layers.{i}.self_attn.q_norm.weight" not in keys
        or f"layers.{i}.self_attn.k_norm.weight" not in keys
    ]
    if no_qk:
        problems.append(
            f"layers {no_qk} have no q/k norms, which Qwen3DSparkModel always applies; convert "
            "with `python -m dspark.modeling.legacy OLD NEW` and fine-tune"
        )
    for i in layers:
        qkv = [f"layers.{i}.self_attn.{p}_proj.bias" in keys for p in "qkv"]
        o = f"layers.{i}.self_attn.o_proj.bias" in keys
        if len(set(qkv + [o])) > 1:
            problems.append(
                f"layer {i} has q/k/v biases {qkv} and o_proj bias {o}: vLLM's one "
                "attention_bias flag gives all four or none"
            )
            break
    if any(re.match(r"layers\.\d+\.mlp\.\w+\.bias$", k) for k in keys):
        problems.append("the MLP has biases, which vLLM's Qwen3 draft MLP does not")
    return problems
