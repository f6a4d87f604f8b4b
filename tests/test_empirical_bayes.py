"""Warm starts (issue 30): ``fit_prior`` (empirical Bayes over instances) and ``power_prior`` on
histories simulated here, as numpy and pandas; the fitted prior passed to models of every kind."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.models import (
    AdaptiveForgetting,
    BayesianLinear,
    PerArmLinear,
    fit_prior,
    power_prior,
    redraw_prior,
)
from bayes_safe.policies import ThompsonSampling

F64 = torch.float64
MU = np.array([1.0, -0.5, 0.3, 0.8])
TAU = np.array([0.2, 0.5, 0.1, 0.3])


def _history(groups: int = 60, rows: int = 80, noise: float = 0.5, seed: int = 0):
    """Rows of ``groups`` instances whose weights are drawn around ``MU`` with scales ``TAU``."""
    rng = np.random.default_rng(seed)
    W = MU + TAU * rng.normal(size=(groups, 4))
    X = rng.normal(size=(groups * rows, 4))
    g = np.repeat(np.arange(groups), rows)
    y = (X * W[g]).sum(1) + noise * rng.normal(size=groups * rows)
    return X, y, g, W


def _evidence(X, y, g, mu, Sigma, sigma) -> float:
    """The log marginal likelihood, group by group, from the multivariate normal of each group's outcomes."""
    total = 0.0
    for k in np.unique(g):
        Xg, yg = torch.as_tensor(X[g == k]), torch.as_tensor(y[g == k])
        cov = Xg @ Sigma @ Xg.T + sigma ** 2 * torch.eye(len(yg), dtype=F64)
        total += float(dist.MultivariateNormal(Xg @ mu, covariance_matrix=cov).log_prob(yg))
    return total


def test_fit_prior_recovers_the_population_of_instances():
    X, y, g, W = _history()
    fit = fit_prior(X, y, g)
    assert fit.converged and fit.num_groups == 60 and fit.num_rows == 4800
    # the instances' own spread is what a prior of the next instance should have
    assert np.abs(fit.mean.numpy() - W.mean(0)).max() < 0.03
    assert np.allclose(fit.prior.stddev.numpy(), W.std(0), rtol=0.2)
    assert abs(fit.noise_std - 0.5) < 0.02
    assert isinstance(fit.prior, dist.Independent) and fit.prior.event_shape == (4,)
    assert "PriorFit(mean=[" in repr(fit) and "groups=60" in repr(fit)


@pytest.mark.parametrize("covariance", ["diagonal", "full", "isotropic"])
def test_the_fit_is_a_maximum_of_the_marginal_likelihood(covariance):
    X, y, g, _ = _history(groups=12, rows=15, seed=1)
    fit = fit_prior(X, y, g, covariance=covariance, noise_std=0.5)
    Sigma = fit.covariance
    best = _evidence(X, y, g, fit.mean, Sigma, 0.5)
    assert fit.log_evidence == pytest.approx(best, rel=1e-9)  # the evidence it reports is the evidence
    if covariance == "isotropic":
        assert torch.allclose(Sigma, Sigma[0, 0] * torch.eye(4, dtype=F64))
    if covariance != "full":
        assert torch.count_nonzero(Sigma - torch.diag(Sigma.diagonal())) == 0
    # any small move of the mean or of the scales (within the covariance family) is no better
    for step in (torch.tensor([0.05, 0, 0, 0], dtype=F64), torch.tensor([0, -0.05, 0.05, 0], dtype=F64)):
        assert _evidence(X, y, g, fit.mean + step, Sigma, 0.5) < best
    for factor in (0.8, 1.25):
        assert _evidence(X, y, g, fit.mean, Sigma * factor, 0.5) < best


def test_pandas_inputs_with_named_instances_and_the_prior_in_every_model():
    X, y, g, _ = _history(groups=20, rows=40, seed=2)
    frame = pd.DataFrame(X, columns=["tenure", "opens", "hour", "segment"])
    names = pd.Series([f"market-{k}" for k in g])
    fit = fit_prior(frame, pd.Series(y), names, covariance="full", shrinkage=0.2)
    assert isinstance(fit.prior, dist.MultivariateNormal) and fit.num_groups == 20
    x = torch.as_tensor(X[:30])
    for model in (BayesianLinear(fit.prior, noise_std=fit.noise_std),                 # conjugate
                  BayesianLinear(fit.prior, noise_prior=dist.InverseGamma(torch.tensor(3.0, dtype=F64),
                                                                          torch.tensor(0.5, dtype=F64))),  # NIG
                  BayesianLinear(fit.prior, likelihood="logistic"),                      # Gibbs
                  PerArmLinear(fit.prior, 3, noise_std=fit.noise_std)):                  # per arm
        if isinstance(model, PerArmLinear):  # one stream: one context, its reward and its arm at a time
            for i in range(30):
                model.update(x[i], torch.tensor(float(y[i] > 0), dtype=F64), actions=torch.tensor(i % 3))
        else:
            model.update(x, torch.as_tensor((y[:30] > 0).astype(float)))
        assert torch.isfinite(model.sample(torch.Generator().manual_seed(0))).all()


def test_min_scale_keeps_a_feature_the_history_never_varied_learnable():
    X, y, g, _ = _history(groups=20, rows=40, seed=3)
    X[:, 3] = 0.0  # never varied: its weight is not identified, the fit would shrink its scale toward 0
    fit = fit_prior(X, y, g, min_scale=0.25)
    assert float(fit.prior.stddev[3]) >= 0.25 - 1e-12


def test_power_prior_of_weight_one_is_the_posterior_of_the_history():
    X, y, _, _ = _history(groups=1, rows=50, seed=4)
    prior = dist.Normal(torch.zeros(4, dtype=F64), 2.0 * torch.ones(4, dtype=F64)).to_event(1)
    model = BayesianLinear(prior, noise_std=0.5)
    model.update(torch.as_tensor(X), torch.as_tensor(y))
    full = power_prior(prior, X, y, noise_std=0.5, weight=1.0)
    torch.testing.assert_close(full.mean, model.posterior_mean, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(full.covariance_matrix, model.posterior_covariance, rtol=1e-9, atol=1e-12)
    half = power_prior(prior, X, y, noise_std=0.5, weight=0.5)
    # half the weight: the history's precision halved (twice the data's part of the variance)
    prec = torch.linalg.inv(half.covariance_matrix)
    torch.testing.assert_close(prec, torch.eye(4, dtype=F64) / 4 + 0.5 * torch.as_tensor(X.T @ X) / 0.25)


@pytest.mark.parametrize("call, message", [
    (lambda X, y, g: fit_prior(X, y, None), "groups: expected one label per row"),
    (lambda X, y, g: fit_prior(X, y, np.zeros(len(y))), "groups: the history holds one instance"),
    (lambda X, y, g: fit_prior(X, y, g[:-1]), "groups: expected one label per row"),
    (lambda X, y, g: fit_prior(X, y[:-1], g), "y: expected one outcome per row"),
    (lambda X, y, g: fit_prior(X[:, :, None], y, g), "X: expected logged features"),
    (lambda X, y, g: fit_prior(X, y, g, covariance="spherical"), "covariance: expected"),
    (lambda X, y, g: fit_prior(X, y, g, shrinkage=1.5), "shrinkage: expected"),
    (lambda X, y, g: fit_prior(X, y, g, noise_std=0), "noise_std: expected"),
    (lambda X, y, g: fit_prior(X, np.where(np.arange(len(y)) == 3, math.nan, y), g), "y: expected finite"),
    (lambda X, y, g: power_prior(dist.Normal(0.0, 1.0), X, y, noise_std=1.0), "prior: expected a Gaussian over R\\^4"),
    (lambda X, y, g: power_prior(dist.Normal(torch.zeros(4), 1.0).to_event(1), X, y, noise_std=1.0, weight=0),
     "weight: expected"),
])
def test_bad_input_is_named(call, message):
    X, y, g, _ = _history(groups=3, rows=5, seed=5)
    with pytest.raises(ValueError, match=message):
        call(X, y, g)


# ----------------------------------------------------------------------------- redraw_prior (issue 43)
def _population_log(rng, d: int, tau: float, rows: int, noise: float):
    """A log of one world whose weights are a draw of ``N(0, tau^2)`` (an intercept of 0.2 first)."""
    w = np.concatenate([[0.2], tau * rng.normal(size=d - 1)])
    X = np.concatenate([np.ones((rows, 1)), rng.normal(size=(rows, d - 1))], 1)
    return w, X, X @ w + noise * rng.normal(size=rows)


@pytest.mark.parametrize("d, tau, rows", [(5, 0.3, 2000), (81, 0.02, 20000)])
def test_a_redrawn_world_falls_inside_the_redraw_prior_as_often_as_it_says(d, tau, rows):
    # the claim a restart relies on: after a change redraws the weights from their population, the new
    # weights lie in the prior's central 90 % interval 90 % of the time, also for 80 small weights
    weak = dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1)
    inside, total = 0, 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        w, X, y = _population_log(rng, d, tau, rows, noise=0.35)
        prior = redraw_prior(power_prior(weak, X, y, noise_std=0.35, weight=1.0))
        assert torch.allclose(prior.mean[0], torch.tensor(w[0], dtype=F64), atol=0.05)  # the intercept is kept
        new = tau * rng.normal(size=d - 1)  # the change: a fresh draw of every other weight
        z = (torch.as_tensor(new) - prior.mean[1:]) / prior.stddev[1:]
        inside += int((z.abs() < 1.6449).sum())
        total += d - 1
    share = inside / total
    assert abs(share - 0.90) < 3 * math.sqrt(0.09 / total) + 0.02, share


def test_restarting_to_the_redraw_prior_relearns_a_changed_world_faster_than_the_weak_prior():
    # a click-like world written here: 20 articles, d = 10, warm from 5,000 logged rows; at the change every
    # preference is redrawn from the same population, and the model restarts exactly then. Over six seeds
    # the redraw prior's regret was 0.72 to 0.93 of the weak prior's (0.77 on this one).
    R, K, d, T = 48, 20, 10, 400
    rng = np.random.default_rng(5)
    Xa = np.concatenate([np.ones((R, K, 1)), rng.normal(size=(R, K, d - 1))], -1)
    w_old = np.concatenate([np.full((R, 1), 0.25), 0.04 * rng.normal(size=(R, d - 1))], -1)
    w_new = np.concatenate([np.full((R, 1), 0.25), 0.04 * rng.normal(size=(R, d - 1))], -1)
    arms = rng.integers(0, K, size=(R, 5000))
    X_log = np.take_along_axis(Xa, arms[..., None], 1)  # [R, 5000, d]
    p_log = np.clip((X_log * w_old[:, None]).sum(-1), 0.01, 0.99)
    y_log = (rng.random(p_log.shape) < p_log).astype(float)
    weak = dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1)
    warm = BayesianLinear(weak, noise_std=0.35, batch_shape=[R])
    warm.update(torch.as_tensor(X_log), torch.as_tensor(y_log))
    redraw = redraw_prior(warm)
    assert redraw.batch_shape == (R,) and redraw.event_shape == (d,)
    p_new = np.clip((Xa * w_new[:, None]).sum(-1), 0.01, 0.99)  # [R, K]
    u = rng.random((T, R))
    regret = {}
    for name, prior in (("weak", weak), ("redraw", redraw)):
        policy = ThompsonSampling(BayesianLinear(prior, noise_std=0.35, batch_shape=[R]))
        g = torch.Generator().manual_seed(0)
        total = np.zeros(R)
        for t in range(T):
            a = policy.select(torch.as_tensor(Xa), None, generator=g).numpy()
            p = p_new[np.arange(R), a]
            total += p_new.max(-1) - p
            policy.update(torch.as_tensor(Xa[np.arange(R), a]), torch.as_tensor((u[t] < p).astype(float)))
        regret[name] = total.mean()
    assert regret["redraw"] < 0.9 * regret["weak"], regret


def test_the_redraw_prior_is_the_base_a_detected_change_restarts_to():
    d, R = 4, 3
    weak = dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1)
    rng = np.random.default_rng(1)
    X = torch.as_tensor(rng.normal(size=(R, 500, d)))
    warm = BayesianLinear(weak, noise_std=0.3, batch_shape=[R])
    warm.update(X, X @ torch.tensor([0.5, 0.1, -0.2, 0.05], dtype=F64) + 0.3 * torch.randn(R, 500, dtype=F64))
    base = redraw_prior(warm, stable=(0, 2))
    assert torch.allclose(base.mean[:, [0, 2]], warm.posterior_mean[:, [0, 2]])
    assert torch.all(base.mean[:, [1, 3]] == 0)
    model = BayesianLinear(weak, noise_std=0.3, batch_shape=[R], forgetting=AdaptiveForgetting(), base_prior=base)
    model.update(X, X @ torch.tensor([0.5, 0.1, -0.2, 0.05], dtype=F64))
    shifted = X[:, :200] @ torch.tensor([-2.0, 1.0, 1.0, -1.0], dtype=F64)  # a change the test cannot miss
    model.update(X[:, :200], shifted)
    assert bool((model.change_points >= 1).all())
    # unbatched, from a distribution
    one = redraw_prior(power_prior(weak, X[0], X[0] @ torch.tensor([0.5, 0.1, -0.2, 0.05], dtype=F64), noise_std=0.3))
    assert one.batch_shape == () and one.event_shape == (d,)


@pytest.mark.parametrize("kwargs, message", [
    ({"stable": (4,)}, "stable: expected column indices in \\[0, 4\\)"),
    ({"stable": 0}, "stable: expected a sequence"),
    ({"stable": (0, 1, 2, 3)}, "stable: names every one of the 4 columns"),
    ({"min_scale": 0.0}, "min_scale: expected a positive number"),
])
def test_redraw_prior_names_bad_arguments(kwargs, message):
    warm = dist.Normal(torch.zeros(4, dtype=F64), 1.0).to_event(1)
    with pytest.raises(ValueError, match=message):
        redraw_prior(warm, **kwargs)
    with pytest.raises(ValueError, match="posterior: expected a Gaussian"):
        redraw_prior(dist.Laplace(torch.zeros(4), 1.0).to_event(1))
