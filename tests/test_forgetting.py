"""Forgetting in the conjugate posteriors (issue 30, first part): ``BayesianLinear(...,
forgetting=lambda)``, stabilised (the default: the prior is kept) or exponential, checked against
the weighted sufficient statistics written out here, across replications, saving and the
Decider, and refused by name by the engines that do not forget yet.

The drifting problem is written here: two offers whose conversion rates swap halfway.
"""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, ThompsonSampling
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.state import StateError, load_state, save_state

F64 = torch.float64
D = 3


def _prior(d=D, scale=1.0):
    return dist.Normal(torch.zeros(d, dtype=F64), scale).to_event(1)


def _rows(n, seed=0, d=D):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=n)


def _weighted_stats(X, y, lam, noise_sd, prior_var=1.0):
    """Stabilised forgetting written out: prior + sum_i lam^(n-1-i) x_i x_i^T / s^2 (and eta)."""
    n, d = X.shape
    w = lam ** np.arange(n - 1, -1, -1)
    precision = np.eye(d) / prior_var + (X * w[:, None]).T @ X / noise_sd**2
    eta = (X * (w * y)[:, None]).sum(0) / noise_sd**2
    return precision, eta


@pytest.mark.parametrize("lam", [0.9, 0.99])
def test_stabilized_forgetting_is_the_prior_plus_geometrically_weighted_data(lam):
    X, y = _rows(40)
    m = BayesianLinear(_prior(), noise_std=0.5, forgetting=lam)
    for x, v in zip(X, y):
        m.update(x, float(v))
    precision, eta = _weighted_stats(X, y, lam, 0.5)
    np.testing.assert_allclose(m.precision.numpy(), precision, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(m.eta.numpy(), eta, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(m.posterior_mean.numpy(), np.linalg.solve(precision, eta), rtol=1e-9)
    # the rows in one call are the same observations in order
    batch = BayesianLinear(_prior(), noise_std=0.5, forgetting=lam)
    batch.update(X, y)
    torch.testing.assert_close(batch.precision, m.precision, rtol=1e-12, atol=1e-12)
    assert int(batch.num_observations) == int(m.num_observations) == 40


def test_stabilized_keeps_unobserved_directions_at_the_prior_and_exponential_does_not():
    """Observations along x1 only: the variance of w2 stays the prior's under the stabilised rule
    and grows as lambda^-n under the exponential one (why the stabilised rule is the default)."""
    stable = BayesianLinear(_prior(2), noise_std=1.0, forgetting=0.95)
    expo = BayesianLinear(_prior(2), noise_std=1.0, forgetting=0.95, forgetting_rule="exponential")
    for _ in range(100):
        for m in (stable, expo):
            m.update(np.array([1.0, 0.0]), 0.3)
    var_stable = float(torch.diagonal(stable.posterior_covariance)[1])
    var_expo = float(torch.diagonal(expo.posterior_covariance)[1])
    assert var_stable == pytest.approx(1.0, rel=1e-9)
    assert var_expo == pytest.approx(0.95 ** -100, rel=1e-6) and var_expo > 100
    # along x1 both remember about 1 / (1 - lambda) = 20 observations, not 100
    plain = BayesianLinear(_prior(2), noise_std=1.0)
    plain.update(np.tile([1.0, 0.0], (100, 1)), np.full(100, 0.3))
    assert float(torch.diagonal(stable.posterior_covariance)[0]) > 4 * float(torch.diagonal(plain.posterior_covariance)[0])


def test_normal_inverse_gamma_forgets_its_noise_statistics_too():
    noise = dist.InverseGamma(torch.tensor(3.0, dtype=F64), torch.tensor(2.0, dtype=F64))
    m = BayesianLinear(_prior(), noise_prior=noise, forgetting=0.9)
    X, y = _rows(60, seed=1)
    y = y * 3.0  # noisy outcomes early on
    for x, v in zip(X[:30], y[:30]):
        m.update(x, float(v))
    for x in X[30:]:  # then quiet ones: the noise estimate follows
        m.update(x, 0.0)
    a, b = m._noise_posterior()
    w = 0.9 ** np.arange(59, -1, -1)
    assert float(a) == pytest.approx(3.0 + 0.5 * w.sum(), rel=1e-10)
    plain = BayesianLinear(_prior(), noise_prior=noise)
    plain.update(X, np.concatenate([y[:30], np.zeros(30)]))
    a_plain, b_plain = plain._noise_posterior()
    assert float(b / (a - 1)) < 0.5 * float(b_plain / (a_plain - 1))  # the recent, quiet noise weighs more


def test_a_batch_of_replications_forgets_each_on_its_own():
    R = 3
    batch = BayesianLinear(_prior(), noise_std=0.5, batch_shape=[R], forgetting=0.8)
    singles = [BayesianLinear(_prior(), noise_std=0.5, forgetting=0.8) for _ in range(R)]
    X, y = _rows(20 * R, seed=2)
    X, y = X.reshape(20, R, D), y.reshape(20, R)
    for t in range(20):
        batch.update(X[t], y[t])
        for r in range(R):
            singles[r].update(X[t, r], float(y[t, r]))
    for r in range(R):
        torch.testing.assert_close(batch.precision[r], singles[r].precision, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(batch.posterior_mean[r], singles[r].posterior_mean, rtol=1e-10, atol=1e-12)


def test_forgetting_is_saved_and_a_tampered_value_refused(tmp_path):
    m = BayesianLinear(_prior(), noise_std=0.5, forgetting=0.97, forgetting_rule="exponential")
    X, y = _rows(10, seed=3)
    m.update(X, y)
    save_state(m, tmp_path / "m")
    back = load_state(tmp_path / "m")
    assert (back.forgetting, back.forgetting_rule) == (0.97, "exponential") and "forgetting=0.97" in repr(back)
    x = np.array([0.5, -1.0, 2.0])
    m.update(x, 1.0)
    back.update(x, 1.0)
    torch.testing.assert_close(back.precision, m.precision, rtol=0, atol=0)
    import json

    path = tmp_path / "m.json" if (tmp_path / "m.json").exists() else next(tmp_path.glob("m*.json"))
    node = json.loads(path.read_text())
    text = path.read_text().replace('"forgetting": 0.97', '"forgetting": 1.5')
    assert text != json.dumps(node)
    path.write_text(text)
    with pytest.raises(StateError, match="forgetting"):
        load_state(tmp_path / "m")


@pytest.mark.parametrize("kwargs, engine", [
    ({"prior": dist.Laplace(torch.zeros(D, dtype=F64), 1.0).to_event(1), "noise_std": 1.0,
      "forgetting_rule": "exponential"}, "gibbs"),  # the Gibbs engine forgets the data only: the stabilised rule
    ({"prior": _prior(), "likelihood": "probit"}, "gibbs"),  # Albert-Chib's augmentation has no weighted form
    ({"prior": _prior(), "noise_std": 1.0, "inference": "nuts", "forgetting_rule": "exponential"}, "nuts"),
    ({"prior": _prior(), "noise_std": 1.0, "inference": "svi", "forgetting_rule": "exponential"}, "svi"),
])
def test_engines_that_do_not_forget_refuse_by_name(kwargs, engine):
    with pytest.raises(ValueError, match=f"forgetting: the {engine} engine"):
        BayesianLinear(**kwargs, forgetting=0.99)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.01, "0.9", True])
def test_a_bad_forgetting_factor_names_the_argument(bad):
    with pytest.raises(ValueError, match="forgetting: expected a number in"):
        BayesianLinear(_prior(), noise_std=1.0, forgetting=bad)


def test_forgetting_tracks_a_swap_that_the_plain_posterior_is_slow_to_see():
    """Two offers (one-hot features) whose conversion rates swap after 400 decisions: over the
    400 decisions after the swap, Thompson sampling with forgetting loses much less."""
    R, T, swap = 20, 800, 400
    means = np.array([[0.6, 0.4], [0.4, 0.6]])  # before, after
    features = torch.eye(2, dtype=F64).expand(R, 2, 2)

    def run(forgetting):
        policy = ThompsonSampling(BayesianLinear(_prior(2), noise_std=0.3, batch_shape=[R], forgetting=forgetting))
        g = torch.Generator().manual_seed(0)
        rng = np.random.default_rng(0)
        regret = 0.0
        for t in range(T):
            a = policy.select(features, torch.zeros(R, dtype=torch.long), generator=g)
            mu = means[int(t >= swap)]
            y = mu[a.numpy()] + 0.3 * rng.normal(size=R)
            policy.update(features[torch.arange(R), a], torch.as_tensor(y, dtype=F64))
            if t >= swap:
                regret += float((mu.max() - mu[a.numpy()]).mean())
        return regret

    plain, forgetting = run(None), run(0.98)
    assert forgetting < 0.5 * plain, (forgetting, plain)
    print(f"regret after the swap: {plain:.1f} without forgetting, {forgetting:.1f} with lambda = 0.98")


def test_a_decider_that_forgets_replays_its_log_to_the_same_posterior(tmp_path):
    policy = ThompsonSampling(BayesianLinear(_prior(), noise_std=0.5, forgetting=0.95))
    decider = Decider(policy, num_draws=10, seed=0, log=tmp_path / "log.sqlite")
    X, y = _rows(30, seed=4)
    decider.save(tmp_path / "state")  # the snapshot before any feedback
    ds = [decider.decide(np.stack([X[i], -X[i]])) for i in range(30)]
    for d, v in zip(ds, y):
        decider.feedback(d.decision_id, float(v))
    decider.log.close()
    back = Decider.load(tmp_path / "state", log=DecisionLog(tmp_path / "log.sqlite"))
    assert back.replayed == {"decisions": 30, "feedback": 30}
    torch.testing.assert_close(back.policy.model.precision, policy.model.precision, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(back.policy.model.posterior_mean, policy.model.posterior_mean, rtol=1e-10, atol=1e-12)
    back.log.close()


def test_a_gibbs_model_forgets_its_data_and_keeps_its_prior(tmp_path):
    """The Gibbs engine (a Laplace prior, Gaussian likelihood) under the stabilised rule: its
    sufficient statistics are those of the conjugate model forgetting at the same factor, it
    follows a change of the weights that the model without forgetting averages away, and the
    state saved with a noise prior's weighted count loads and goes on the same."""
    from bayes_safe.state import load_state, save_state

    lap = dist.Laplace(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1)
    noise = dist.InverseGamma(torch.tensor(3.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 3, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    y = torch.cat([X[:100] @ w, X[100:] @ -w]) + 0.3 * torch.randn(200, generator=g, dtype=torch.float64)
    gibbs = BayesianLinear(lap, noise_prior=noise, forgetting=0.9)
    reference = BayesianLinear(dist.Normal(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1), noise_std=1.0,
                               forgetting=0.9)
    for i in range(150):
        gibbs.update(X[i], y[i])
        reference.update(X[i], y[i])
    gibbs.update(X[150:], y[150:])       # several rows at once: each forgets the ones before it
    for i in range(150, 200):
        reference.update(X[i], y[i])
    e = gibbs.engine
    data_precision = reference.precision - reference._prior_precision  # the conjugate model's data part
    torch.testing.assert_close(e._xtx, data_precision, rtol=1e-10, atol=1e-10)
    assert float(e._n_eff) == pytest.approx(sum(0.9 ** k for k in range(200)))
    assert float((gibbs.posterior_mean + w).abs().max()) < 0.3      # the new weights, not an average
    save_state(gibbs, tmp_path / "gibbs")
    again = load_state(tmp_path / "gibbs")
    assert again.forgetting == 0.9 and torch.equal(again.engine._n_eff, e._n_eff)
    assert torch.equal(again.engine._xtx, e._xtx)
    with pytest.raises(ValueError, match="forgetting: the gibbs engine cannot forget with likelihood='probit'"):
        BayesianLinear(lap, likelihood="probit", forgetting=0.9)
    with pytest.raises(ValueError, match="forgetting_rule='exponential'"):
        BayesianLinear(lap, noise_std=1.0, forgetting=0.9, forgetting_rule="exponential")
