"""Warm starts (issue 30): ``fit_prior`` (empirical Bayes over instances) and ``power_prior`` on
histories simulated here, as numpy and pandas; the fitted prior passed to models of every kind."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.models import BayesianLinear, PerArmLinear, fit_prior, power_prior

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
