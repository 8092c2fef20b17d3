"""The benchmark run: prompts -> every decoder on the same prompts -> results dict.

Per dataset (and per turn stage when `all_turns`), requests go through, batch by batch and
interleaved so machine-load drift hits every method alike: dspark's autoregressive baseline
(`generate_autoregressive`), dspark's speculative decoder, plain decoding in each other
`baseline_dtypes` dtype (fastest_plain.py), then transformers' own decoders (greedy, batch 1).
Before any of it, `dtype=auto` / `verify_length=auto` are decided from this machine's measured
probe and the draft's held-out acceptance (auto_settings.py). Every call is timed with
`perf_counter` around it (CUDA synchronised); untimed warm-up calls come first. Later turns are
rendered with the target's own earlier answers (the autoregressive baseline's output, i.e.
exactly what the target says). The models are loaded by `models.py`; what is measured is
recorded and summarised by `summary.py`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dspark.decoding import DecoderOptions, Sampling, VerifyPolicy
from dspark.errors import BadInputError
from dspark.eval import baselines as hf
from dspark.eval import fastest_plain as fp
from dspark.eval.auto_settings import choose as choose_settings
from dspark.eval.benchmark_config import check
from dspark.eval.capped_decoder import CappedVerifyDecoder
from dspark.eval.models import load_models
from dspark.eval.plots import make_plots
from dspark.eval.prompts import load_dataset, render
from dspark.eval.report import render_report
from dspark.eval.summary import DatasetRecord, conditions, summarize, write_rounds
from dspark.fileio import write_text_atomic
from dspark.target.loading import eos_ids
from dspark.timing import sync


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


def run(cfg, output_dir: str | os.PathLike) -> tuple[dict, str]:
    """Run every dataset, write results.json / report.md / PNGs; return (results, report)."""
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
    policy = VerifyPolicy(
        cfg.verify_policy,
        confidence_threshold=cfg.confidence_threshold,
        scheduler_batch=cfg.scheduler_batch,
        calibrate=cfg.calibrate,
    )
    options = DecoderOptions(
        Sampling(cfg.temperature, cfg.top_k, cfg.top_p),
        policy,
        max_length=int(getattr(target.config, "max_position_embeddings", 0) or 32768),
        compile=cfg.compile,
        exact_rows=cfg.exact_rows,
    )
    max_verify = auto["verify_length"]["chosen"]
    decoder = CappedVerifyDecoder(target, draft, options, max_verify=max_verify)
    layers = None
    assistant = None
    if "hf_assisted" in cfg.baselines.run:
        layers = cfg.baselines.assistant_layers or max(1, target.config.num_hidden_layers // 4)
        assistant = hf.truncated_self_draft(target, layers)
    own = fp.dtype_name(next(target.parameters()).dtype)
    auto["baseline_skipped"] = fp.probe_skipped(cfg, auto, own)
    plain = fp.plain_decoders(cfg, target, auto["baseline_skipped"])
    bench = Bench(cfg, target, tokenizer, decoder, block, assistant, plain)
    first = load_dataset(cfg.datasets[0], cfg.bench_dir, 1)
    bench.warmup(render(tokenizer, first[0], [], cfg.system_prompt))
    torch.manual_seed(cfg.seed)
    records = [bench.dataset(name) for name in cfg.datasets]
    has_conf = getattr(draft, "confidence_head", None) is not None
    conds = conditions(cfg, spec, draft, target, block, layers)
    conds["verify_length"] = auto["verify_length"]["chosen"]
    conds["dtype_requested"] = cfg.dtype
    conds["exact_rows"] = decoder.exact_rows
    conds["baseline_dtypes"] = [conds["dtype"], *bench.plain]
    results = summarize(records, block, cfg, has_conf, conds)
    results["auto_settings"] = auto
    plots = make_plots(results, out) if cfg.plots else {}
    results["plots"] = plots
    write_rounds(records, out / "rounds.jsonl")
    report = render_report(results, plots)
    write_text_atomic(out / "report.md", report)
    # last, and whole or not at all: a results.json means the run finished (make's targets)
    write_text_atomic(out / "results.json", json.dumps(results, indent=2, default=str) + "\n")
    return results, report
