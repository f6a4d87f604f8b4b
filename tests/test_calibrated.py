"""``calibrated_per_arm`` (issue 32): per-arm models for a 0/1 reward with the prior scale and the
noise fitted on a warm slice, on warm slices written here (numpy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayes_safe.models import PerArmLinear, calibrated_per_arm

F64 = torch.float64


def _warm(n: int = 120, d: int = 6, K: int = 4, seed: int = 0):
    """Standardised contexts with a constant, labels from a noisy linear rule (argmax of x W + noise)."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d))
    W = rng.normal(size=(d, K))
    y = np.argmax(Z @ W + rng.normal(scale=1.0, size=(n, K)), axis=1)
    return np.hstack([Z, np.ones((n, 1))]), y


def test_labels_give_a_sensible_noise_prior_scale_and_intercept():
    X, y = _warm()
    cal = calibrated_per_arm(X, labels=y, num_arms=4, temperature=1.0)
    # a 0/1 reward's sd is at most 0.5; a linear probability model of 4 classes leaves a good part of it
    assert 0.2 < cal.noise_std <= 0.5
    # weights of standardised features on a 0/1 scale: far below the generic N(0, 1)
    assert 0.01 < cal.prior_scale < 0.5
    # the arms' rewards sum to 1: the shared prior mean is 1/K on the constant, about 0 elsewhere
    assert cal.prior_mean[-1].item() == pytest.approx(0.25, abs=1e-6)
    assert float(cal.prior_mean[:-1].abs().max()) < 1e-6
    assert isinstance(cal.model, PerArmLinear) and cal.model.num_arms == 4 and cal.model.dim == 7
    assert "prior_scale" in repr(cal)


def test_pure_noise_labels_fit_a_noise_near_the_bernoulli_sd_and_a_small_scale():
    rng = np.random.default_rng(1)
    X = np.hstack([rng.normal(size=(400, 5)), np.ones((400, 1))])
    y = rng.integers(0, 2, size=400)  # labels unrelated to the contexts
    cal = calibrated_per_arm(X, labels=y, num_arms=2, temperature=1.0)
    assert cal.noise_std == pytest.approx(0.5, abs=0.03)
    assert cal.prior_scale < 0.05  # nothing for the features to explain


def test_the_temperature_scales_the_covariance_and_keeps_the_mean():
    X, y = _warm(seed=2)
    cold = calibrated_per_arm(X, labels=y, num_arms=4, temperature=1.0).model
    warm = calibrated_per_arm(X, labels=y, num_arms=4, temperature=0.25).model
    rng = np.random.default_rng(3)
    for _ in range(20):
        x, a, r = torch.as_tensor(rng.normal(size=7)), int(rng.integers(4)), float(rng.integers(2))
        cold.update(x, r, actions=a)
        warm.update(x, r, actions=a)
    torch.testing.assert_close(warm.posterior_mean, cold.posterior_mean)
    torch.testing.assert_close(warm.posterior_covariance, 0.25 * cold.posterior_covariance)


def test_a_bandit_log_and_bad_inputs():
    X, y = _warm(seed=4)
    rng = np.random.default_rng(5)
    actions = rng.integers(0, 4, size=len(y))
    cal = calibrated_per_arm(X, num_arms=4, actions=actions, rewards=(actions == y).astype(float))
    assert 0 < cal.noise_std <= 0.5 and cal.temperature == 0.25
    with pytest.raises(ValueError, match="either labels"):
        calibrated_per_arm(X, num_arms=4)
    with pytest.raises(ValueError, match="labels: expected"):
        calibrated_per_arm(X, num_arms=4, labels=y[:-1])
    with pytest.raises(ValueError, match=r"indices in \[0, 3\)"):
        calibrated_per_arm(X, num_arms=3, labels=y)
    with pytest.raises(ValueError, match="temperature"):
        calibrated_per_arm(X, num_arms=4, labels=y, temperature=0.0)
    with pytest.raises(ValueError, match="at least two arms"):
        calibrated_per_arm(X, num_arms=4, actions=np.zeros(len(y), dtype=int), rewards=np.ones(len(y)))


def test_the_streaming_fast_path_keeps_the_per_arm_posterior():
    from bayes_safe.policies import StreamingPerArmTS

    X, y = _warm(seed=6)
    cal = calibrated_per_arm(X, labels=y, num_arms=4, temperature=1.0)
    fast = StreamingPerArmTS.from_calibrated(cal, seed=0)
    model = cal.model
    rng = np.random.default_rng(7)
    picks = np.zeros(4, dtype=int)
    for _ in range(150):
        x = rng.normal(size=7)
        a = fast.select(x)
        picks[a] += 1
        r = float(rng.random() < 0.2 + 0.6 * (a == 1))
        fast.update(x, r, a)
        model.update(torch.as_tensor(x), r, actions=a)
    np.testing.assert_allclose(fast.mean, model.posterior_mean.numpy(), atol=1e-10)
    np.testing.assert_allclose(fast.covariance, model.posterior_covariance.numpy(), atol=1e-10)
    assert picks[1] == picks.max()  # it finds the better arm
    handed = fast.to_model()
    np.testing.assert_allclose(handed.posterior_mean.numpy(), fast.mean, atol=1e-10)
    before = fast.mean.copy()
    fast.refresh()
    np.testing.assert_allclose(fast.mean, before, atol=1e-10)
    with pytest.raises(ValueError, match="prior_scale"):
        StreamingPerArmTS(np.zeros(3), 0.0, 2, 0.5)
