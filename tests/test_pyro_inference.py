"""Tests of PyroLinearPosterior (bayes_safe/models/pyro_inference.py).

Every fit here is small (a few hundred NUTS iterations or SVI steps on d <= 5), so the file
runs in well under a minute; tolerances are set from the posterior's own spread.
"""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.models.pyro_inference import PyroLinearPosterior

F64 = torch.float64


def simulate(w, n, noise, seed):
    """X ~ N(0, I) rows, y = X w + noise * N(0, 1); float64."""
    g = torch.Generator().manual_seed(seed)
    w = torch.as_tensor(w, dtype=F64)
    X = torch.randn(n, w.numel(), generator=g, dtype=F64)
    y = X @ w + noise * torch.randn(n, generator=g, dtype=F64)
    return X, y


def gaussian_posterior(X, y, noise):
    """Closed form under w ~ N(0, I), known noise: (mean, covariance)."""
    d = X.shape[-1]
    cov = torch.linalg.inv(torch.eye(d, dtype=F64) + X.T @ X / noise**2)
    return cov @ X.T @ y / noise**2, cov


def std_normal_prior(d):
    return dist.MultivariateNormal(torch.zeros(d), torch.eye(d))  # float32 on purpose


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These fits are tiny: intra-op threads only add overhead, and on a loaded 2-core machine
    they made some SVI fits ten times slower. Restored after this module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gaussian_problem():
    noise = 0.5
    X, y = simulate([1.0, -0.5, 0.25], 40, noise, seed=3)
    mean, cov = gaussian_posterior(X, y, noise)
    return X, y, noise, mean, cov


def test_laplace_nuts_recovers_weights():
    w_true = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    X, y = simulate(w_true, 100, 0.1, seed=0)
    prior = dist.Laplace(0.0, 1.0).expand([3]).to_event(1)  # float32 parameters
    post = PyroLinearPosterior(prior, 3, noise_std=0.1, num_samples=150, warmup_steps=150)
    post.fit(X, y)

    draws = post.draws
    assert draws.shape == (150, 3) and draws.dtype == F64
    assert (draws.mean(0) - w_true).abs().max() < 0.05
    assert (draws.std(0) < 0.03).all()  # the truth is about 0.01
    assert post.fit_seconds > 0 and post.fitted
    assert post.noise_draws is None

    assert set(post.chains) == {"w"}
    assert post.chains["w"].shape == (1, 150, 3)
    torch.testing.assert_close(post.chains["w"].reshape(-1, 3), draws)
    stats = post.sample_stats
    assert {"diverging", "step_size", "acceptance_rate"} <= set(stats)
    assert stats["diverging"].shape == (1, 150) and stats["diverging"].dtype == torch.bool
    assert stats["diverging"].sum() < 8
    assert (stats["step_size"] > 0).all()
    assert ((stats["acceptance_rate"] >= 0) & (stats["acceptance_rate"] <= 1)).all()
    assert stats["acceptance_rate"].mean() > 0.5


def test_gaussian_prior_nuts_matches_closed_form(gaussian_problem):
    X, y, noise, mean, cov = gaussian_problem
    post = PyroLinearPosterior(
        std_normal_prior(3), 3, noise_std=noise, num_samples=300, warmup_steps=150, num_chains=2
    )
    post.fit(X, y)
    draws = post.draws
    assert draws.shape == (600, 3)
    assert post.chains["w"].shape == (2, 300, 3)
    assert post.sample_stats["diverging"].shape == (2, 300)

    sd = cov.diagonal().sqrt()
    # Monte-Carlo standard error of the mean is about sd / sqrt(600) = 0.04 sd.
    assert ((draws.mean(0) - mean).abs() / sd).max() < 0.2
    sample_cov = torch.cov(draws.T)
    scale = torch.outer(sd, sd)
    # Relative standard error of a variance from ~600 draws is about sqrt(2 / 600) = 0.06.
    assert ((sample_cov - cov).abs() / scale).max() < 0.25


def test_svi_gaussian_matches_closed_form_mean(gaussian_problem):
    X, y, noise, mean, cov = gaussian_problem
    post = PyroLinearPosterior(
        std_normal_prior(3), 3, noise_std=noise, method="svi", svi_steps=1000, num_samples=500
    )
    post.fit(X, y)
    assert post.draws.shape == (500, 3)
    assert post.chains == {} and post.sample_stats == {}
    assert post.svi_losses.shape == (1000,)
    assert post.svi_losses[-100:].mean() < post.svi_losses[:100].mean()
    sd = cov.diagonal().sqrt()
    # SVI's answer jitters with the last optimiser steps: across seeds the mean was within
    # 0.1-0.45 posterior sd of the truth.
    assert ((post.draws.mean(0) - mean).abs() / sd).max() < 0.75
    ratio = post.draws.std(0) / sd
    assert ((ratio > 0.7) & (ratio < 1.4)).all()


def test_horseshoe_callable_prior_shrinks_irrelevant_weights():
    d = 5

    def horseshoe():
        tau = pyro.sample("tau", dist.HalfCauchy(1.0))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d)).to_event(1))
        return pyro.sample("w", dist.Normal(0.0, tau * lam).to_event(1))

    # The horseshoe's funnel makes NUTS take long trajectories (about 50 ms per iteration
    # here), so this run is short; it only has to show the shrinkage.
    X, y = simulate([2.0, 0.0, 0.0, 0.0, 0.0], 15, 1.0, seed=7)
    post = PyroLinearPosterior(horseshoe, d, noise_std=1.0, num_samples=40, warmup_steps=40)
    post.fit(X, y)

    assert set(post.chains) == {"tau", "lam", "w"}
    assert post.chains["tau"].shape == (1, 40)
    assert post.chains["lam"].shape == (1, 40, d)
    assert post.draws.shape == (40, d) and post.draws.dtype == F64
    ols = torch.linalg.lstsq(X, y).solution
    pm = post.draws.mean(0)
    assert pm[1:].abs().mean() < ols[1:].abs().mean()
    assert pm[0] > 1.0  # the relevant weight is kept


def test_callable_prior_returning_transformed_weights():
    """The weights are what the prior returns, not necessarily one of its sites."""

    def non_centred():
        scale = pyro.sample("scale", dist.HalfNormal(1.0))
        z = pyro.sample("z", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        return scale * z

    X, y = simulate([0.5, -0.5], 30, 0.3, seed=6)
    post = PyroLinearPosterior(non_centred, 2, noise_std=0.3, num_samples=60, warmup_steps=60)
    post.fit(X, y)
    c = post.chains
    torch.testing.assert_close(c["w"], c["scale"][..., None] * c["z"])
    assert (post.draws.mean(0) - torch.tensor([0.5, -0.5], dtype=F64)).abs().max() < 0.2


@pytest.mark.parametrize("method", ["nuts", "svi"])
def test_inverse_gamma_noise_prior(method):
    noise = 0.5
    X, y = simulate([1.0, -1.0], 200, noise, seed=7)
    post = PyroLinearPosterior(
        dist.Normal(0.0, 1.0).expand([2]).to_event(1),
        2,
        noise_prior=dist.InverseGamma(2.0, 0.5),
        method=method,
        num_samples=200,
        warmup_steps=100,
        svi_steps=600,
        svi_lr=0.05,
    )
    before = post.noise_draws  # prior draws before any fit
    assert before.shape == (200,) and (before > 0).all()
    post.fit(X, y)
    nd = post.noise_draws
    assert nd.shape == (200,) and nd.dtype == F64 and (nd > 0).all()
    # sigma^2 = 0.25; its posterior sd is about 0.25 * sqrt(2 / 200) = 0.025.
    assert abs(nd.mean().item() - noise**2) < 0.06
    assert (post.draws.mean(0) - torch.tensor([1.0, -1.0], dtype=F64)).abs().max() < 0.1
    if method == "nuts":
        assert post.chains["noise_var"].shape == (1, 200)


def test_batch_of_problems_fitted_separately():
    noise = 0.5
    w_true = [[1.0, 0.0, -1.0], [-2.0, 0.5, 0.0]]
    data = [simulate(w, 40, noise, seed=10 + i) for i, w in enumerate(w_true)]
    X = torch.stack([x for x, _ in data])
    y = torch.stack([t for _, t in data])
    post = PyroLinearPosterior(
        std_normal_prior(3), 3, noise_std=noise, batch_shape=(2,), num_samples=200, warmup_steps=100
    )
    assert post.draws.shape == (200, 2, 3)  # prior draws before the fit
    post.fit(X, y)
    assert post.draws.shape == (200, 2, 3)
    assert post.chains["w"].shape == (1, 200, 2, 3)
    assert post.sample_stats["step_size"].shape == (1, 200, 2)
    means = post.draws.mean(0)
    for r in range(2):
        mean, cov = gaussian_posterior(X[r], y[r], noise)
        assert ((means[r] - mean).abs() / cov.diagonal().sqrt()).max() < 0.35
    assert (means[0] - means[1]).abs().max() > 1.0

    post2 = PyroLinearPosterior(
        std_normal_prior(3), 3, noise_std=noise, batch_shape=(2, 1), method="svi",
        svi_steps=300, num_samples=50,
    )
    post2.fit(X[:, None], y[:, None])
    assert post2.draws.shape == (50, 2, 1, 3)
    assert post2.svi_losses.shape == (2, 1, 300)


@pytest.mark.parametrize("method", ["nuts", "svi"])
def test_reproducible_and_no_global_state_leak(method):
    X, y = simulate([0.3, -0.7], 30, 0.2, seed=1)
    prior = dist.Laplace(0.0, 1.0).expand([2]).to_event(1)
    kwargs = {
        "noise_std": 0.2, "method": method, "num_samples": 40, "warmup_steps": 40, "svi_steps": 60
    }

    pyro.get_param_store().clear()
    pyro.param("user_param", torch.tensor(1.5))
    torch_state, np_state = torch.random.get_rng_state(), np.random.get_state()

    a = PyroLinearPosterior(prior, 2, seed=4, **kwargs)
    a.fit(X, y)
    b = PyroLinearPosterior(prior, 2, seed=4, **kwargs)
    b.fit(X, y)
    c = PyroLinearPosterior(prior, 2, seed=5, **kwargs)
    c.fit(X, y)
    assert torch.equal(a.draws, b.draws)
    assert not torch.equal(a.draws, c.draws)
    for k in a.sample_stats:
        assert torch.equal(a.sample_stats[k], b.sample_stats[k])
    a.fit(X, y)  # refitting the same object gives the same draws again
    assert torch.equal(a.draws, b.draws)

    assert torch.equal(torch.random.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert set(pyro.get_param_store().keys()) == {"user_param"}
    pyro.get_param_store().clear()


def test_prior_draws():
    prior = dist.StudentT(3.0, 0.0, 1.0).expand([4]).to_event(1)
    post = PyroLinearPosterior(prior, 4, noise_std=1.0, batch_shape=(3,), num_samples=50)
    p = post.prior_draws(1000)
    assert p.shape == (1000, 3, 4) and p.dtype == F64
    assert torch.equal(p, post.prior_draws(1000))
    assert post.draws.shape == (50, 3, 4)  # before fit: prior draws

    def hierarchical():
        s = pyro.sample("s", dist.HalfNormal(2.0))
        return pyro.sample("w", dist.Normal(torch.zeros(2), s).to_event(1))

    post = PyroLinearPosterior(hierarchical, 2, noise_std=1.0)
    draws = post.prior_draws(2000)
    assert draws.shape == (2000, 2)
    # Var(w_i) = E[s^2] = 4 under HalfNormal(2).
    assert abs(draws.var().item() - 4.0) < 0.8


def test_chains_load_into_arviz():
    import arviz as az
    X, y = simulate([1.0, 0.0], 30, 0.5, seed=2)
    post = PyroLinearPosterior(
        dist.Normal(0.0, 1.0).expand([2]).to_event(1), 2,
        noise_prior=dist.InverseGamma(3.0, 0.5), num_samples=50, warmup_steps=50, num_chains=2,
    )
    post.fit(X, y)
    idata = az.from_dict(
        posterior={k: v.numpy() for k, v in post.chains.items()},
        sample_stats={k: v.numpy() for k, v in post.sample_stats.items()},
    )
    assert idata.posterior["w"].shape == (2, 50, 2)
    assert idata.posterior["noise_var"].shape == (2, 50)
    assert int(idata.sample_stats["diverging"].sum()) == int(post.sample_stats["diverging"].sum())


# ---------------------------------------------------------------------- bad input
def _wrong_shape_callable():
    return pyro.sample("w", dist.Normal(torch.zeros(4), 1.0).to_event(1))


def _not_a_tensor_callable():
    pyro.sample("a", dist.Normal(0.0, 1.0))
    return [0.0, 0.0, 0.0]


def _reserved_name_callable():
    pyro.sample("noise_var", dist.HalfNormal(1.0))
    return pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))


GOOD_PRIOR = dist.Normal(0.0, 1.0).expand([3]).to_event(1)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"prior": dist.Normal(0.0, 1.0).expand([4]).to_event(1)}, ValueError, r"prior.*\[3\]"),
        ({"prior": dist.Normal(torch.zeros(3), 1.0)}, ValueError, r"prior.*\[3\]"),
        ({"prior": dist.Normal(0.0, 1.0).expand([2, 3]).to_event(1)}, ValueError, "batch_shape"),
        ({"prior": _wrong_shape_callable}, ValueError, r"prior.*\[3\].*\[4\]"),
        ({"prior": _not_a_tensor_callable}, ValueError, "prior.*tensor"),
        ({"prior": _reserved_name_callable}, ValueError, "prior.*noise_var"),
        ({"prior": lambda x: x}, ValueError, "prior.*failed"),
        ({"prior": 3.0}, TypeError, "prior"),
        ({"prior": "laplace"}, TypeError, "prior"),
        ({"noise_std": None}, ValueError, "noise_std.*noise_prior"),
        ({"noise_prior": dist.InverseGamma(2.0, 1.0)}, ValueError, "noise_std.*noise_prior"),
        ({"noise_std": -0.1}, ValueError, "noise_std"),
        ({"noise_std": 0.0}, ValueError, "noise_std"),
        ({"noise_std": float("nan")}, ValueError, "noise_std"),
        ({"noise_std": None, "noise_prior": dist.Normal(0.0, 1.0)}, ValueError, "noise_prior"),
        ({"noise_std": None, "noise_prior": 0.5}, TypeError, "noise_prior"),
        ({"method": "mh"}, ValueError, "method"),
        ({"num_samples": 0}, ValueError, "num_samples"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_bad_construction(kwargs, error, match):
    args = {"prior": GOOD_PRIOR, "noise_std": 1.0}
    args.update(kwargs)
    prior = args.pop("prior")
    with pytest.raises(error, match=match):
        PyroLinearPosterior(prior, 3, **args)


def test_bad_fit_shapes():
    post = PyroLinearPosterior(GOOD_PRIOR, 3, noise_std=1.0, batch_shape=(2,))
    X, y = torch.zeros(2, 5, 3), torch.zeros(2, 5)
    with pytest.raises(ValueError, match="X"):
        post.fit(X[0], y[0])  # missing batch dimension
    with pytest.raises(ValueError, match="X"):
        post.fit(torch.zeros(2, 5, 4), y)
    with pytest.raises(ValueError, match="y"):
        post.fit(X, torch.zeros(2, 6))
    with pytest.raises(ValueError, match="finite"):
        post.fit(X, torch.full((2, 5), float("nan")))
