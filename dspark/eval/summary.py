"""What a benchmark run measured and its summary: the per-dataset records the runner fills
(`DatasetRecord`, `Timer`), then acceptance, speed, calibration and STS per dataset and pooled
(`summarize`), the run's conditions, and the raw per-round lines (`write_rounds`).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import transformers

from dspark.calibration import metrics as cal
from dspark.eval import fastest_plain as fp
from dspark.eval.metrics import acceptance_stats, ratio, throughput
from dspark.fileio import write_text_atomic
from dspark.machine import device_kind

RESULTS_VERSION = 1


@dataclass
class Timer:
    tokens: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += int(tokens)
        self.seconds += float(seconds)

    def report(self) -> dict:
        return throughput(self.tokens, self.seconds)


@dataclass
class DatasetRecord:
    """Everything measured on one dataset, before it is summarised."""

    name: str
    conversations: int = 0
    dtype: str = ""  # the target's dtype in the speculative and `autoregressive` decoders
    prompt_tokens: list[int] = field(default_factory=list)
    accept_lengths: list[list[int]] = field(default_factory=list)
    verify_lengths: list[list[int]] = field(default_factory=list)
    confidences: list[list[list[float]]] = field(default_factory=list)
    spec_tokens: list[int] = field(default_factory=list)
    matches: list[bool] = field(default_factory=list)  # speculative == autoregressive (T = 0)
    hf_matches: list[bool] = field(default_factory=list)  # hf_generate == autoregressive
    timers: dict[str, Timer] = field(default_factory=dict)
    phases: dict[str, dict] = field(default_factory=dict)  # per decoder: summed round timings

    def timer(self, name: str) -> Timer:
        return self.timers.setdefault(name, Timer())

    def add_phases(self, name: str, out) -> None:
        """Sum a GenerationOutput's per-round draft / verify timings under `name`."""
        acc = self.phases.setdefault(
            name, {"rounds": 0, "draft_s": 0.0, "verify_s": 0.0, "tokens": 0, "padded": 0}
        )
        acc["rounds"] += len(out.round_verify_s)
        acc["draft_s"] += sum(out.round_draft_s)
        acc["verify_s"] += sum(out.round_verify_s)
        acc["tokens"] += sum(out.round_tokens)
        acc["padded"] += sum(r * w for r, w in zip(out.round_rows, out.round_width))


def calibration_summary(records: list[DatasetRecord], block_size: int, ccfg) -> dict | None:
    conf, acc, ver = _matrices(records, block_size)
    if not ver.any():
        return None
    c_p, c_y, c_k = cal.conditional_view(conf, acc, ver)
    out = {
        "conditional": cal.summarize(c_p, c_y, ccfg.bins),
        "conditional_by_position": _by_position(c_p, c_y, c_k, block_size, ccfg.bins),
    }
    if ccfg.survival:
        s_p, s_y, s_k = cal.survival_view(conf, acc, ver)
        out["survival"] = cal.summarize(s_p, s_y, ccfg.bins)
        out["survival_by_position"] = _by_position(s_p, s_y, s_k, block_size, ccfg.bins)
    return out


def _by_position(p, y, k, block_size, bins) -> list[dict]:
    rows = []
    for pos in range(1, block_size + 1):
        sel = k == pos
        s = cal.summarize(p[sel], y[sel], bins)
        s.pop("bins")
        rows.append({"position": pos, **s})
    return rows


def _matrices(records, block_size):
    parts = [
        cal.round_matrices(r.confidences, r.accept_lengths, r.verify_lengths, block_size)
        for r in records
    ]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def sts_summary(records: list[DatasetRecord], block_size: int, bins: int) -> dict | None:
    """Fit STS on even-numbered requests (pooled over datasets), score on the odd ones."""
    per_request = []
    for r in records:
        for c, a, v in zip(r.confidences, r.accept_lengths, r.verify_lengths):
            per_request.append(cal.round_matrices([c], [a], [v], block_size))
    return cal.sts_split_fit(per_request, bins)


def phase_summary(acc: dict) -> dict:
    """Per-round means of summed draft / verify timings (the monitoring block)."""
    n = acc["rounds"]
    return {
        "rounds": n,
        "draft_ms_per_round": 1e3 * acc["draft_s"] / n if n else None,
        "verify_ms_per_round": 1e3 * acc["verify_s"] / n if n else None,
        "draft_over_verify": ratio(acc["draft_s"], acc["verify_s"]),
        "verify_tokens_per_round": acc["tokens"] / n if n else None,
        "padded_tokens_per_round": acc["padded"] / n if n else None,
    }


def summarize_dataset(rec: DatasetRecord, block_size: int, cfg, has_confidence: bool) -> dict:
    acc = acceptance_stats(rec.accept_lengths, rec.verify_lengths, block_size)
    ar = rec.timer("autoregressive").report()
    sp = rec.timer("speculative").report()
    speedup = ratio(sp["tokens_per_s"], ar["tokens_per_s"])
    out = {
        "conversations": rec.conversations,
        "requests": len(rec.prompt_tokens),
        "prompt_tokens_mean": float(np.mean(rec.prompt_tokens)) if rec.prompt_tokens else None,
        "acceptance": acc,
        "speed": {
            "autoregressive": ar,
            "speculative": sp,
            "speedup": speedup,
            "decoder_efficiency": ratio(speedup, acc["tau"]),
            "tokens_per_round": ratio(sum(rec.spec_tokens), acc["rounds"]),
            "fastest_plain": fp.summary(rec.timers, rec.dtype, sp["tokens_per_s"]),
            "greedy_match": (
                sum(rec.matches) / len(rec.matches)
                if cfg.temperature == 0 and rec.matches
                else None
            ),
        },
    }
    out["monitoring"] = {name: phase_summary(acc) for name, acc in rec.phases.items()}
    if cfg.baselines.run:
        base = {name: rec.timer(name).report() for name in cfg.baselines.run}
        ref = base.get("hf_generate", {}).get("tokens_per_s")
        for b in base.values():
            b["speedup_vs_hf_generate"] = ratio(b["tokens_per_s"], ref)
        out["baselines"] = base
        out["speculative_vs_baselines"] = {
            name: ratio(sp["tokens_per_s"], b["tokens_per_s"]) for name, b in base.items()
        }
        out["hf_generate_matches_autoregressive"] = (
            sum(rec.hf_matches) / len(rec.hf_matches) if rec.hf_matches else None
        )
    if has_confidence:
        out["calibration"] = calibration_summary([rec], block_size, cfg.calibration)
    return out


def conditions(cfg, target_spec: str, draft, target, block_size: int, assistant_layers) -> dict:
    param = next(target.parameters())
    draft_cfg = draft.config.to_dict() if hasattr(draft.config, "to_dict") else dict(draft.config)
    keep = (
        "model_type",
        "block_size",
        "num_hidden_layers",
        "num_target_layers",
        "target_layer_ids",
        "mask_token_id",
        "markov_rank",
        "markov_head_type",
        "enable_confidence_head",
        "confidence_head_with_markov",
        "num_anchors",
        "target_name_or_path",
        "hidden_size",
        "vocab_size",
        "architectures",
    )
    return {
        "target": target_spec,
        "target_model_type": target.config.model_type,
        "target_layers": target.config.num_hidden_layers,
        "draft": os.path.abspath(cfg.draft),
        "draft_config": {k: draft_cfg[k] for k in keep if k in draft_cfg},
        "block_size": block_size,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "confidence_threshold": cfg.confidence_threshold,
        "verify_policy": cfg.verify_policy
        or ("threshold" if cfg.confidence_threshold is not None else "full"),
        "scheduler_batch": cfg.scheduler_batch,
        "confidence_temperatures": (
            getattr(draft.config, "confidence_temperatures", None) if cfg.calibrate else None
        ),
        "batch_size": cfg.batch_size,
        "max_new_tokens": cfg.max_new_tokens,
        "num_prompts": cfg.num_prompts,
        "turns": "all (target's own answers fed back)" if cfg.all_turns else "first",
        "system_prompt": cfg.system_prompt,
        "seed": cfg.seed,
        "warmup_calls": cfg.warmup,
        "device": str(param.device),
        "device_name": device_kind(param.device),
        "dtype": str(param.dtype).replace("torch.", ""),
        "draft_dtype": str(next(draft.parameters()).dtype).replace("torch.", ""),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "baselines": list(cfg.baselines.run),
        "baseline_decoding": "greedy, batch 1",
        "assistant_layers": assistant_layers,
        "num_assistant_tokens": cfg.baselines.num_assistant_tokens,
        "prompt_lookup_num_tokens": cfg.baselines.prompt_lookup_num_tokens,
        "prompt_lookup_max_ngram": cfg.baselines.prompt_lookup_max_ngram,
        "calibration_bins": cfg.calibration.bins,
    }


def summarize(
    records: list[DatasetRecord], block_size: int, cfg, has_confidence: bool, conds: dict
) -> dict:
    datasets = {r.name: summarize_dataset(r, block_size, cfg, has_confidence) for r in records}
    taus = [d["acceptance"]["tau"] for d in datasets.values() if d["acceptance"]["tau"]]
    names = {m for r in records for m in r.timers if m.startswith(fp.PREFIX)}
    pooled = {m: Timer() for m in ("autoregressive", "speculative", *sorted(names))}
    for r in records:
        for m in pooled:
            pooled[m].add(r.timer(m).tokens, r.timer(m).seconds)
    overall: dict[str, Any] = {
        "tau_macro": float(np.mean(taus)) if taus else None,
        "autoregressive": pooled["autoregressive"].report(),
        "speculative": pooled["speculative"].report(),
    }
    overall["speedup"] = ratio(
        overall["speculative"]["tokens_per_s"], overall["autoregressive"]["tokens_per_s"]
    )
    overall["fastest_plain"] = fp.summary(
        pooled, conds["dtype"], overall["speculative"]["tokens_per_s"]
    )
    results = {
        "version": RESULTS_VERSION,
        "conditions": conds,
        "datasets": datasets,
        "overall": overall,
    }
    if has_confidence:
        results["calibration"] = calibration_summary(records, block_size, cfg.calibration)
        if cfg.calibration.sts:
            results["sts"] = sts_summary(records, block_size, cfg.calibration.bins)
    return results


def write_rounds(records: list[DatasetRecord], path) -> None:
    """One JSON line per request: the raw per-round record (to re-analyse or refit STS)."""
    lines = []
    for r in records:
        for i, (a, v, c) in enumerate(zip(r.accept_lengths, r.verify_lengths, r.confidences)):
            row = {
                "dataset": r.name,
                "request": i,
                "prompt_tokens": r.prompt_tokens[i],
                "new_tokens": r.spec_tokens[i],
                "accept_lengths": a,
                "verify_lengths": v,
                "confidences": c,
            }
            lines.append(json.dumps(row) + "\n")
    write_text_atomic(path, "".join(lines))
