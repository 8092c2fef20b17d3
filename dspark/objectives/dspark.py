"""The DSpark objective (method doc, section 2): every anchor block in one pass, teacher-forced.

Per supervised slot k (weights w_k = exp(-k / loss_decay_gamma)), on the Markov-corrected
draft logits: CE vs the data token (`ce_weight`), L1 = sum_v |p_d - p_t| vs the target's
post-norm distribution (`l1_weight`), confidence BCE-with-logits vs the detached
c* = clamp(1 - L1/2, 0, 1) (`confidence_weight`). Each term is sum(w * term) / sum(w) over the
supervised slots of ALL ranks (CE over those whose label the draft vocabulary holds): the
denominators go through `reducer.sum`, and the returned loss is
`world_size * local_numerator / global_denominator` per term, so DDP's gradient averaging
yields the token-pooled global mean. The vocabulary-sized work runs `chunk_slots` slots at a
time inside the draft's forward (`forward(slot_loss=, chunk_size=)`), recomputed in backward.

A reduced draft vocabulary (K kept target ids, `draft.kept_target_ids`) changes each term to
what lossless verification does (`dspark.losses`): p_d is 0 outside the kept ids and p_t keeps
all its mass, so L1 counts the target's mass outside them and c* = sum_v min(p_d, p_t) is the
real acceptance probability; the greedy match maps the draft's argmax to its target id; CE
leaves out slots whose label is outside (`out_of_vocab_labels` is their share).

Metrics (already global):
- `loss`, `ce`, `l1`, `confidence_bce`: the weighted global means above;
- `accept_rate@k` (k = 1..gamma, k = 1 is slot 0, the first drafted token): mean c* over the
  supervised slots at that position (0 when there are none);
- `tau_probabilistic`: mean over valid blocks of 1 + sum_k prod_{i<=k} c*_i, where only a
  block's supervised prefix counts (see `losses.tau_per_block`: a block truncated by the end of
  the data or a loss-mask gap contributes its supervised slots only);
  `tau_probabilistic_full_blocks`: the same over blocks whose gamma slots are all supervised;
- `tau_greedy`, `greedy_accept@k`: the same with c* replaced by 1[draft argmax == target
  argmax], i.e. what greedy (T=0) decoding accepts, teacher-forced;
- `confidence_error`: mean |sigmoid(confidence logit) - c*| over supervised slots;
- `supervised_tokens`, `blocks`: global counts;
- `out_of_vocab_labels`: share of supervised slots whose data token a reduced draft vocabulary
  lacks (0 for the full vocabulary).

Packed batches (several conversations per row, `dspark.data.packing`) carry `document_ids` and
`position_ids`; anchors and supervised slots then stay inside one document, each document has
its own anchor budget (`dspark.objectives.documents`), and the draft gets both, so each
conversation's loss terms equal those it has alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from dspark import losses as L
from dspark.fused_slot_terms import slot_ce_l1
from dspark.objectives.base import (
    LocalReducer,
    ObjectiveBase,
    ObjectiveContext,
    Reducer,
    reduce_named,
)
from dspark.objectives.documents import document_starts, sample_document_anchors
from dspark.objectives.dspark_settings import (
    CHUNK_SLOTS,
    LOSS_WEIGHTS,
    DSparkSettings,
)
from dspark.objectives.feature_noise import FEATURE_NOISE, noisy_features
from dspark.objectives.registry import register_objective
from dspark.target.capture import (
    FeatureSource,
    KeptHead,
    OnlineTargetCapture,
    kept_head,
    kept_target_logits,
    target_logits,
)

if TYPE_CHECKING:
    from dspark.modeling.slot_chunks import SlotLoss


@register_objective("dspark", settings=DSparkSettings)
class DSparkObjective(ObjectiveBase):
    # How the training loop and report treat metrics, declared here so they name none:
    count_metrics = ("supervised_tokens", "blocks")  # summed over held-out batches, not averaged
    progress_metrics = ("loss", "tau_probabilistic", "tau_greedy")  # the progress bar
    curve_metrics = ("tau_probabilistic", "tau_greedy")  # the report's acceptance plot

    def __init__(
        self,
        target,
        draft_config,
        *,
        ce_weight: float = LOSS_WEIGHTS.ce_weight,
        l1_weight: float = LOSS_WEIGHTS.l1_weight,
        confidence_weight: float = LOSS_WEIGHTS.confidence_weight,
        loss_decay_gamma: float = LOSS_WEIGHTS.loss_decay_gamma,
        chunk_slots: int | None = CHUNK_SLOTS,
        feature_noise: float = FEATURE_NOISE,
        num_anchors: int | None = None,
        seed: int = 0,
        eval_seed: int = 1234,
        feature_source: FeatureSource | None = None,
        target_lm_head: torch.nn.Module | None = None,
    ) -> None:
        """`target`: the frozen target (online capture and its lm_head); may be None when a
        `feature_source` and `target_lm_head` are given (offline features).
        `num_anchors=None` uses `draft_config.num_anchors`; `chunk_slots`: supervised slots per
        loss chunk (0 / None: one chunk, no recomputation). `feature_noise`: training steps
        (never `evaluate`) add Gaussian noise to the target's tapped hidden states, std
        `feature_noise` times each tapped vector's RMS (`noisy_features`)."""
        self.config = draft_config
        self.block_size = int(draft_config.block_size)
        self.num_anchors = int(num_anchors if num_anchors is not None else draft_config.num_anchors)
        self.ce_weight = float(ce_weight)
        self.l1_weight = float(l1_weight)
        self.confidence_weight = float(confidence_weight)
        self.loss_decay_gamma = float(loss_decay_gamma)
        if self.loss_decay_gamma <= 0:
            raise ValueError(f"loss_decay_gamma must be > 0 (got {loss_decay_gamma})")
        self.chunk_slots = int(chunk_slots or 0)
        self.feature_noise = float(feature_noise)
        if self.feature_noise < 0:
            raise ValueError(f"feature_noise must be >= 0 (got {feature_noise})")
        if self.chunk_slots < 0:
            raise ValueError(f"chunk_slots must be >= 0 (got {chunk_slots})")
        if self.num_anchors < 1:
            raise ValueError(f"num_anchors must be >= 1 (got {self.num_anchors})")
        if feature_source is None:
            if target is None:
                raise ValueError("online capture needs the target; pass target or a feature_source")
            feature_source = OnlineTargetCapture(target, draft_config.target_layer_ids)
        self.features = feature_source
        if target_lm_head is None:
            if target is None:
                raise ValueError("pass target or target_lm_head for the target distribution")
            target_lm_head = target.get_output_embeddings()
        self.target_lm_head = target_lm_head
        self.use_confidence = bool(draft_config.enable_confidence_head)
        self.seed = int(seed)
        self.eval_seed = int(eval_seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        # (kept ids, the target head's fp32 rows at them): `_kept_head`
        self._kept_head_cache: tuple[torch.Tensor, KeptHead] | None = None

    # ---------------------------------------------------------------- state (resume)
    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    @classmethod
    def from_settings(cls, settings: DSparkSettings, context: ObjectiveContext):
        """Its settings, the run's seed (anchor sampling; its RNG state is checkpointed) and
        the feature source (cached features with `data.features`)."""
        return cls(
            context.target,
            context.draft_config,
            **asdict(settings),
            seed=context.seed,
            feature_source=context.feature_source,
        )

    # ---------------------------------------------------------------- public
    def step(
        self,
        draft,
        batch: Mapping[str, torch.Tensor],
        reducer: Reducer | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Training step: `(loss, metrics)`; the draft is called once, through `forward`."""
        gen = generator or self.generator
        return self._run(draft, batch, reducer or LocalReducer(), gen, self.feature_noise)

    @torch.no_grad()
    def evaluate(
        self, draft, batch: Mapping[str, torch.Tensor], reducer: Reducer | None = None
    ) -> dict[str, float]:
        """Held-out metrics (no grad), anchors drawn with a fixed seed per call."""
        gen = torch.Generator().manual_seed(self.eval_seed)
        return self._run(draft, batch, reducer or LocalReducer(), gen, 0.0)[1]

    # ---------------------------------------------------------------- internals
    def _run(self, draft, batch, reducer: Reducer, generator: torch.Generator, noise: float):
        g = self.block_size
        input_ids = batch["input_ids"]
        B, S = input_ids.shape
        dev = input_ids.device
        loss_mask = batch["loss_mask"].bool()
        if "attention_mask" in batch:
            loss_mask = loss_mask & batch["attention_mask"].bool()
        loss_mask = loss_mask & ~document_starts(batch)
        # Packed rows (dspark.data.packing): the draft also needs the documents and positions.
        packed = {k: batch[k] for k in ("document_ids", "position_ids") if k in batch}

        feats = self.features(batch)
        if "document_ids" in batch:  # packed: num_anchors per conversation, not per row
            anchors, valid = sample_document_anchors(
                loss_mask, batch["document_ids"], self.num_anchors, generator
            )
        else:
            anchors, valid = L.sample_anchors(loss_mask, self.num_anchors, generator)
        anchors, valid = anchors.to(dev), valid.to(dev)
        slot_mask = L.slot_supervision_mask(loss_mask, anchors, valid, g)

        b_idx, n_idx, k_idx = slot_mask.nonzero(as_tuple=True)  # row-major, as the draft's M
        pos = anchors[b_idx, n_idx] + k_idx  # the hidden state at p+k predicts x_{p+k+1}
        labels = input_ids[b_idx, pos + 1]
        summary = None
        if feats.final_logsumexp is not None and feats.final_argmax is not None:
            summary = (feats.final_logsumexp[b_idx, pos], feats.final_argmax[b_idx, pos])
        slot_loss = self._slot_loss(labels, feats.final_hidden[b_idx, pos], summary)
        tapped = feats.tapped
        if noise > 0:  # drawn after the anchors, from the same checkpointed generator
            tapped = noisy_features(tapped, len(self.config.target_layer_ids), noise, generator)
        out = draft(
            tapped,
            input_ids,
            anchors,
            valid,
            slot_mask=slot_mask,
            slot_loss=slot_loss,
            chunk_size=self.chunk_slots,
            **packed,
        )
        terms = out.slot_terms
        w = L.decay_weights(g, self.loss_decay_gamma, device=dev)[k_idx]

        ce, l1, match, in_vocab = terms["ce"], terms["l1"], terms["match"], terms["in_vocab"]
        c_star = L.confidence_target(l1)
        w_ce = w * in_vocab  # CE only over slots whose label the draft vocabulary holds
        num_ce, num_l1 = (w * ce).sum(), (w * l1).sum()
        num_bce = l1.new_zeros((), dtype=torch.float32)
        conf_err = l1.new_zeros((), dtype=torch.float32)
        use_conf = self.use_confidence and out.confidence_logits is not None
        if use_conf:
            conf = out.confidence_logits
            num_bce = (w * L.slot_confidence_bce(conf, c_star)).sum()
            conf_err = (torch.sigmoid(conf.detach().float()) - c_star).abs().sum()

        with torch.no_grad():
            c_grid = L.scatter_slots(c_star, slot_mask)
            tau = L.tau_per_block(c_grid, slot_mask)
            # T=0: a slot survives when the draft's argmax is the target's (teacher-forced, so
            # this is what greedy decoding accepts when every earlier slot was accepted).
            m_grid = L.scatter_slots(match, slot_mask)
            tau_greedy = L.tau_per_block(m_grid, slot_mask)
            block_ok = slot_mask[..., 0]
            full = slot_mask.all(-1)
            glob = reduce_named(
                reducer,
                {
                    "weight": w.sum(),
                    "ce_weight": w_ce.sum(),
                    "out_of_vocab": (~in_vocab).sum(),
                    "ce": num_ce,
                    "l1": num_l1,
                    "confidence_bce": num_bce,
                    "supervised_tokens": torch.tensor(float(b_idx.numel()), device=dev),
                    "confidence_abs_error": conf_err,
                    "blocks": block_ok.sum(),
                    "tau": tau[block_ok].sum(),
                    "tau_greedy": tau_greedy[block_ok].sum(),
                    "full_blocks": full.sum(),
                    "tau_full": tau[full].sum(),
                    "slots": slot_mask.sum((0, 1)),  # [gamma]
                    "c_star": c_grid.sum((0, 1)),  # [gamma]
                    "greedy_match": m_grid.sum((0, 1)),  # [gamma]
                },
            )

        def safe(den: torch.Tensor) -> torch.Tensor:
            return torch.where(den > 0, den, torch.ones_like(den))

        numerator = self.l1_weight * num_l1
        if use_conf:
            numerator = numerator + self.confidence_weight * num_bce
        # CE has its own denominator: the weight of the slots whose label the draft can predict
        # (all slots for a full vocabulary, where both denominators are equal).
        local = self.ce_weight * num_ce / safe(glob["ce_weight"]) + numerator / safe(glob["weight"])
        loss = reducer.world_size * local
        return loss, self._metrics({k: v.tolist() for k, v in glob.items()}, use_conf)

    def _slot_loss(
        self,
        labels: torch.Tensor,
        final_hidden: torch.Tensor,
        summary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SlotLoss:
        """The per-slot terms of a chunk of draft logits, for the draft's `forward(slot_loss=)`.

        `labels [M]` (target ids), `final_hidden [M, H]` (the target's post-norm states of the
        same slots, row-major). Per chunk `rows`: the target's fp32 logits `[m, V]` (no grad,
        recomputed with the chunk in backward), then CE, L1, the greedy match and whether the
        label is in the draft vocabulary, each `[m]` (losses.py defines each for a reduced one;
        `slot_ce_l1` computes CE and L1 as one autograd node).
        `summary`: `(logsumexp [M], argmax [M])` of the target's logits over all V at the same
        slots (`capture.target_summary`, precomputed with an offline cache); with a reduced
        vocabulary the target's logits are then computed at the K kept ids only (`[m, K]`
        instead of `[m, V]`: on a CPU most of a step at K = V / 12).
        """
        lm_head = self.target_lm_head

        def terms(logits: torch.Tensor, rows: slice, kept_ids: torch.Tensor | None):
            with torch.no_grad():
                draft_ids, in_vocab = L.in_vocab_labels(labels[rows], kept_ids)
                if kept_ids is not None and summary is not None:
                    t_kept = kept_target_logits(self._kept_head(kept_ids), final_hidden[rows])
                    q = L.target_probs_at_kept(t_kept, summary[0][rows])
                    target_top = summary[1][rows]
                else:
                    t_logits = target_logits(lm_head, final_hidden[rows])  # [m, V]
                    q = L.target_probs(t_logits, kept_ids)
                    target_top = t_logits.argmax(-1)
            # one autograd node for CE and L1 (losses.slot_cross_entropy and slot_l1, fused)
            ce, l1, draft_top = slot_ce_l1(logits, q, draft_ids, in_vocab)
            match = L.greedy_match_ids(draft_top, target_top, kept_ids)
            return {"ce": ce, "l1": l1, "match": match, "in_vocab": in_vocab}

        return terms

    def _kept_head(self, kept_ids: torch.Tensor) -> KeptHead:
        """The target head's fp32 rows at `kept_ids`, made once per draft vocabulary (the
        target is frozen)."""
        cached = self._kept_head_cache
        if (
            cached is None
            or cached[0].shape != kept_ids.shape
            or not torch.equal(cached[0], kept_ids.to(cached[0].device))
        ):
            ids = kept_ids.detach().clone()
            cached = self._kept_head_cache = (ids, kept_head(self.target_lm_head, ids))
        return cached[1]

    def _metrics(self, s: dict, use_conf: bool) -> dict[str, float]:
        W, M, nb, nfull = s["weight"], s["supervised_tokens"], s["blocks"], s["full_blocks"]
        ce = L.safe_div(s["ce"], s["ce_weight"]) if s["ce_weight"] else 0.0
        m = {
            "ce": ce,
            "l1": L.safe_div(s["l1"], W),
            "supervised_tokens": M,
            "blocks": nb,
            "tau_probabilistic": L.safe_div(s["tau"], nb) if nb else 0.0,
            "tau_probabilistic_full_blocks": L.safe_div(s["tau_full"], nfull) if nfull else 0.0,
            "tau_greedy": L.safe_div(s["tau_greedy"], nb) if nb else 0.0,
            # share of supervised slots whose label a reduced draft vocabulary lacks (left out
            # of CE only); 0 for the full vocabulary
            "out_of_vocab_labels": s["out_of_vocab"] / M if M else 0.0,
        }
        rest = self.l1_weight * s["l1"]
        if use_conf:
            m["confidence_bce"] = L.safe_div(s["confidence_bce"], W)
            m["confidence_error"] = L.safe_div(s["confidence_abs_error"], M)
            rest += self.confidence_weight * s["confidence_bce"]
        m["loss"] = self.ce_weight * ce + L.safe_div(rest, W)
        for k, (n, c, g) in enumerate(zip(s["slots"], s["c_star"], s["greedy_match"], strict=True)):
            m[f"accept_rate@{k + 1}"] = c / n if n else 0.0
            m[f"greedy_accept@{k + 1}"] = g / n if n else 0.0
        return m


@register_objective("dflash", settings=DSparkSettings)
class DFlashObjective(DSparkObjective):
    """Pure DFlash baseline: the same objective on a draft without Markov and confidence heads
    (`markov_rank=0`, `enable_confidence_head=False`): CE + L1 only."""

    def __init__(self, target, draft_config, **kwargs) -> None:
        if int(draft_config.markov_rank) != 0 or draft_config.enable_confidence_head:
            raise ValueError(
                "the dflash objective trains a pure parallel draft: build its config with "
                "markov_rank=0 and enable_confidence_head=False "
                "(dspark.objectives.DFLASH_CONFIG_OVERRIDES)"
            )
        super().__init__(target, draft_config, **kwargs)
