"""The benchmark run: prompts -> every decoder on the same prompts -> results dict.

Per dataset (and per turn stage when `all_turns`), requests go through, batch by batch and
interleaved so machine-load drift hits every method alike: dspark's autoregressive baseline
(`generate_autoregressive`), dspark's speculative decoder, plain decoding in each other
`baseline_dtypes` dtype (fastest_plain.py), then transformers' own decoders (greedy, batch 1).
Before any of it, `dtype=auto` / `verify_length=auto` are decided from this machine's measured
probe and the draft's held-out acceptance (auto_settings.py). Every call is timed with `perf_counter` around it (CUDA synchronised);
untimed warm-up calls come first. Later turns are rendered with the target's own earlier
answers (the autoregressive baseline's output, i.e. exactly what the target says).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dspark.calibration import metrics as cal
from dspark.eval import baselines as hf
from dspark.eval import fastest_plain as fp
from dspark.eval.metrics import acceptance_stats, ratio, throughput
from dspark.eval.prompts import load_dataset, render
from dspark.machine import cpu_name
from dspark.target.loading import eos_ids
from dspark.timing import sync

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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _strip_eos(tokens: list[int], eos: list[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens


class Bench:
    """Holds the loaded models and the run config; `dataset(name)` measures one prompt set."""

    def __init__(
        self, cfg, target, tokenizer, decoder, block_size: int, assistant=None, plain=None
    ):
        self.cfg, self.target, self.tokenizer, self.decoder = cfg, target, tokenizer, decoder
        self.plain = plain or {}  # dtype -> plain decoder over a target copy (fastest_plain.py)
        self.block_size = block_size
        self.assistant = assistant
        self.device = next(target.parameters()).device
        self.eos = eos_ids(tokenizer, target)
        self.eos_arg = self.eos[0] if len(self.eos) == 1 else self.eos
        self.baselines = list(cfg.baselines.run)
        unknown = [b for b in self.baselines if b not in hf.BASELINES]
        if unknown:
            raise ValueError(f"unknown baselines {unknown}; choose from {list(hf.BASELINES)}")

    # -- the calls being timed ---------------------------------------------------------------
    def _timed(self, fn):
        sync(self.device)
        start = time.perf_counter()
        out = fn()
        sync(self.device)
        return out, time.perf_counter() - start

    def _ours(self, method: str, prompts, seed: int, max_new_tokens: int, decoder=None):
        fn = getattr(decoder or self.decoder, method)
        return self._timed(
            lambda: fn(prompts, max_new_tokens=max_new_tokens, eos_token_id=self.eos_arg, seed=seed)
        )

    def _hf(self, name: str, prompt: list[int], max_new_tokens: int):
        b = self.cfg.baselines
        kwargs = hf.baseline_kwargs(
            name, self.assistant, b.prompt_lookup_num_tokens, b.num_assistant_tokens
        )
        if name == "hf_prompt_lookup":
            kwargs["max_matching_ngram_size"] = b.prompt_lookup_max_ngram
        return hf.hf_generate(
            self.target, prompt, max_new_tokens, self.eos, self.tokenizer.pad_token_id, **kwargs
        )

    def warmup(self, prompt: list[int]) -> None:
        n = min(self.cfg.max_new_tokens, 16)
        for i in range(self.cfg.warmup):
            self._ours("generate_autoregressive", [prompt], self.cfg.seed + i, n)
            self._ours("generate", [prompt], self.cfg.seed + i, n)
            for dec in self.plain.values():
                self._ours("generate_autoregressive", [prompt], self.cfg.seed + i, n, dec)
            for name in self.baselines:
                self._hf(name, prompt, n)

    # -- one dataset -------------------------------------------------------------------------
    def dataset(self, name: str) -> DatasetRecord:
        cfg = self.cfg
        convs = load_dataset(name, cfg.bench_dir, cfg.num_prompts)
        own = fp.dtype_name(next(self.target.parameters()).dtype)
        rec = DatasetRecord(name=name, conversations=len(convs), dtype=own)
        answers: list[list[str]] = [[] for _ in convs]
        stages = max(len(c) for c in convs) if (cfg.all_turns and convs) else 1
        total = sum(min(len(c), stages) for c in convs)
        bar = tqdm(total=total, desc=name, unit="prompt", dynamic_ncols=True)
        batch_no = 0
        for stage in range(stages):
            idx = [i for i, c in enumerate(convs) if len(c) > stage]
            prompts = [render(self.tokenizer, convs[i], answers[i], cfg.system_prompt) for i in idx]
            for lo in range(0, len(prompts), cfg.batch_size):
                chunk = prompts[lo : lo + cfg.batch_size]
                seed = cfg.seed + batch_no
                batch_no += 1
                ar, t_ar = self._ours("generate_autoregressive", chunk, seed, cfg.max_new_tokens)
                sp, t_sp = self._ours("generate", chunk, seed, cfg.max_new_tokens)
                rec.timer("autoregressive").add(sum(len(s) for s in ar.sequences), t_ar)
                rec.timer("speculative").add(sum(len(s) for s in sp.sequences), t_sp)
                rec.add_phases("autoregressive", ar)
                rec.add_phases("speculative", sp)
                for dt, dec in self.plain.items():  # the same chunk, plain, in another dtype
                    other, t_o = self._ours(
                        "generate_autoregressive", chunk, seed, cfg.max_new_tokens, dec
                    )
                    rec.timer(f"autoregressive_{dt}").add(sum(len(s) for s in other.sequences), t_o)
                rec.prompt_tokens += [len(p) for p in chunk]
                rec.accept_lengths += [list(a) for a in sp.accept_lengths]
                rec.verify_lengths += [list(v) for v in sp.verify_lengths]
                confs = sp.confidences or [[] for _ in chunk]
                rec.confidences += [[list(c) for c in req] for req in confs]
                rec.spec_tokens += [len(s) for s in sp.sequences]
                rec.matches += [list(a) == list(s) for a, s in zip(ar.sequences, sp.sequences)]
                for j, prompt in enumerate(chunk):
                    for base in self.baselines:
                        tokens, secs = self._hf(base, prompt, cfg.max_new_tokens)
                        rec.timer(base).add(len(tokens), secs)
                        if base == "hf_generate":
                            rec.hf_matches.append(tokens == list(ar.sequences[j]))
                    if stage + 1 < stages:
                        text = self.tokenizer.decode(
                            _strip_eos(list(ar.sequences[j]), self.eos), skip_special_tokens=True
                        )
                        answers[idx[lo + j]].append(text)
                bar.update(len(chunk))
        bar.close()
        return rec


# -- summaries ----------------------------------------------------------------------------------
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
    import transformers

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
        "device_name": (
            torch.cuda.get_device_name(param.device) if param.device.type == "cuda" else cpu_name()
        ),
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
    import json

    with open(path, "w", encoding="utf-8") as f:
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
                f.write(json.dumps(row) + "\n")


# -- the whole run ------------------------------------------------------------------------------
def check_draft_fits_target(draft_config, target_config, draft: str, target: str) -> None:
    """Refuse a draft whose dimensions do not fit the target (hidden size, vocabulary, a tapped
    layer the target lacks): it would crash deep in the decoder or index past the vocabulary.
    A draft that fits but names another target only gets a warning: it runs, with whatever
    acceptance it has there."""
    import sys

    from dspark.errors import BadInputError

    trained_for = getattr(draft_config, "target_name_or_path", None) or "an unnamed target"
    n_layers = int(target_config.num_hidden_layers)
    taps = [int(i) for i in draft_config.target_layer_ids]
    wrong = []
    if int(draft_config.hidden_size) != int(target_config.hidden_size):
        wrong.append(
            f"hidden size {draft_config.hidden_size} vs the target's {target_config.hidden_size}"
        )
    if int(draft_config.vocab_size) != int(target_config.vocab_size):
        wrong.append(
            f"vocabulary {draft_config.vocab_size} vs the target's {target_config.vocab_size}"
        )
    if max(taps) >= n_layers:
        wrong.append(f"tapped layers {taps} vs the target's {n_layers} layers")
    if wrong:
        raise BadInputError(
            f"draft={draft} was trained for {trained_for} and does not fit target={target}: "
            f"{'; '.join(wrong)}. Pass the target it was trained for (target={trained_for}, "
            "or leave target unset to use the draft's own), or a draft trained for this target"
        )
    trained_layers = getattr(draft_config, "num_target_layers", None)
    family = getattr(draft_config, "target_model_type", None)
    other_layers = trained_layers is not None and int(trained_layers) != n_layers
    other_family = family is not None and family != getattr(target_config, "model_type", family)
    if other_layers or other_family:
        print(
            f"warning: draft={draft} was trained for {trained_for} ({family}, "
            f"{trained_layers} layers), but target={target} is a {target_config.model_type} "
            f"target of {n_layers} layers: the dimensions fit, so it runs, but acceptance "
            "there is likely low",
            file=sys.stderr,
        )


def load_models(cfg, probe_dtype: bool = False):
    """(target, tokenizer, draft, target spec) on the configured device and dtype.

    `probe_dtype` (the benchmark): `dtype=auto` loads fp32, which `auto_settings.choose` then
    casts to the measured choice; other callers keep `auto` = the checkpoint's dtype."""
    from dspark.errors import BadInputError, require_draft_dir
    from dspark.export.load import load_draft
    from dspark.target.loading import _as_dtype, load_target

    device = resolve_device(cfg.device)
    # auto: loaded in fp32, then cast to the probe's choice (auto_settings.choose)
    dtype = torch.float32 if probe_dtype and cfg.dtype == "auto" else _as_dtype(cfg.dtype)
    # load_draft: a missing or damaged weights file is one error line naming it
    draft = load_draft(require_draft_dir(cfg.draft, "draft"))
    spec = cfg.target or getattr(draft.config, "target_name_or_path", None)
    if not spec:
        raise BadInputError(
            f"the draft at {cfg.draft} names no target_name_or_path; pass target=..."
        )
    target, tokenizer = load_target(spec, dtype=dtype, device=device)
    check_draft_fits_target(draft.config, target.config, cfg.draft, spec)
    # The draft may run in a cheaper dtype than the target (bf16 on AMX / tensor-core
    # hardware): verification by the target keeps decoding lossless whatever the draft proposes.
    wanted = getattr(cfg, "draft_dtype", None)  # the benchmark's key; other callers pass argparse
    draft_dtype = _as_dtype(wanted) if wanted not in (None, "auto") else target.dtype
    draft.to(device=device, dtype=draft_dtype).eval().requires_grad_(False)
    return target, tokenizer, draft, spec


def run(cfg, output_dir: str | os.PathLike) -> tuple[dict, str]:
    """Run every dataset, write results.json / report.md / PNGs; return (results, report)."""
    import json
    from pathlib import Path

    from dspark.errors import BadInputError
    from dspark.eval.auto_settings import choose as choose_settings
    from dspark.eval.capped_decoder import CappedVerifyDecoder
    from dspark.eval.config import check
    from dspark.eval.plots import make_plots
    from dspark.eval.report import render_report

    check(cfg)  # every value, before a model is loaded
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    target, tokenizer, draft, spec = load_models(cfg, probe_dtype=True)
    block = int(draft.config.block_size)
    if cfg.verify_policy in ("threshold", "scheduler") and draft.confidence_head is None:
        raise BadInputError(
            f"verify_policy={cfg.verify_policy} ranks drafts by confidence, but draft="
            f"{cfg.draft} has no confidence head; use verify_policy=full (or null)"
        )
    auto = choose_settings(cfg, target, draft)  # dtype=auto casts both here
    decoder = CappedVerifyDecoder(
        target,
        draft,
        max_verify=auto["verify_length"]["chosen"],
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        confidence_threshold=cfg.confidence_threshold,
        verify_policy=cfg.verify_policy,
        scheduler_batch=cfg.scheduler_batch,
        calibrate=cfg.calibrate,
        max_length=int(getattr(target.config, "max_position_embeddings", 0) or 32768),
        compile=cfg.compile,
    )
    layers = None
    assistant = None
    if "hf_assisted" in cfg.baselines.run:
        layers = cfg.baselines.assistant_layers or max(1, target.config.num_hidden_layers // 4)
        assistant = hf.truncated_self_draft(target, layers)
    bench = Bench(cfg, target, tokenizer, decoder, block, assistant, fp.plain_decoders(cfg, target))
    first = load_dataset(cfg.datasets[0], cfg.bench_dir, 1)
    bench.warmup(render(tokenizer, first[0], [], cfg.system_prompt))
    torch.manual_seed(cfg.seed)
    records = [bench.dataset(name) for name in cfg.datasets]
    has_conf = getattr(draft, "confidence_head", None) is not None
    conds = conditions(cfg, spec, draft, target, block, layers)
    conds["verify_length"] = auto["verify_length"]["chosen"]
    conds["dtype_requested"] = cfg.dtype
    conds["baseline_dtypes"] = [conds["dtype"], *bench.plain]
    results = summarize(records, block, cfg, has_conf, conds)
    results["auto_settings"] = auto
    plots = make_plots(results, out) if cfg.plots else {}
    results["plots"] = plots
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    write_rounds(records, out / "rounds.jsonl")
    report = render_report(results, plots)
    (out / "report.md").write_text(report)
    return results, report
