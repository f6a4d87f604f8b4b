"""0/1 outcomes: probit (Albert & Chib 1993) and logistic (Polya-Gamma) likelihoods of BayesianLinear."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.models.gibbs import polya_gamma, truncated_normal_latent
from bayes_safe.random import ReplicationRNG, replication_seeds

F64 = torch.float64


def _binary(n: int, w, seed: int, link: str = "probit"):
    g = torch.Generator().manual_seed(seed)
    w = torch.tensor(w, dtype=F64)
    X = torch.randn(n, w.numel(), generator=g, dtype=F64)
    f = X @ w
    p = torch.special.ndtr(f) if link == "probit" else torch.sigmoid(f)
    return X, (torch.rand(n, generator=g, dtype=F64) < p).to(F64)


def _grid_moments(log_density, center, half_width, points: int = 301):
    a = torch.linspace(-1.0, 1.0, points, dtype=F64)
    W = torch.stack(torch.meshgrid(center[0] + half_width * a, center[1] + half_width * a, indexing="ij"), -1).reshape(-1, 2)
    lp = log_density(W)
    p = torch.exp(lp - lp.max())
    p = p / p.sum()
    mean = (p[:, None] * W).sum(0)
    return mean, (p[:, None] * (W - mean) ** 2).sum(0).sqrt()


def _draws(model, sweeps: int, burn: int = 200, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    for _ in range(burn):
        model.sample(g)
    return torch.stack([model.sample(g).clone() for _ in range(sweeps)]).reshape(-1, model.dim)


def _log_lik(link, X, y):
    def log_lik(W):
        f = W @ X.T
        if link == "probit":
            return (y * torch.special.log_ndtr(f) + (1 - y) * torch.special.log_ndtr(-f)).sum(-1)
        return (y * torch.nn.functional.logsigmoid(f) + (1 - y) * torch.nn.functional.logsigmoid(-f)).sum(-1)

    return log_lik


@pytest.mark.parametrize("link", ["probit", "logistic"])
@pytest.mark.parametrize("prior_name", ["normal", "laplace"])
def test_binary_posterior_matches_quadrature(link, prior_name):
    """Stationary mean within 0.1 posterior sd and sd within 10 % of the exact (grid) posterior, d = 2."""
    prior = {"normal": dist.Normal(torch.tensor([0.0, 0.3], dtype=F64), 0.8).to_event(1),
             "laplace": dist.Laplace(0.0, 0.5).expand([2]).to_event(1)}[prior_name]
    X, y = _binary(80, [1.0, -0.4], seed=1, link=link)
    m = BayesianLinear(prior, likelihood=link, batch_shape=[16])
    assert m.engine_name == "gibbs" and m.likelihood == link
    m.update(X[None], y[None])
    draws = _draws(m, 1500)
    log_lik = _log_lik(link, X, y)
    mean, sd = _grid_moments(lambda W: log_lik(W) + prior.log_prob(W), torch.zeros(2, dtype=F64), 3.0)
    assert ((draws.mean(0) - mean).abs() / sd).max() < 0.1, (draws.mean(0), mean, sd)
    assert ((draws.std(0) / sd) - 1).abs().max() < 0.1, (draws.std(0), sd)


def test_probit_with_a_horseshoe_prior_learns_a_sparse_signal():
    d = 5

    def horseshoe():
        tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(0.5, dtype=F64)))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d, dtype=F64)).to_event(1))
        return pyro.sample("w", dist.Normal(torch.zeros(d, dtype=F64), tau * lam).to_event(1))

    X, y = _binary(300, [1.5, 0.0, 0.0, 0.0, 0.0], seed=2)
    m = BayesianLinear(horseshoe, dim=d, likelihood="probit")
    assert m.engine_name == "gibbs"
    m.update(X, y)
    pm = m.posterior_mean
    wide = BayesianLinear(dist.Normal(0.0, 10.0).expand([d]).to_event(1), likelihood="probit")
    wide.update(X, y)
    assert abs(float(pm[0]) - 1.5) < 0.3
    assert pm[1:].abs().mean() < 0.8 * wide.posterior_mean[1:].abs().mean()


def test_samples_and_predictions_are_success_probabilities():
    X, y = _binary(60, [0.8, -0.8], seed=3)
    for link in ("probit", "logistic"):
        m = BayesianLinear(dist.Normal(0.0, 1.0).expand([2]).to_event(1), likelihood=link)
        m.update(X, y)
        p = m.sample_at(X[:10], torch.Generator().manual_seed(0))
        assert p.shape == (10,) and ((p > 0) & (p < 1)).all()
        mean, var = m.predict(X[:10])
        assert ((mean > 0) & (mean < 1)).all() and (var > 0).all() and (var < 0.25).all()
        # predicted probabilities follow the data: high where x^T w_true is high
        f_true = X[:10] @ torch.tensor([0.8, -0.8], dtype=F64)
        assert float(torch.corrcoef(torch.stack([mean, f_true]))[0, 1]) > 0.9
        assert m.sample(torch.Generator().manual_seed(0)).shape == (2,)


def test_polya_gamma_sampler_moments():
    """Mean tanh(c/2)/(2c) and variance (sinh c - c) / (4 c^3 cosh^2(c/2)) (Polson, Scott & Windle 2013)."""
    c = torch.tensor([0.0, 1.0, 5.0, -3.0], dtype=F64)
    x = polya_gamma(c.repeat(50000, 1), torch.Generator().manual_seed(0))
    a = c.abs().clamp_min(1e-8)
    mean = torch.where(c == 0, torch.tensor(0.25, dtype=F64), torch.tanh(a / 2) / (2 * a))
    var = torch.where(c == 0, torch.tensor(1 / 24, dtype=F64), (torch.sinh(a) - a) / (4 * a**3 * torch.cosh(a / 2) ** 2))
    torch.testing.assert_close(x.mean(0), mean, rtol=0.01, atol=0)
    torch.testing.assert_close(x.var(0), var, rtol=0.05, atol=0)
    assert (x > 0).all()


def test_truncated_normal_latents_have_the_truncated_moments():
    mu = torch.tensor([-1.0, 0.0, 2.0, -1.0, 0.5, -40.0], dtype=F64)
    y = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0], dtype=F64)
    z = truncated_normal_latent(mu.repeat(40000, 1), y.repeat(40000, 1), torch.Generator().manual_seed(0))
    assert torch.isfinite(z).all()
    assert (z[:, y == 1] > 0).all() and (z[:, y == 0] <= 0).all()
    s = 2 * y - 1
    phi = torch.exp(-0.5 * mu**2) / math.sqrt(2 * math.pi)
    expected = mu + s * phi / torch.special.ndtr(s * mu)
    torch.testing.assert_close(z.mean(0)[:5], expected[:5], atol=0.01, rtol=0)
    assert 0 < float(z[:, 5].mean()) < 0.1  # 40 sd into the tail: just above 0


def test_binary_draws_are_replication_separable_with_growing_data():
    R, d = 3, 2
    seeds = replication_seeds(9, R)
    X, y = _binary(R * 12, [0.7, -0.7], seed=4)
    Xb, yb = X.reshape(R, 12, d), y.reshape(R, 12)
    for link in ("probit", "logistic"):
        batched = BayesianLinear(dist.Normal(0.0, 1.0).expand([d]).to_event(1), likelihood=link, batch_shape=[R])
        rng = ReplicationRNG(seeds)
        out = []
        for t in range(12):
            batched.update(Xb[:, t], yb[:, t])
            out.append(batched.sample_at(Xb, rng, key="constraint0"))
        for r in range(R):
            one = BayesianLinear(dist.Normal(0.0, 1.0).expand([d]).to_event(1), likelihood=link, batch_shape=[1])
            rng1 = ReplicationRNG(seeds[r: r + 1])
            for t in range(12):
                one.update(Xb[r: r + 1, t], yb[r: r + 1, t])
                assert torch.equal(one.sample_at(Xb[r: r + 1], rng1, key="constraint0")[0], out[t][r]), (link, r, t)


# ------------------------------------------------------------------------------ bad input
PRIOR = dist.Normal(0.0, 1.0).expand([2]).to_event(1)


@pytest.mark.parametrize("link", ["probit", "logistic"])
@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0, float("nan")])
def test_outcomes_outside_zero_one_are_rejected_before_any_change(link, bad):
    m = BayesianLinear(PRIOR, likelihood=link)
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
    y = torch.tensor([1.0, bad, 0.0], dtype=F64)
    with pytest.raises(ValueError, match=r"^y: "):
        m.update(X, y)
    assert m.engine.n == 0 and int(m.num_observations) == 0
    with pytest.raises(ValueError, match=r"^y: "):
        m.update(X[0], y[1])  # one row
    assert m.engine.n == 0
    m.update(X, torch.tensor([1.0, 0.0, 1.0], dtype=F64))  # still usable
    assert m.engine.n == 3 and int(m.num_observations) == 3


def test_bad_likelihood_settings_name_the_argument():
    with pytest.raises(ValueError, match=r"^likelihood: expected 'gaussian', 'probit' or 'logistic', got 'poisson'"):
        BayesianLinear(PRIOR, likelihood="poisson")
    with pytest.raises(ValueError, match=r"^likelihood: "):
        BayesianLinear(PRIOR, noise_std=1.0, likelihood=None)
    with pytest.raises(ValueError, match=r"^noise_std / noise_prior: likelihood='probit'"):
        BayesianLinear(PRIOR, noise_std=1.0, likelihood="probit")
    with pytest.raises(ValueError, match=r"^noise_std / noise_prior: likelihood='logistic'"):
        BayesianLinear(PRIOR, noise_prior=dist.InverseGamma(2.0, 1.0), likelihood="logistic")
    with pytest.raises(ValueError, match=r"^inference: likelihood='probit' is sampled by the Gibbs or Langevin engine"):
        BayesianLinear(PRIOR, likelihood="probit", inference="nuts")
    with pytest.raises(ValueError, match=r"^inference: "):
        BayesianLinear(PRIOR, likelihood="logistic", inference="conjugate")


def test_priors_the_binary_engine_cannot_use_are_rejected():
    with pytest.raises(ValueError, match=r"^prior: its support is"):
        BayesianLinear(dist.Gamma(2.0, 1.0).expand([2]).to_event(1), likelihood="probit")
    with pytest.raises(ValueError, match=r"^prior: its support is"):
        BayesianLinear(dist.HalfCauchy(1.0).expand([2]).to_event(1), likelihood="logistic")
    # a prior that is no scale mixture goes to the Langevin engine, which takes any likelihood
    low_rank = BayesianLinear(dist.LowRankMultivariateNormal(torch.zeros(2), torch.ones(2, 1), torch.ones(2)),
                              likelihood="probit")
    assert low_rank.engine_name == "langevin"
    with pytest.raises(ValueError, match=r"^prior: the Gibbs engine"):
        BayesianLinear(dist.LowRankMultivariateNormal(torch.zeros(2), torch.ones(2, 1), torch.ones(2)),
                       likelihood="probit", inference="gibbs")


# ------------------------------------------------------------------------------ slow: NUTS reference
@pytest.mark.long
def test_probit_laplace_matches_a_long_nuts_run():
    """n = 200, d = 4: stationary mean within 0.1 NUTS posterior sd and sd within 10 %."""
    from pyro.infer import MCMC, NUTS

    X, y = _binary(200, [1.0, 0.0, -0.5, 0.2], seed=10)
    prior = dist.Laplace(torch.tensor(0.0, dtype=F64), torch.tensor(0.5, dtype=F64)).expand([4]).to_event(1)

    def model():
        w = pyro.sample("w", prior)
        pyro.sample("y", dist.Bernoulli(probs=torch.special.ndtr(X @ w).clamp(1e-12, 1 - 1e-12)).to_event(1), obs=y)

    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    mcmc = MCMC(NUTS(model, target_accept_prob=0.9), num_samples=3000, warmup_steps=1000, disable_progbar=True)
    mcmc.run()
    ref = mcmc.get_samples()["w"].to(F64)
    m = BayesianLinear(prior, likelihood="probit", batch_shape=[16])
    m.update(X[None], y[None])
    draws = _draws(m, 2000, burn=300)
    sd = ref.std(0)
    assert ((draws.mean(0) - ref.mean(0)).abs() / sd).max() < 0.1, (draws.mean(0), ref.mean(0), sd)
    assert ((draws.std(0) / sd) - 1).abs().max() < 0.1, (draws.std(0), sd)
