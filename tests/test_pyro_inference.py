"""Tests of PyroLinearPosterior (bayes_safe/models/pyro_inference.py).

Every fit here is small (a few hundred NUTS iterations or SVI steps on d <= 5), so the file
runs in well under a minute; tolerances are set from the posterior's own spread.
"""

from __future__ import annotations

import sys

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
    # the convergence check stops the run before its budget: W = 50-step windows, then
    # A = 250 averaging steps
    steps = post.svi_losses.shape[0]
    assert post.svi_converged.shape == () and bool(post.svi_converged)
    assert 350 <= steps < 1000 and torch.isfinite(post.svi_losses).all()
    assert post.svi_losses[-100:].mean() < post.svi_losses[:100].mean()
    sd = cov.diagonal().sqrt()
    # The posterior is Gaussian, so the guide can be exact: only Monte-Carlo error of the
    # 500 draws (about 0.045 sd for a mean, 3 % for an sd) and of the averaged fit remain.
    assert ((post.draws.mean(0) - mean).abs() / sd).max() < 0.2
    ratio = post.draws.std(0) / sd
    assert ((ratio > 0.88) & (ratio < 1.12)).all()


@pytest.mark.long  # a long chain (the long job; 2026-11-29)
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
    assert post2.svi_losses.shape[:2] == (2, 1) and post2.svi_losses.shape[2] <= 300
    assert post2.svi_converged.shape == (2, 1)
    # a problem that stopped before the longest one is padded with NaN after its last step
    steps = (~post2.svi_losses.isnan()).sum(-1)
    assert steps.max() == post2.svi_losses.shape[2]
    assert set(post2.svi_draws) == {"w"} and post2.svi_draws["w"].shape == (50, 2, 1, 3)


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
        ({"progress": "yes"}, ValueError, "progress must be 'auto', True or False"),
        ({"progress": 1}, ValueError, "progress must be 'auto', True or False"),
        ({"parallel_chains": "sometimes"}, ValueError, "parallel_chains must be 'auto', True"),
        ({"parallel_chains": None}, ValueError, "parallel_chains must be 'auto', True"),
        ({"svi_particles": 0}, ValueError, "svi_particles must be an int >= 1"),
        ({"svi_particles": 2.5}, ValueError, "svi_particles must be an int >= 1"),
        ({"svi_tol": 0.0}, ValueError, r"svi_tol must be a number in \(0, 1\)"),
        ({"svi_tol": 1.5}, ValueError, r"svi_tol must be a number in \(0, 1\)"),
        ({"svi_tol": float("nan")}, ValueError, r"svi_tol must be a number in \(0, 1\)"),
        ({"svi_tol": "1e-3"}, ValueError, r"svi_tol must be a number in \(0, 1\)"),
        ({"svi_lr": -0.1}, ValueError, "svi_lr must be a positive finite number"),
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


# ---------------------------------------------------------------------- NUTS: energy, progress, parallel chains
def test_energy_is_the_hamiltonian_and_feeds_bfmi_and_plot_energy():
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bayes_safe.diagnostics import to_inference_data
    from bayes_safe.models import BayesianLinear

    X, y = simulate([1.0, -0.5, 0.0], 60, 0.5, seed=11)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([3]).to_event(1), noise_std=0.5,
                       inference="nuts",
                       inference_options={"num_samples": 150, "warmup_steps": 100, "num_chains": 2,
                                          "seed": 2, "parallel_chains": False})
    m.update(X, y)
    m.fit()
    stats = m.engine.sample_stats
    assert stats["energy"].shape == (2, 150) and stats["energy"].dtype == F64
    # energy = U + K with U = -lp and K = |p|^2 / 2 >= 0. At stationarity the returned
    # (q, p) follow exp(-H), so K ~ Gamma(D / 2, 1): mean D / 2 = 1.5 for D = 3 latent
    # coordinates (sd 1.22; the mean of 300 autocorrelated draws is within about 0.15).
    kinetic = stats["energy"] + stats["lp"]
    assert (kinetic >= 0).all()
    assert abs(kinetic.mean().item() - 1.5) < 0.45
    assert kinetic.std().item() > 0.5  # a fresh momentum at every draw, not a constant

    idata = to_inference_data(m)
    assert idata.sample_stats["energy"].shape == (2, 150)
    bfmi = az.bfmi(idata)
    assert bfmi.shape == (2,) and (bfmi > 0.3).all()  # a well-behaved posterior: no warning
    ax = az.plot_energy(idata)
    assert ax is not None
    plt.close("all")


def _nuts(**kwargs):
    X, y = simulate([0.5, -1.0], 30, 0.3, seed=5)
    options = {"noise_std": 0.3, "num_samples": 40, "warmup_steps": 40, "seed": 9, **kwargs}
    post = PyroLinearPosterior(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), 2, **options)
    post.fit(X, y)
    return post


def test_parallel_chains_give_the_sequential_draws():
    from bayes_safe.models.pyro_inference import _usable_cores

    if _usable_cores() < 2:
        pytest.skip("one usable core: parallel_chains=True falls back to sequential")
    # two problems x two chains = four chains, run in two worker processes
    X, y = simulate([0.5, -1.0], 30, 0.3, seed=5)
    X2, y2 = torch.stack([X, X[:, [1, 0]]]), torch.stack([y, y])
    runs = {}
    for parallel in (False, True):
        post = PyroLinearPosterior(
            dist.Laplace(0.0, 1.0).expand([2]).to_event(1), 2, noise_std=0.3, batch_shape=(2,),
            num_samples=30, warmup_steps=30, num_chains=2, seed=9, parallel_chains=parallel,
        )
        post.fit(X2, y2)
        runs[parallel] = post
    assert runs[False].nuts_workers == 1 and runs[True].nuts_workers == 2
    seq, par = runs[False], runs[True]
    assert torch.equal(seq.draws, par.draws)
    assert seq.chains.keys() == par.chains.keys() and seq.sample_stats.keys() == par.sample_stats.keys()
    for k in seq.chains:
        assert torch.equal(seq.chains[k], par.chains[k])
    for k in seq.sample_stats:
        assert torch.equal(seq.sample_stats[k], par.sample_stats[k])
    # the chains differ from each other (own seeds), and the problems were not mixed up
    assert not torch.equal(seq.chains["w"][0], seq.chains["w"][1])
    assert (seq.draws.mean(0)[0] - seq.draws.mean(0)[1].flip(-1)).abs().max() < 0.2


def test_parallel_chains_auto_and_fallbacks():
    small = _nuts(num_chains=2)  # "auto": 160 iterations are far too few to pay for workers
    assert small.nuts_workers == 1
    # a prior that cannot be pickled falls back to sequential chains, with a warning
    X, y = simulate([0.5, -1.0], 30, 0.3, seed=5)
    post = PyroLinearPosterior(
        lambda: pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1)), 2, noise_std=0.3,
        num_samples=20, warmup_steps=20, num_chains=2, parallel_chains=True,
    )
    from bayes_safe.models.pyro_inference import _usable_cores

    if _usable_cores() > 1:
        with pytest.warns(RuntimeWarning, match="parallel_chains=True: .*cannot be pickled"):
            post.fit(X, y)
        assert post.nuts_workers == 1
    # "auto" after a slow fit: the previous fit's time per iteration predicts this one's
    post = _nuts(num_chains=2)
    post._seconds_per_iteration = 1.0
    assert post._plan(2) == min(2, _usable_cores())


def test_progress_bar_option(capsys, monkeypatch):
    # bayes_safe.progress's bar (notebook-aware), never Pyro's own
    monkeypatch.delenv("CI", raising=False)
    _nuts(progress=False)
    assert capsys.readouterr().err == ""
    _nuts(progress=True)
    err = capsys.readouterr().err
    assert "NUTS fit" in err and "Sample" not in err  # one bar of the fit's iterations, not Pyro's per chain
    _nuts()  # "auto": stderr is not a terminal here
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    _nuts()  # "auto" on a terminal: a fit shorter than 2 s shows nothing
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------- SVI: sites, budget, state
def test_svi_inference_data_keeps_every_latent_site():
    from bayes_safe.diagnostics import to_inference_data
    from bayes_safe.models import BayesianLinear

    d = 3

    def horseshoe():  # broadcasts over a leading dimension: vectorized particles
        tau = pyro.sample("tau", dist.HalfCauchy(1.0))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d)).to_event(1))
        return pyro.sample("w", dist.Normal(0.0, tau[..., None] * lam).to_event(1))

    def horseshoe_scalar_code():  # tau * lam: [k] * [k, d] fails, particles one by one
        tau = pyro.sample("tau", dist.HalfCauchy(1.0))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d)).to_event(1))
        return pyro.sample("w", dist.Normal(0.0, tau * lam).to_event(1))

    probe = PyroLinearPosterior(horseshoe_scalar_code, d, noise_std=1.0, method="svi")
    assert probe._broadcasts() is False
    assert PyroLinearPosterior(horseshoe, d, noise_std=1.0, method="svi")._broadcasts() is True

    X, y = simulate([1.5, 0.0, 0.0], 40, 0.5, seed=4)
    m = BayesianLinear(horseshoe, noise_prior=dist.InverseGamma(3.0, 1.0), dim=d, inference="svi",
                       inference_options={"svi_steps": 160, "num_samples": 100, "seed": 1})
    m.update(X, y)
    m.fit()
    draws = m.engine.svi_draws
    assert set(draws) == {"tau", "lam", "w", "noise_var"}
    assert draws["tau"].shape == (100,) and (draws["tau"] > 0).all()
    assert draws["lam"].shape == (100, d) and (draws["lam"] > 0).all()
    assert torch.equal(draws["w"], m.engine.draws)

    idata = to_inference_data(m)
    post = idata.posterior
    assert {"tau", "lam", "w", "noise_var"} <= set(post.data_vars)
    # the 100 guide draws split into the default 4 chains of 25
    assert post["tau"].shape == (4, 25) and post["lam"].shape == (4, 25, d)
    assert post["w"].shape == (4, 25, d)
    np.testing.assert_array_equal(post["tau"].values.reshape(-1), draws["tau"].numpy())


def test_svi_budget_exhausted_is_recorded():
    X, y = simulate([0.3, -0.7], 30, 0.2, seed=1)
    prior = dist.Laplace(0.0, 1.0).expand([2]).to_event(1)
    # 30 steps: W = 10-step windows and A = 20 averaging steps leave no room for the search
    post = PyroLinearPosterior(prior, 2, noise_std=0.2, method="svi", svi_steps=30, num_samples=20)
    post.fit(X, y)
    assert post.svi_losses.shape == (30,) and not bool(post.svi_converged)
    # a generous budget converges and stops early (W = 30, A = 150)
    post = PyroLinearPosterior(prior, 2, noise_std=0.2, method="svi", svi_steps=600, num_samples=20)
    post.fit(X, y)
    assert bool(post.svi_converged) and 210 <= post.svi_losses.shape[0] < 600


def test_svi_state_round_trip_and_older_states(tmp_path):
    import json

    from bayes_safe.diagnostics import to_inference_data
    from bayes_safe.models import BayesianLinear
    from bayes_safe.state import load_state, save_state

    X, y = simulate([0.3, -0.7], 30, 0.2, seed=1)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_prior=dist.InverseGamma(3.0, 1.0),
                       inference="svi",
                       inference_options={"svi_steps": 200, "svi_particles": 3, "svi_tol": 2e-3,
                                          "num_samples": 30, "seed": 2})
    m.update(X, y)
    m.fit()
    path = save_state(m, tmp_path / "svi")
    back = load_state(path)
    e, b = m.engine, back.engine
    assert (b.svi_particles, b.svi_tol) == (3, 2e-3)
    assert torch.equal(b.svi_converged, e.svi_converged)
    assert b.svi_draws.keys() == e.svi_draws.keys() == {"w", "noise_var"}
    for k in e.svi_draws:
        assert torch.equal(b.svi_draws[k], e.svi_draws[k])

    # a state saved before these fields existed still loads (defaults for the new options)
    e._svi_draws, e.svi_converged = {}, None  # so that no tensor file entry refers to them
    path = save_state(m, tmp_path / "old")
    node = json.loads(path.read_text())
    obj = node["object"]
    for key in ("svi_particles", "svi_tol"):
        del obj["inference_options"][key]
    for key in ("svi_converged", "svi_draws"):
        del obj["engine"][key]
    path.write_text(json.dumps(node))
    old = load_state(path)
    assert old.engine.svi_particles == 8 and old.engine.svi_converged is None
    assert old.engine.svi_draws == {}
    assert torch.equal(old.engine.draws, e.draws)
    idata = to_inference_data(old)  # falls back to the stored w and noise draws
    assert set(idata.posterior.data_vars) == {"w", "noise_var"}
