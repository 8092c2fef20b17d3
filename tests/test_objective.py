"""The DSpark objective against a plain reference, token pooling across ranks, online capture,
and a short training run (loss falls, trainables move, frozen weights stay bit-identical)."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import kept_ids_for, make_batch, make_draft, reduced_draft

from dspark.objectives import DFLASH_CONFIG_OVERRIDES, LocalReducer, build_objective
from dspark.target.capture import BatchFeatures, OnlineTargetCapture

G = 7


def reference(draft, target, batch, ce_w=0.1, l1_w=0.9, conf_w=1.0, decay=4.0, kept=None):
    """Loops over sequences, anchors and slots through the draft's inference API. `kept`
    (sorted target ids of a reduced draft vocabulary): p_d is placed into a zero [V] vector at
    those ids, CE skips labels outside them, the draft's argmax is read through them."""
    ids, am = batch["input_ids"], batch["attention_mask"]
    lm = (batch["loss_mask"] * am).tolist()
    B, S = ids.shape
    with torch.no_grad():
        out = target(ids, attention_mask=am, output_hidden_states=True)
    tapped = torch.cat([out.hidden_states[i + 1] for i in draft.config.target_layer_ids], -1)
    t_logits = out.logits.float()  # the target's own (post final norm) logits
    ctx = draft.encode_context(tapped)
    kv = draft.context_kv(ctx, torch.arange(S).expand(B, -1))
    head, conf_head = draft.markov_head, draft.confidence_head
    tot = dict(w=0.0, w_ce=0.0, ce=0.0, l1=0.0, bce=0.0)
    oov = 0
    taus, cstars, conf_err = [], {k: [] for k in range(G)}, []
    g_taus, g_match = [], {k: [] for k in range(G)}
    for b in range(B):
        for p in range(S - 1):
            if not (lm[b][p] and lm[b][p + 1]):
                continue
            blk = torch.tensor([[int(ids[b, p])] + [draft.config.mask_token_id] * (G - 1)])
            pos = torch.arange(p, p + G)[None]
            kv_b = [(k[b : b + 1], v[b : b + 1]) for k, v in kv]
            h = draft.block_hidden(blk, pos, kv_b, (torch.arange(S) < p)[None])[0]
            state = head.init_state(1) if head is not None else None
            tau, surv = 1.0, 1.0
            g_tau, g_surv = 1.0, 1.0
            for k in range(G):
                t = p + k + 1
                if t >= S or not lm[b][t]:
                    break
                logits = draft.lm_head(h[k])
                feat = None
                if head is not None:
                    bias, feat, state = head.step(h[k][None], ids[b, p + k][None], state)
                    logits = logits + bias[0]
                label = int(ids[b, t])
                ids_of = list(range(logits.shape[-1])) if kept is None else kept.tolist()
                w = math.exp(-k / decay)
                if label in ids_of:
                    ce = -torch.log_softmax(logits.float(), -1)[ids_of.index(label)]
                    tot["w_ce"] += w
                    tot["ce"] = tot["ce"] + w * ce
                else:
                    oov += 1
                p_t = torch.softmax(t_logits[b, p + k], -1)
                p_d = torch.zeros_like(p_t).index_put(
                    (torch.tensor(ids_of),), torch.softmax(logits.float(), -1)
                )
                l1 = (p_d - p_t).abs().sum()
                c = float(min(max(1 - float(l1) / 2, 0.0), 1.0))
                tot["w"] += w
                tot["l1"] = tot["l1"] + w * l1
                if conf_head is not None:
                    z = conf_head(h[k][None], feat)[0]
                    bce = -(c * F.logsigmoid(z) + (1 - c) * F.logsigmoid(-z))
                    tot["bce"] = tot["bce"] + w * bce
                    conf_err.append(abs(float(torch.sigmoid(z)) - c))
                surv *= c
                tau += surv
                cstars[k].append(c)
                hit = float(ids_of[int(logits.argmax())] == int(t_logits[b, p + k].argmax()))
                g_surv *= hit
                g_tau += g_surv
                g_match[k].append(hit)
            taus.append(tau)
            g_taus.append(g_tau)
    loss = ce_w * tot["ce"] / tot["w_ce"] + (l1_w * tot["l1"] + conf_w * tot["bce"]) / tot["w"]
    n_slots = sum(len(v) for v in cstars.values())
    metrics = {
        "out_of_vocab_labels": oov / n_slots,
        "tau_probabilistic": sum(taus) / len(taus),
        "blocks": float(len(taus)),
        "supervised_tokens": float(sum(len(v) for v in cstars.values())),
        **{f"accept_rate@{k + 1}": sum(v) / len(v) if v else 0.0 for k, v in cstars.items()},
        "tau_greedy": sum(g_taus) / len(g_taus),
        **{f"greedy_accept@{k + 1}": sum(v) / len(v) if v else 0.0 for k, v in g_match.items()},
    }
    if conf_head is not None:
        metrics["confidence_error"] = sum(conf_err) / len(conf_err)
    return loss, metrics


CASES = [
    ("qwen3", {}, False),
    ("llama", {"markov_head_type": "rnn"}, False),
    ("qwen2", {"markov_head_type": "gated", "confidence_head_with_markov": False}, False),
    ("qwen3", DFLASH_CONFIG_OVERRIDES, False),
    ("qwen3", {}, True),  # reduced draft vocabulary
    ("llama", {"markov_head_type": "rnn", "enable_confidence_head": False}, True),
]


@pytest.mark.parametrize("arch_, over, reduced", CASES)
def test_loss_matches_plain_reference(tiny_target, arch_, over, reduced):
    target, tok = tiny_target(arch_)
    draft = make_draft(target, tok, **over)
    batch = make_batch()
    kept = kept_ids_for(target, batch) if reduced else None
    if reduced:
        draft = reduced_draft(target, tok, kept, **over)
    name = "dflash" if over is DFLASH_CONFIG_OVERRIDES else "dspark"
    # chunks of 16 slots: several chunks, recomputed in backward
    obj = build_objective(name, target, draft.config, num_anchors=64, chunk_slots=16)
    loss, metrics = obj.step(draft, batch, LocalReducer())
    params = [p for p in draft.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    ref_loss, ref_metrics = reference(draft, target, batch, kept=kept)
    if reduced:  # the reduced case exercises both kinds of label and some greedy matches
        assert 0.1 < ref_metrics["out_of_vocab_labels"] < 0.9
        assert ref_metrics["tau_greedy"] > 1.0
    ref_grads = torch.autograd.grad(ref_loss, params)
    torch.testing.assert_close(loss, ref_loss.float(), rtol=1e-5, atol=1e-6)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=1e-4, atol=1e-6)
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert metrics["loss"] == pytest.approx(float(ref_loss), rel=1e-5)
    assert ("confidence_bce" in metrics) == (draft.confidence_head is not None)


class _PairReducer:
    """Rank r of a 2-rank job whose other rank reported `other` for the same stats vector."""

    world_size = 2

    def __init__(self, other):
        self.other = other

    def sum(self, t):
        return t + self.other


class _Recorder(LocalReducer):
    def sum(self, t):
        self.seen = t.clone()
        return t


def test_token_pooled_across_ranks(tiny_target):
    """Averaging the per-rank losses (what DDP does to gradients) == the loss of the union."""
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok)
    obj = build_objective("dspark", target, draft.config, num_anchors=64)
    full = make_batch()
    halves = [{k: v[i : i + 1] for k, v in full.items()} for i in (0, 1)]
    stats = []
    for half in halves:
        rec = _Recorder()
        obj.step(draft, half, rec)
        stats.append(rec.seen)
    losses, metrics = [], []
    for r in (0, 1):
        loss, m = obj.step(draft, halves[r], _PairReducer(stats[1 - r]))
        losses.append(loss)
        metrics.append(m)
    whole, whole_m = obj.step(draft, full, LocalReducer())
    torch.testing.assert_close((losses[0] + losses[1]) / 2, whole, rtol=1e-5, atol=1e-6)
    for key, value in whole_m.items():
        assert metrics[0][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        assert metrics[1][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_online_capture_matches_hidden_states(tiny_target, arch):
    target, _ = tiny_target(arch)
    batch = make_batch()
    cap = OnlineTargetCapture(target, [0, 2])
    hooks_before = [len(layer._forward_hooks) for layer in target.model.layers]
    feats = cap(batch)
    with torch.no_grad():
        out = target(
            batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
        )
    want = torch.cat([out.hidden_states[1], out.hidden_states[3]], -1)
    torch.testing.assert_close(feats.tapped, want)
    # post-norm: lm_head(final_hidden) are the target's own logits
    torch.testing.assert_close(target.lm_head(feats.final_hidden), out.logits)
    assert [len(layer._forward_hooks) for layer in target.model.layers] == hooks_before
    with pytest.raises(ValueError, match="not tappable"):
        OnlineTargetCapture(target, [3])


def test_offline_feature_seam_and_eval(tiny_target):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok)
    batch = make_batch()
    online = build_objective("dspark", target, draft.config, num_anchors=64)
    feats = OnlineTargetCapture(target, draft.config.target_layer_ids)(batch)
    offline = build_objective(
        "dspark",
        None,
        draft.config,
        num_anchors=64,
        feature_source=BatchFeatures(),
        target_lm_head=target.lm_head,
    )
    loss_on, m_on = online.step(draft, batch)
    loss_off, m_off = offline.step(
        draft, {**batch, "tapped": feats.tapped, "final_hidden": feats.final_hidden}
    )
    torch.testing.assert_close(loss_on, loss_off)
    ev = online.evaluate(draft, batch)
    assert ev == online.evaluate(draft, batch)
    assert set(ev) == set(m_on) and ev["tau_probabilistic"] == pytest.approx(
        m_on["tau_probabilistic"]
    )
    assert all(p.grad is None for p in draft.parameters())


def test_objective_registry_errors(tiny_target):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok)
    with pytest.raises(ValueError, match="markov_rank=0"):
        build_objective("dflash", target, draft.config)
    with pytest.raises(ValueError, match="unknown objective"):
        build_objective("eagle9", target, draft.config)


def test_anchor_subsampling_uses_generator(tiny_target):
    target, tok = tiny_target("qwen3")
    draft = make_draft(target, tok)
    batch = make_batch()
    a = build_objective("dspark", target, draft.config, num_anchors=3, seed=1)
    b = build_objective("dspark", target, draft.config, num_anchors=3, seed=1)
    la, ma = a.step(draft, batch)
    lb, mb = b.step(draft, batch)
    torch.testing.assert_close(la, lb)
    assert ma["blocks"] == 6.0
    state = a.state_dict()
    l1, _ = a.step(draft, batch)
    a.load_state_dict(state)
    l2, _ = a.step(draft, batch)
    torch.testing.assert_close(l1, l2)


@pytest.mark.parametrize(
    "arch_, over",
    [
        ("qwen3", {}),
        ("qwen2", {"markov_head_type": "gated"}),
        ("llama", {"markov_head_type": "rnn"}),
    ],
)
def test_training_lowers_loss_and_keeps_frozen_weights(tiny_target, arch_, over):
    target, tok = tiny_target(arch_)
    draft = make_draft(target, tok, **over)
    obj = build_objective("dspark", target, draft.config, num_anchors=64)
    batch = make_batch(S=16)
    trainable = {n: p.detach().clone() for n, p in draft.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in draft.named_parameters() if not p.requires_grad}
    assert set(frozen) == {"embed_tokens.weight", "lm_head.weight"}
    target_before = {n: p.detach().clone() for n, p in target.named_parameters()}
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    before_m = obj.evaluate(draft, batch)
    before = before_m["loss"]
    for _ in range(20):
        loss, _ = obj.step(draft, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after_m = obj.evaluate(draft, batch)
    after = after_m["loss"]
    assert after < 0.9 * before
    # the draft learns the target's argmax too: greedy acceptance rises from ~chance
    assert after_m["tau_greedy"] > before_m["tau_greedy"] + 0.05, (before_m, after_m)
    params = dict(draft.named_parameters())
    for n, p0 in trainable.items():
        assert not torch.equal(params[n], p0), f"{n} did not change"
    for n, p0 in frozen.items():
        assert torch.equal(params[n], p0), f"{n} changed"
    for n, p in target.named_parameters():
        assert torch.equal(p, target_before[n]) and p.grad is None, n


def test_batch_without_supervised_tokens(tiny_target):
    target, tok = tiny_target("llama")
    draft = make_draft(target, tok, markov_head_type="rnn")
    obj = build_objective("dspark", target, draft.config)
    batch = make_batch(S=12)
    batch["loss_mask"].zero_()
    loss, metrics = obj.step(draft, batch)
    loss.backward()
    assert float(loss) == 0.0 and metrics["supervised_tokens"] == 0 and metrics["blocks"] == 0
    assert all(math.isfinite(v) for v in metrics.values())
