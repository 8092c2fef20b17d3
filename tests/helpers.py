"""Small builders shared by test modules (fixtures live in conftest.py)."""

import json
import os
import sys
from pathlib import Path

import torch

from dspark.config import DSparkConfig, choose_mask_token_id
from dspark.export.gguf import default_llama_cpp_dir
from dspark.modeling import DSparkDraftModel


def make_draft(target, tok, num_hidden_layers: int = 1, markov_rank: int = 8, **kw):
    """A randomly initialised (seed 0) draft for `target`, small unless told otherwise."""
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=num_hidden_layers,
        markov_rank=markov_rank,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
        **kw,
    )
    torch.manual_seed(0)
    return DSparkDraftModel.from_target(target, cfg)


CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides, return_hydra_config: bool = True):
    """The training run config for `overrides` (conf/ + recipes/), unchecked."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dspark.training.schema import register_configs

    GlobalHydra.instance().clear()
    register_configs(CONF.parent / "recipes")
    with initialize_config_dir(str(CONF), version_base=None):
        return compose("config", overrides=overrides, return_hydra_config=return_hydra_config)


def debug_cfg(tmp_path, data_dir, *overrides):
    """The debug recipe writing to `tmp_path` and training on `data_dir`, checked."""
    from dspark.training.schema import check

    base = ["recipe=debug", f"trainer.output_dir={tmp_path}", f"data.train={data_dir}"]
    cfg = compose_config([*base, *overrides], return_hydra_config=False)
    check(cfg)
    return cfg


def make_debug_data(root, limit: int = 24, answer_tokens: int = 32) -> Path:
    """`root/tokenized`: `limit` embedded prompts answered by the debug recipe's tiny target,
    tokenized, as `make debug-data` makes them (through the library, no subprocess)."""
    from dspark.data.prompts.sources import load_prompts
    from dspark.data.regeneration.decoder_backend import DecoderBackend
    from dspark.data.regeneration.regenerate import regenerate
    from dspark.data.regeneration.sampling import SamplingConfig
    from dspark.data.tokenize import tokenize_file
    from dspark.target import load_target

    root = Path(root)
    target, tok = load_target("tiny-qwen3")
    regenerate(
        load_prompts("embedded", split="train", limit=limit),
        DecoderBackend(target, tok, batch_size=32),
        root,
        sampling=SamplingConfig(max_new_tokens=answer_tokens, seed=0),
        batch_size=128,
        settings={"target": "tiny-qwen3"},
    )
    tokenize_file(
        str(root / "regenerated.jsonl"),
        str(root / "tokenized"),
        target="tiny-qwen3",
        max_length=768,
        tokenizer=tok,
    )
    return root / "tokenized"


def losses(out_dir):
    """{step: train/loss} of a run's metrics.jsonl."""
    rows = [json.loads(x) for x in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


# -- llama.cpp's own converter (tests/test_export_gguf.py, tests/test_llama_cpp_engine.py) --
# resolved at import, before conftest points DSPARK_CACHE at the session's private cache
REFERENCE = Path(os.environ.get("DSPARK_LLAMA_CPP_DIR") or default_llama_cpp_dir())
FETCH = f"{sys.executable} data_scripts/fetch_llama_cpp.py (or set DSPARK_LLAMA_CPP_DIR)"

# The converter picks `tokenizer.ggml.pre` by hashing how the tokenizer splits a fixed text,
# and knows only published vocabularies' hashes; a tiny target's 384-token vocabulary has
# none. Its pre-tokenizer is GPT-2's ByteLevel regex, llama.cpp's "gpt-2", so the run below
# answers that one look-up and leaves the rest of the converter as it is.
CONVERT = """import runpy, sys
ref = sys.argv.pop(1)
sys.path.insert(0, ref)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = ref + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def random_draft(target, tok, arch, **kw):
    kw.setdefault("block_size", 4)
    draft = make_draft(target, tok, num_hidden_layers=2, target_name_or_path=f"tiny-{arch}", **kw)
    with torch.no_grad():  # trained-looking weights (ones / zeros would hide swapped tensors)
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return draft.eval()


# ------------------------------------------------------------------ decoding
# Stand-in drafts and references shared by the decoder tests (tests/test_decoding*.py, the
# load sweep's and the GPU tests). They implement the draft inference API of docs/contracts.md,
# so the decoder can be checked for losslessness with ANY draft:
# - `OracleDraft` proposes the known greedy continuation with seeded corruptions, so rounds mix
#   accepted prefixes and rejections at every depth;
# - `PromptAwareDraft` is close to (not equal to) the target for the first round after a prompt.
from types import SimpleNamespace  # noqa: E402

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from dspark.decoding import DecodeObserver  # noqa: E402

TAPS = [0, 2]  # the target layers the stand-in drafts read


def greedy_reference(model, prompt, max_new, eos=()):
    """Plain greedy decoding by full recomputation (no cache at all)."""
    seq = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(max_new):
            tok = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(tok)
            seq.append(tok)
            if tok in eos:
                break
    return out


def prompts_for(vocab, lengths, seed):
    """Seeded random prompts of these lengths (ids below vocab - 2: the mask id stays free)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 2, (n,), generator=g).tolist() for n in lengths]


def oracle_case(model, seed: int, max_new: int, lengths=(5, 8, 3), gamma: int = 4):
    """`(prompts, greedy references, OracleDraft)` for three seeded prompts: a draft that
    proposes the target's own greedy continuation (its acceptance is scripted by its seed)."""
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab, lengths, seed)
    refs = [greedy_reference(model, p, max_new) for p in prompts]
    draft = OracleDraft([p + r for p, r in zip(prompts, refs)], vocab, gamma=gamma, seed=3)
    return prompts, refs, draft


class Recorder(DecodeObserver):
    """The decoder's test hook: the request each live row serves this round; with
    `keep_caches`, each finished request's final (target cache, context cache, row)."""

    def __init__(self, keep_caches: bool = False):
        self.requests: list[int] | None = None
        self.keep_caches = keep_caches
        self.final: dict[int, tuple] = {}

    def on_round(self, requests):
        self.requests = requests

    def on_finish(self, request, cache, ctx, row):
        if self.keep_caches:  # a copy: the live batch reuses a finished row's slot in place
            index = torch.tensor([row], device=cache.keys[0].device)
            self.final[request] = (cache.select(index), ctx and ctx.select(index), 0)


class OracleDraft(nn.Module):
    """Proposes `refs[b][p+1 : p+1+gamma]` (the known continuation), each token replaced by a
    random one with probability `corrupt`; informative confidence (high when uncorrupted)."""

    def __init__(self, refs, vocab, gamma=4, corrupt=0.3, markov=True, seed=0):
        super().__init__()
        self.refs, self.vocab, self.gamma, self.corrupt = refs, vocab, gamma, corrupt
        self.config = SimpleNamespace(
            block_size=gamma,
            target_layer_ids=list(TAPS),
            mask_token_id=vocab - 1,
            markov_rank=4 if markov else 0,
        )
        self.g = torch.Generator().manual_seed(seed)
        # pass `observer=draft.recorder` to the decoder: it maps live rows to requests
        self.recorder = Recorder()
        self.markov_head = ZeroMarkov(vocab) if markov else None
        self.confidence_head = OracleConfidence(vocab)

    def encode_context(self, tapped):
        return tapped[..., :4]

    def context_kv(self, ctx, position_ids):
        return [(ctx[:, None], ctx[:, None])]

    def block_hidden(self, block_ids, block_position_ids, ctx_kv, ctx_valid):
        bsz, g = block_ids.shape
        toks = torch.randint(0, self.vocab, (bsz, g), generator=self.g)
        good = torch.rand(bsz, g, generator=self.g) >= self.corrupt
        requests = self.recorder.requests if self.recorder.requests is not None else range(bsz)
        for b, req in enumerate(requests):
            p = int(block_position_ids[b, 0])
            ref = self.refs[req][p + 1 : p + 1 + g]
            toks[b, : len(ref)] = torch.where(
                good[b, : len(ref)], torch.tensor(ref), toks[b, : len(ref)]
            )
        h = F.one_hot(toks, self.vocab).float() * 20.0
        h[..., -1] = good.float()  # the mask id is never proposed: carries the oracle flag
        return h

    def lm_head(self, h):
        return torch.cat([h[..., :-1], torch.full_like(h[..., -1:], -1e4)], -1)


class ZeroMarkov(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def init_state(self, batch):
        return None

    def step(self, h_k, prev_token, state):
        return h_k.new_zeros(h_k.shape[0], self.vocab), h_k.new_zeros(h_k.shape[0], 4), state


class OracleConfidence(nn.Module):
    def __init__(self, vocab):
        super().__init__()

    def forward(self, h_k, feat):
        return torch.where(h_k[:, -1] > 0, 3.0, -3.0)


class PromptAwareDraft(nn.Module):
    """A draft close to (but deliberately not equal to) the target, valid for the first round
    after a fixed prompt: its q is the target's own logits for the drafted prefix plus fixed
    noise, so verification sees a realistic mix of acceptances and rejections."""

    def __init__(self, target, prompt, gamma=3, markov=True, noise=1.0, seed=0):
        super().__init__()
        vocab = target.config.vocab_size
        self.target, self.prompt = target, torch.tensor(prompt)
        self.config = SimpleNamespace(
            block_size=gamma,
            target_layer_ids=list(TAPS),
            mask_token_id=vocab - 1,
            markov_rank=4 if markov else 0,
        )
        g = torch.Generator().manual_seed(seed)
        self.noise = torch.randn(gamma, vocab, generator=g) * noise
        self.markov_head = PrefixMarkov(self) if markov else None
        self.confidence_head = None

    def target_logits(self, prefix):
        if not self.first_round:  # later rounds: any q is fine, keep them cheap
            return torch.zeros(prefix.shape[0], self.noise.shape[1])
        uniq, inverse = torch.unique(prefix, dim=0, return_inverse=True)  # few distinct rows
        return self.target(uniq).logits[:, -1].float()[inverse]

    def encode_context(self, tapped):
        return tapped[..., :4]

    def context_kv(self, ctx, position_ids):
        return [(ctx[:, None], ctx[:, None])]

    def block_hidden(self, block_ids, block_position_ids, ctx_kv, ctx_valid):
        bsz, gamma = block_ids.shape
        self.first_round = bool((block_position_ids[:, 0] == len(self.prompt)).all())
        if self.markov_head is not None:
            return torch.zeros(bsz, gamma, self.noise.shape[1])
        prefix = torch.cat([self.prompt.expand(bsz, -1), block_ids[:, :1]], 1)
        slots = []
        for k in range(gamma):  # parallel slots: guesses along the target's greedy path
            logits = self.target_logits(prefix)
            slots.append(logits + self.noise[k])
            prefix = torch.cat([prefix, logits.argmax(-1, keepdim=True)], 1)
        return torch.stack(slots, 1)

    def lm_head(self, h):
        return h


class PrefixMarkov(nn.Module):
    def __init__(self, draft):
        super().__init__()
        self.draft = [draft]

    def init_state(self, batch):
        return self.draft[0].prompt.expand(batch, -1), 0

    def step(self, h_k, prev_token, state):
        prefix, k = state
        prefix = torch.cat([prefix, prev_token[:, None]], 1)
        bias = self.draft[0].target_logits(prefix) + self.draft[0].noise[k]
        return bias, h_k.new_zeros(h_k.shape[0], 4), (prefix, k + 1)


def exact_joint(model, prompt, depth, temperature, top_k, top_p=1.0):
    """Exact warped target distribution of the first `depth` tokens: {(t1, ..): prob}."""
    from dspark.decoding.sampling import warp

    joint = {(): 1.0}
    with torch.no_grad():
        for _ in range(depth):
            keys = list(joint)
            probs = warp(
                model(torch.tensor([prompt + list(k) for k in keys])).logits[:, -1],
                temperature,
                top_k,
                top_p,
            )
            nxt = {}
            for i, key in enumerate(keys):
                for t in torch.nonzero(probs[i]).flatten().tolist():
                    nxt[key + (t,)] = joint[key] * float(probs[i, t])
            joint = nxt
    return joint


def chisquare(samples: list[list[int]], probs: dict):
    from scipy.stats import chisquare

    n = len(samples)
    counts = {}
    for s in samples:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    assert set(counts) <= set(probs), "an outcome the target cannot produce"
    keys = sorted(probs, key=probs.get, reverse=True)
    obs, exp, o_rest, e_rest = [], [], 0, 0.0
    for key in keys:
        if probs[key] * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(probs[key] * n)
        else:
            o_rest += counts.get(key, 0)
            e_rest += probs[key] * n
    if e_rest > 0:
        obs.append(o_rest)
        exp.append(e_rest)
    scale = n / sum(exp)  # the exact joint sums to 1 up to float rounding
    return chisquare(obs, [e * scale for e in exp]).pvalue


def real_draft(model, tok, **kw):
    """A random-init (seed 0) DSpark draft for `model` in eval mode: block 4, Markov rank 16,
    one layer unless told otherwise."""
    kw = {"block_size": 4, "markov_rank": 16, **kw}
    return make_draft(model, tok, **kw).eval().requires_grad_(False)


# ------------------------------------------------------------------ objective
# A tiny supervised batch and reduced-vocabulary drafts (tests/test_objective.py,
# tests/test_chunked_loss.py).
def make_batch(S=18, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 300, (2, S), generator=gen)
    am = torch.ones(2, S, dtype=torch.long)
    am[1, 14:] = 0  # right padding
    lm = torch.ones(2, S, dtype=torch.long)
    lm[:, :3] = 0  # prompt
    lm[0, 10] = 0  # a gap inside the answer
    lm[1, 14:] = 0
    return {"input_ids": ids, "attention_mask": am, "loss_mask": lm}


def reduced_draft(target, tok, kept, **kw):
    """`make_draft`'s draft with a reduced vocabulary of the target ids `kept [K]`, built the
    way training builds one (`draft_vocab_size` K, `from_target(kept_ids=)`)."""
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=1,
        markov_rank=8,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
        draft_vocab_size=int(kept.numel()),
        **kw,
    )
    torch.manual_seed(0)
    draft = DSparkDraftModel.from_target(target, cfg, kept_ids=kept)
    assert torch.equal(draft.kept_target_ids, kept)
    assert draft.lm_head.weight.shape[0] == kept.numel()
    return draft


def kept_ids_for(target, batch, seed=0):
    """Sorted target ids: every target argmax of the batch (so greedy matches happen) plus a
    random half of the vocabulary (so some data tokens fall outside)."""
    with torch.no_grad():
        top = target(batch["input_ids"]).logits.argmax(-1).flatten()
    V = target.config.vocab_size
    half = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[: V // 2]
    return torch.unique(torch.cat([top, half]))


# ------------------------------------------------------------------ resume
def kill_then_resume(monkeypatch, cfg, kill_at: int) -> dict:
    """Run the training loop on `cfg` with its objective's `kill_at`-th step raising (a kill),
    then run it again unpatched; the second run's result (it resumes from a checkpoint)."""
    import pytest

    from dspark.training import loop

    real_build = loop.build_objective_for

    class Killed(RuntimeError):
        pass

    def dying_build(*a, **k):
        obj, calls = real_build(*a, **k), [0]
        step = obj.step

        def counted(*sa, **sk):
            calls[0] += 1
            if calls[0] == kill_at:
                raise Killed
            return step(*sa, **sk)

        obj.step = counted
        return obj

    monkeypatch.setattr(loop, "build_objective_for", dying_build)
    with pytest.raises(Killed):
        loop.run(cfg)
    monkeypatch.setattr(loop, "build_objective_for", real_build)
    return loop.run(cfg)


# ------------------------------------------------------------------ feature caches
def make_rows(vocab: int, n: int = 10, seed: int = 0) -> dict:
    """Rows shaped like chat data: a prompt (mask 0), answers (mask 1) with a gap, and some
    rows ending in unsupervised tokens, so `positions=loss` drops something at both ends."""
    g = torch.Generator().manual_seed(seed)
    rows = {"index": [], "input_ids": [], "loss_mask": []}
    for i in range(n):
        length = int(torch.randint(12, 40, (1,), generator=g))
        prompt = int(torch.randint(3, 8, (1,), generator=g))
        mask = [0] * prompt + [1] * (length - prompt)
        if i % 3 == 0:  # a second user turn in the middle
            mask[length // 2 : length // 2 + 3] = [0, 0, 0]
        if i % 2 == 0:  # trailing tokens outside the loss
            mask[-4:] = [0, 0, 0, 0]
        rows["index"].append(i)
        rows["input_ids"].append(torch.randint(0, vocab, (length,), generator=g).tolist())
        rows["loss_mask"].append(mask)
    return rows


def save_rows(rows: dict, path: Path) -> Path:
    import datasets

    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    return path


class ScriptedClock:
    """A stand-in for the `time` module `dspark.timing` reads: each timed call (a start read,
    then an end read) lasts the next of `durations` seconds. Install it with
    `monkeypatch.setattr(dspark.timing, "time", ScriptedClock([...]))`; `reads` counts clock
    reads, so a test also sees that nothing else was timed."""

    def __init__(self, durations):
        self.durations, self.reads, self._now = list(durations), 0, 100.0

    def perf_counter(self) -> float:
        self.reads += 1
        if self.reads % 2:  # a start: the next call begins a whole second later
            self._now = float(int(self._now) + 1)
        else:
            self._now += self.durations[self.reads // 2 - 1]
        return self._now
