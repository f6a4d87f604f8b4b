"""The online Laplace engine for 0/1 outcomes (``inference="laplace"``, issue 42 item 1).

Accuracy against a long Gibbs chain (Polya-Gamma for the logistic likelihood; the Gibbs engine's
horseshoe), the one-row update against a batch fit, state round trip, a ``Decider`` with TS-ASC,
and refused settings naming the argument.
"""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.models import BayesianLinear
from bayes_safe.policies import TSASC
from bayes_safe.random import DrawBatch, standard_gamma
from bayes_safe.state import load_state, save_state

F64 = torch.float64


def _data(n: int, d: int, seed: int = 0, link=torch.sigmoid):
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(d, dtype=F64)
    w[:3] = torch.tensor([1.5, -1.0, 0.8], dtype=F64)
    X = torch.randn(n, d, generator=g, dtype=F64)
    y = torch.bernoulli(link(X @ w), generator=g)
    return X, y, torch.randn(40, d, generator=g, dtype=F64)


def _normal(d):
    return dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1)


def _horseshoe(d):
    def model():
        tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(1.0, dtype=F64)))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d, dtype=F64)))
        return pyro.sample("w", dist.Normal(torch.zeros(d, dtype=F64), tau * lam))
    return model


def _pair(prior, d, X, y, likelihood="logistic", sweeps=1500, burn_in=200):
    lap = BayesianLinear(prior, likelihood=likelihood, inference="laplace", dim=d)
    lap.update(X, y)
    gibbs = BayesianLinear(prior, likelihood=likelihood, inference="gibbs", dim=d,
                           inference_options={"predict_sweeps": sweeps, "burn_in": burn_in})
    gibbs.update(X, y)
    return lap, gibbs


def test_normal_prior_matches_the_exact_posterior_by_importance_sampling():
    """d = 10, n = 2,000, Normal prior: the exact posterior's predicted probabilities by
    self-normalised importance sampling (8,000 draws from a Student-t (df 6) proposal at the
    Laplace mode and covariance, inflated 1.2x); the engine's within 0.004 mean absolute
    (measured 0.0012; the weights' effective sample size is checked to be large)."""
    torch.set_num_threads(1)
    d = 10
    X, y, Xt = _data(2000, d)
    m = BayesianLinear(_normal(d), likelihood="logistic", inference="laplace")
    m.update(X, y)
    g = torch.Generator().manual_seed(3)
    L = torch.linalg.cholesky(1.2 * m.posterior_covariance)
    S, df = 8000, 6.0
    z = torch.randn(S, d, generator=g, dtype=F64)
    chi = 2.0 * standard_gamma(torch.full((S,), df / 2, dtype=F64), g)  # chi^2(df)
    w = m.posterior_mean + (z @ L.T) / (chi / df).sqrt()[:, None]
    u = torch.linalg.solve_triangular(L, (w - m.posterior_mean).T, upper=False).T
    log_q = -0.5 * (df + d) * torch.log1p((u * u).sum(-1) / df)  # up to a constant (the weights normalise)
    f = w @ X.T
    log_post = -0.5 * (w * w).sum(-1) + (y * f - torch.nn.functional.softplus(f)).sum(-1)
    lw = log_post - log_q
    wt = torch.softmax(lw, 0)
    assert float(1.0 / (wt * wt).sum()) > 2000  # effective sample size
    exact = (wt[:, None] * torch.sigmoid(w @ Xt.T)).sum(0)
    p, _ = m.predict(Xt)
    assert float((p - exact).abs().mean()) < 0.004
    assert float((p - exact).abs().max()) < 0.015


def test_horseshoe_matches_a_gibbs_chain():
    """d = 6, n = 600, horseshoe: within 0.008 mean absolute / 0.03 max of a 300-sweep Gibbs chain
    (a short chain to keep the default run fast; the long tests compare at d = 10 and 40)."""
    torch.set_num_threads(1)
    d = 6
    X, y, Xt = _data(600, d, seed=9)
    lap, gibbs = _pair(_horseshoe(d), d, X, y, sweeps=300, burn_in=100)
    pl, _ = lap.predict(Xt)
    pg, _ = gibbs.predict(Xt)
    assert float((pl - pg).abs().mean()) < 0.008
    assert float((pl - pg).abs().max()) < 0.03


@pytest.mark.long
@pytest.mark.parametrize("prior_name", ["normal", "horseshoe"])
def test_predicted_probabilities_match_a_long_gibbs_chain(prior_name):
    """d = 10, n = 2,000: the Laplace engine's predicted click probabilities within 0.006 (mean
    absolute) and 0.02 (max) of a 1,500-sweep Gibbs chain's (measured 0.0012 / 0.0027 Normal,
    0.0025 / 0.008 horseshoe; the chain's own Monte-Carlo error is about 0.001)."""
    torch.set_num_threads(1)
    d = 10
    X, y, Xt = _data(2000, d)
    prior = _normal(d) if prior_name == "normal" else _horseshoe(d)
    lap, gibbs = _pair(prior, d, X, y)
    assert lap.engine_name == "laplace" and lap.binary_outcomes and not lap.needs_autograd
    pl, vl = lap.predict(Xt)
    pg, _ = gibbs.predict(Xt)
    assert float((pl - pg).abs().mean()) < 0.006
    assert float((pl - pg).abs().max()) < 0.02
    assert bool(((pl > 0) & (pl < 1) & (vl >= 0)).all())
    torch.testing.assert_close(lap.posterior_mean, gibbs.posterior_mean, atol=0.05, rtol=0.05)


def test_one_row_updates_follow_the_batch_fit_and_cost_no_history():
    """Rows learned one at a time (assumed-density filtering) land near the batch Laplace fit of the
    same rows; the summary is all the engine keeps (no rows)."""
    torch.set_num_threads(1)
    d = 10
    X, y, Xt = _data(1500, d, seed=1)
    batch = BayesianLinear(_normal(d), likelihood="logistic", inference="laplace")
    batch.update(X, y)
    online = BayesianLinear(_normal(d), likelihood="logistic", inference="laplace")
    online.update(X[:500], y[:500])
    for i in range(500, 1500):
        online.update(X[i], y[i])
    assert int(online.num_observations) == 1500 and online.engine.n == 1500
    p_batch, _ = batch.predict(Xt)
    p_online, _ = online.predict(Xt)
    assert float((p_batch - p_online).abs().mean()) < 0.006
    assert not any(t.shape[-2:] == (1500, d) for t in online.engine.state_tensors().values())


def test_probit_and_draws_are_success_probabilities():
    torch.set_num_threads(1)
    d = 4
    X, y, Xt = _data(400, d, seed=2, link=torch.special.ndtr)
    m = BayesianLinear(dist.Laplace(torch.zeros(d, dtype=F64), 1.0).to_event(1), likelihood="probit", inference="laplace")
    m.update(X, y)
    f = m.sample_at(Xt[:6], torch.Generator().manual_seed(0))
    assert f.shape == (6,) and bool(((f > 0) & (f < 1)).all())
    draws = m.sample((4000,), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(draws.mean(0), m.posterior_mean, atol=0.03, rtol=0)
    torch.testing.assert_close(torch.cov(draws.T), m.posterior_covariance, atol=0.003, rtol=0.1)
    batch = m.sample_at(Xt[None, :6], DrawBatch(50, 1, torch.Generator().manual_seed(2)))
    assert batch.shape == (50, 1, 6) and bool(((batch > 0) & (batch < 1)).all())


def test_student_t_prior_and_batch_shape():
    torch.set_num_threads(1)
    d = 3
    X, y, _ = _data(200, d, seed=3)
    prior = dist.StudentT(3.0, torch.zeros(d, dtype=F64), 1.0).to_event(1)
    m = BayesianLinear(prior, likelihood="logistic", inference="laplace", batch_shape=(2,))
    m.update(torch.stack([X, X]), torch.stack([y, y]))
    m.update(torch.stack([X[0], X[1]]), torch.stack([y[0], y[1]]))
    assert m.sample().shape == (2, d) and m.posterior_mean.shape == (2, d)
    assert m.predict(X[None, :5].expand(2, 5, d))[0].shape == (2, 5)


def test_state_round_trip(tmp_path):
    torch.set_num_threads(1)
    d = 5
    X, y, Xt = _data(300, d, seed=4)
    m = BayesianLinear(dist.Laplace(torch.zeros(d, dtype=F64), 0.5).to_event(1), likelihood="logistic",
                       inference="laplace", inference_options={"refresh_every": 7}, feature_names=[f"f{i}" for i in range(d)])
    m.update(X[:250], y[:250])
    for i in range(250, 260):
        m.update(X[i], y[i])
    save_state(m, tmp_path / "m.safetensors")
    back = load_state(tmp_path / "m.safetensors")
    assert back.engine_name == "laplace" and back.engine.refresh_every == 7 and back.feature_names == m.feature_names
    assert back.engine.since_refresh == m.engine.since_refresh and int(back.num_observations) == 260
    torch.testing.assert_close(back.posterior_mean, m.posterior_mean, rtol=0, atol=0)
    for i in range(260, 300):  # both continue alike (the EM refreshes included)
        m.update(X[i], y[i])
        back.update(X[i], y[i])
    torch.testing.assert_close(back.predict(Xt)[0], m.predict(Xt)[0], rtol=0, atol=0)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    torch.testing.assert_close(back.sample_at(Xt, g1), m.sample_at(Xt, g2), rtol=0, atol=0)


def test_works_in_a_decider_with_ts_asc(tmp_path):
    from bayes_safe.online import Decider

    torch.set_num_threads(1)
    d, K = 6, 5
    X, y, _ = _data(300, d, seed=6)
    reward = BayesianLinear(dist.Laplace(torch.zeros(d, dtype=F64), 0.5).to_event(1), likelihood="logistic",
                            inference="laplace")
    harm = BayesianLinear(_normal(d), likelihood="logistic", inference="laplace")
    reward.update(X, y)
    harm.update(X, 1.0 - y)
    decider = Decider(TSASC(reward, [harm], alpha=0.5), num_draws=50, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        features = rng.normal(size=(K, d))
        decision = decider.decide(features, baseline=0)
        assert 0 <= decision.action < K and 0.0 < decision.propensity <= 1.0
        decider.feedback(decision.decision_id, float(rng.integers(2)), [float(rng.integers(2))])
    assert int(reward.num_observations) == 320
    decider.save(tmp_path / "state")
    back = Decider.load(tmp_path / "state")
    torch.testing.assert_close(back.policy.models()["reward"].posterior_mean, reward.posterior_mean, rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"noise_std": 1.0}, "likelihood"),  # a Gaussian likelihood: the conjugate engine is exact
    ({"likelihood": "logistic", "forgetting": 0.99, "forgetting_rule": "exponential"}, "forgetting_rule"),
    ({"likelihood": "logistic", "forgetting": 0.99, "base_prior": "weak"}, "base_prior"),
    ({"likelihood": "logistic", "inference_options": {"sweeps": 2}}, "inference_options"),
    ({"likelihood": "logistic", "inference_options": {"refresh_every": 0}}, "refresh_every"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BayesianLinear(_normal(3), inference="laplace", **kwargs)


def test_priors_it_cannot_use_and_bad_outcomes_are_refused():
    with pytest.raises(ValueError, match="prior: the laplace engine"):
        BayesianLinear(dist.Gumbel(torch.zeros(3, dtype=F64), 1.0).to_event(1), likelihood="logistic", inference="laplace")
    m = BayesianLinear(_normal(3), likelihood="logistic", inference="laplace")
    with pytest.raises(ValueError, match="y: likelihood='logistic' needs outcomes in"):
        m.update(torch.ones(2, 3, dtype=F64), torch.tensor([0.0, 0.5], dtype=F64))
    assert int(m.num_observations) == 0 and m.engine.n == 0


@pytest.mark.long
def test_sparse_logistic_matches_a_long_gibbs_chain_at_d_40():
    """d = 40, 6,000 rows, horseshoe: mean absolute error of the predicted probabilities < 0.01."""
    torch.set_num_threads(1)
    d = 40
    X, y, Xt = _data(6000, d, seed=8)
    lap, gibbs = _pair(_horseshoe(d), d, X[:4000], y[:4000], sweeps=1000)
    for i in range(4000, 6000):
        lap.update(X[i], y[i])
    gibbs.update(X[4000:], y[4000:])
    pl, _ = lap.predict(Xt)
    pg, _ = gibbs.predict(Xt)
    assert float((pl - pg).abs().mean()) < 0.01


def test_to_inference_data_gives_independent_draws_of_the_approximation():
    """ArviZ (``bayes-safe diagnose``): the laplace engine's draws, split into chains, with the
    log-likelihood of the data; their mean is the approximation's."""
    import pyro.distributions as dist
    import torch

    from bayes_safe import BayesianLinear
    from bayes_safe.diagnostics import to_inference_data

    g = torch.Generator().manual_seed(3)
    X = torch.randn(200, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(200, generator=g, dtype=torch.float64) < torch.sigmoid(X @ torch.tensor([1.0, -1.0, 0.5],
                                                                                              dtype=torch.float64))).double()
    m = BayesianLinear(dist.Normal(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1), likelihood="logistic",
                       inference="laplace")
    m.update(X, y)
    idata = to_inference_data(m, X=X, y=y, num_draws=500, num_chains=4)
    w = torch.as_tensor(idata.posterior["w"].values)
    assert tuple(w.shape) == (4, 500, 3) and "log_likelihood" in idata.groups()
    sd = m.posterior_covariance.diagonal().sqrt()
    assert ((w.reshape(-1, 3).mean(0) - m.posterior_mean).abs() < 4 * sd / 2000 ** 0.5).all()
