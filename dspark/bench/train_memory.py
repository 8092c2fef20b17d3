"""Per-rank memory of a distillation run, by component: replicated target, FSDP2-sharded
target (`target.shard=true`), and sharded target + FSDP full-shard draft.

Parameter counts are exact: the target and the draft are built on the `meta` device from their
configs (no weights, no download) and counted. Activations are an analytic count of what one
micro-batch keeps alive at the loss (the peak), for `batch` sequences of `seq_len` tokens whose
every position is supervised (the upper bound: real data with prompts supervises fewer slots):

- target forward (no grad, target dtype): the tapped features `[B, S, L*H]` and the final
  hidden state `[B, S, H]` stay; one layer's working set `[B, S, 2H + q + 2kv + 3I]` comes and
  goes (a sharded target also holds 2 all-gathered layers: the current one and the prefetch);
- draft (with grad, fp32 or the autocast dtype): the fp32 `fc` input and context per token,
  per draft layer the context keys/values `[B, S, 2kv]` and about `8H + 2q + 2kv + 4I` values
  per block token (`N * gamma` block tokens per sequence, N = min(num_anchors, S - gamma));
  with `attention="sdpa"` also the `[B, heads, Q, S + Q]` score and probability matrices
  (flex attention, the CUDA default, never materialises them);
- loss: `LOGIT_COPIES` fp32 `[C, V]` tensors (lm_head + Markov bias, the fp32 softmaxes of
  draft and target for L1, log-softmax for CE, the |p_d - p_t| input kept for backward, and
  the gradient of the logits), where C = min(M, `chunk_slots`) slots of the M = B * N * gamma
  supervised ones: the loss runs one chunk at a time and recomputes it in backward
  (dspark/modeling/slot_chunks.py); `chunk_slots=0` holds all M at once (C = M).

Fixed per rank: draft weights (fp32, trainable and the frozen embed / lm_head copies), fp32
grads of the trainable ones (+ one more copy in DDP's gradient buckets when world_size > 1),
AdamW's two fp32 moments. Not counted: the CUDA context / allocator slack (~0.5-2 GB on a GPU),
the framework's own host memory (~0.5 GB of Python + torch, measured separately).
"""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from dspark.config import NUM_TARGET_FEATURES, DSparkConfig, choose_mask_token_id
from dspark.modeling import DSparkDraftModel
from dspark.objectives import build_objective
from dspark.objectives.dspark_settings import CHUNK_SLOTS
from dspark.target import load_target, resolve_target

GiB = 2**30
LOGIT_COPIES = 6  # fp32 [C, V] tensors alive at the loss's peak (see the module docstring)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# Published architecture shapes (config.json of the hub repos), so the estimate needs no hub.
KNOWN_TARGETS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-8B": dict(
        model_type="qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
    ),
    "meta-llama/Llama-3.1-70B-Instruct": dict(
        model_type="llama",
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
}


@dataclass
class RunShape:
    """What the estimate is for (every figure it reports names these conditions)."""

    batch: int = 1  # sequences per rank per micro-step
    seq_len: int = 4096
    world_size: int = 8
    target_dtype: str = "bfloat16"
    compute_bytes: int = 2  # draft activations: 2 under bf16 autocast, 4 in fp32
    attention: str = "flex"  # flex (no score matrix) | sdpa (explicit mask: scores materialise)
    # the draft's shape: DSparkConfig's defaults (the one place they are written)
    num_hidden_layers: int = DSparkConfig.num_hidden_layers
    block_size: int = DSparkConfig.block_size
    num_anchors: int = DSparkConfig.num_anchors
    markov_rank: int = DSparkConfig.markov_rank
    num_target_layers_tapped: int = NUM_TARGET_FEATURES
    chunk_slots: int = CHUNK_SLOTS  # the objective's default; 0: the loss over all slots at once


def target_config(spec: str):
    """An HF config: a known shape above, or anything `load_target` accepts (local / tiny)."""
    if spec in KNOWN_TARGETS:
        shape = dict(KNOWN_TARGETS[spec])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)

    return AutoConfig.from_pretrained(resolve_target(spec))


def count_params(cfg, shape: RunShape) -> dict[str, int]:
    """Exact parameter counts from meta-device models: target (all, lm_head), draft
    (trainable, frozen)."""
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(cfg)
        dcfg = DSparkConfig.from_target_config(
            cfg,
            num_hidden_layers=shape.num_hidden_layers,
            block_size=shape.block_size,
            num_anchors=shape.num_anchors,
            markov_rank=shape.markov_rank,
            num_target_features=shape.num_target_layers_tapped,
            mask_token_id=0,
        )
        draft = DSparkDraftModel(dcfg)
    head = target.get_output_embeddings().weight
    tied = head is target.get_input_embeddings().weight
    layer0 = target.model.layers[0]
    return {
        "target": sum(p.numel() for p in target.parameters()),
        "target_lm_head": head.numel(),
        "target_head_tied": int(tied),
        "target_layer": sum(p.numel() for p in layer0.parameters()),
        "draft_trainable": sum(p.numel() for p in draft.parameters() if p.requires_grad),
        "draft_frozen": sum(p.numel() for p in draft.parameters() if not p.requires_grad),
        "draft_markov_and_fc": sum(
            p.numel()
            for name, p in draft.named_parameters()
            if p.requires_grad and not name.startswith("layers.")
        ),
    }


def estimate(spec: str, shape: RunShape) -> dict:
    """Per-rank bytes by component for `replicated` and `sharded` targets (FSDP2 over
    `shape.world_size` ranks), plus the parameter counts and the conditions."""
    cfg = target_config(spec)
    n = count_params(cfg, shape)
    H, inter, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    heads, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or H // heads
    q, kv = heads * d, kvh * d
    B, S, g, W = shape.batch, shape.seq_len, shape.block_size, shape.world_size
    tb, cb = DTYPE_BYTES[shape.target_dtype], shape.compute_bytes
    L = shape.num_target_layers_tapped
    N = max(1, min(shape.num_anchors, S - g))
    Q = N * g  # block tokens per sequence
    M = B * Q  # supervised slots (upper bound)

    target_acts = B * S * (L * H + H) * tb + B * S * (2 * H + q + 2 * kv + 3 * inter) * tb
    draft_acts = B * S * (L * H + 2 * H) * 4  # fp32 fc input (the tapped cast) + context
    per_layer = S * 2 * kv + Q * (8 * H + 2 * q + 2 * kv + 4 * inter)
    draft_acts += shape.num_hidden_layers * B * per_layer * cb
    if shape.attention == "sdpa":  # fp32 scores and probabilities per draft layer
        draft_acts += shape.num_hidden_layers * 2 * B * heads * Q * (S + Q) * 4
    C = min(M, shape.chunk_slots) if shape.chunk_slots else M  # slots of one loss chunk
    loss_acts = LOGIT_COPIES * C * V * 4

    trainable = n["draft_trainable"]
    fixed = {
        "draft_weights": (trainable + n["draft_frozen"]) * 4,
        "draft_grads": trainable * 4 * (2 if W > 1 else 1),
        "optimizer": 2 * trainable * 4,
        "activations": target_acts + draft_acts + loss_acts,
    }
    body = n["target"] - (0 if n["target_head_tied"] else n["target_lm_head"])
    sharded_target = (
        body / W * tb + n["target_lm_head"] * tb + 2 * n["target_layer"] * tb  # + 2 gathered
    )
    # FSDP full-shard draft (conf/accelerate/fsdp.yaml; GPUs only): draft states / W, its
    # grads without DDP buckets, plus one gathered draft layer (fp32) at a time.
    draft_layer = (trainable - n["draft_markov_and_fc"]) / max(1, shape.num_hidden_layers)
    fsdp_draft = {
        "draft_weights": fixed["draft_weights"] / W + draft_layer * 4,
        "draft_grads": trainable * 4 / W,
        "optimizer": fixed["optimizer"] / W,
        "activations": fixed["activations"],
    }
    modes = {
        "replicated": {"target_weights": n["target"] * tb, **fixed},
        "sharded": {"target_weights": sharded_target, **fixed},
        "sharded+fsdp_draft": {"target_weights": sharded_target, **fsdp_draft},
    }
    for m in modes.values():
        m["total"] = sum(m.values())
    return {
        "target": spec,
        "params": n,
        "shape": asdict(shape),
        "block_tokens_per_seq": Q,
        "supervised_slots": M,
        "loss_chunk_slots": C,
        "activation_parts": {"target": target_acts, "draft": draft_acts, "loss": loss_acts},
        "bytes": modes,
    }


def markdown_table(results: list[dict]) -> str:
    """One row per target and mode, GiB per component."""
    cols = ["target_weights", "draft_weights", "draft_grads", "optimizer", "activations", "total"]
    lines = [
        "| target | mode | " + " | ".join(cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for r in results:
        for mode, parts in r["bytes"].items():
            cells = " | ".join(f"{parts[c] / GiB:.2f}" for c in cols)
            lines.append(f"| {r['target']} | {mode} | {cells} |")
    return "\n".join(lines)


def rss_bytes() -> int:
    """This process's resident set now (Linux /proc)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def measure(spec: str, shape: RunShape, steps: int = 2, seed: int = 0) -> dict:
    """Run `steps` real training steps (objective, backward, AdamW) on one CPU process with a
    fully supervised random batch of the estimate's shape; return the peak RSS above the RSS
    before any model was loaded. Run it in a fresh process: the peak is the process's."""
    before = rss_bytes()
    target, tok = load_target(spec, dtype=shape.target_dtype)
    dcfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=shape.num_hidden_layers,
        block_size=shape.block_size,
        num_anchors=shape.num_anchors,
        markov_rank=shape.markov_rank,
        num_target_features=shape.num_target_layers_tapped,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
    )
    torch.manual_seed(seed)
    draft = DSparkDraftModel.from_target(target, dcfg)
    draft.attn_backend = shape.attention
    objective = build_objective("dspark", target, dcfg, seed=seed, chunk_slots=shape.chunk_slots)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.config.vocab_size, (shape.batch, shape.seq_len), generator=g)
    ones = torch.ones_like(ids)
    batch = {"input_ids": ids, "attention_mask": ones, "loss_mask": ones}
    for _ in range(steps):
        loss, _ = objective.step(draft, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"rss_before_models": before, "peak_rss": peak, "measured": peak - before}
