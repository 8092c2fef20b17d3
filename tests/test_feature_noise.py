"""Noise on the target's tapped features (`objective.feature_noise`): its size per layer, where
it enters a training step, and that held-out metrics never see it."""

import pytest
import torch
from helpers import make_draft
from test_feature_cache import cached_batches

from dspark import losses as L
from dspark.objectives import DSparkObjective
from dspark.objectives.feature_noise import noisy_features
from dspark.target.capture import BatchFeatures


def test_noise_std_is_the_scale_times_each_layers_rms():
    g = torch.Generator().manual_seed(0)
    B, S, H = 3, 50, 64
    layers = [torch.randn(B, S, H, generator=g) * s for s in (0.5, 30.0)]  # unequal scales
    tapped = torch.cat(layers, -1)
    out = noisy_features(tapped, 2, 0.2, torch.Generator().manual_seed(1))
    assert out.shape == tapped.shape and out.dtype == tapped.dtype
    for i, x in enumerate(layers):
        rms = x.pow(2).mean(-1, keepdim=True).sqrt()  # by hand, per position
        z = (out[..., i * H : (i + 1) * H] - x) / rms  # standard normal times 0.2
        assert abs(z.std().item() - 0.2) < 0.01  # 9,600 draws: the std's sd is ~0.0015
        assert abs(z.mean().item()) < 0.01
    again = noisy_features(tapped, 2, 0.2, torch.Generator().manual_seed(1))
    assert torch.equal(again, out)  # the generator alone decides the noise
    assert torch.equal(noisy_features(tapped, 2, 0.0, g), tapped)
    with pytest.raises(ValueError, match="not 3 layers"):
        noisy_features(tapped, 3, 0.1, g)


def test_a_noisy_step_is_the_clean_step_on_features_noised_by_hand(tiny_sets):
    target, tok, data, caches = tiny_sets("llama")
    draft = make_draft(target, tok, block_size=4, num_anchors=6)
    batch = cached_batches(data, caches["fp32"], tok.pad_token_id)[0]
    n_layers = len(draft.config.target_layer_ids)
    noisy = DSparkObjective(
        target, draft.config, feature_source=BatchFeatures(), seed=5, feature_noise=0.3
    )
    clean = DSparkObjective(target, draft.config, feature_source=BatchFeatures(), seed=5)
    loss, _ = noisy.step(draft, batch)

    # by hand: the step draws its anchors first, then the noise, from the one generator
    g = torch.Generator().manual_seed(5)
    mask = batch["loss_mask"].bool() & batch["attention_mask"].bool()
    mask[:, 0] = False  # a row's first token starts its document
    L.sample_anchors(mask, 6, g)
    x = batch["tapped"].float()
    B, S, LH = x.shape
    per_layer = x.view(B, S, n_layers, LH // n_layers)
    rms = per_layer.pow(2).mean(-1, keepdim=True).sqrt()
    eps = torch.randn(per_layer.shape, generator=g)
    by_hand = dict(batch, tapped=(per_layer + 0.3 * rms * eps).view(B, S, LH))
    want, _ = clean.step(draft, by_hand)  # the same anchors: its generator has the same seed
    torch.testing.assert_close(loss, want)
    plain, _ = DSparkObjective(target, draft.config, feature_source=BatchFeatures(), seed=5).step(
        draft, batch
    )
    assert not torch.allclose(loss, plain)  # the noise changed the loss
    # held-out metrics read the features as they are
    assert noisy.evaluate(draft, batch) == clean.evaluate(draft, batch)


def test_negative_noise_is_refused(tiny_sets):
    target, tok, _, _ = tiny_sets("llama")
    draft = make_draft(target, tok, block_size=4)
    with pytest.raises(ValueError, match="feature_noise must be >= 0"):
        DSparkObjective(target, draft.config, feature_noise=-0.1)
