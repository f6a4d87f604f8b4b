import pyro.distributions as dist
import pytest
import torch

from bayes_safe.models import BayesianLinear, PerArmLinear

D = 4


def _data(n=50, d=D, seed=0, noise=0.3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(d, generator=g, dtype=torch.float64)
    y = X @ w + noise * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y, w


def _mvn_prior(d=D, seed=1):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    cov = A @ A.T + 0.5 * torch.eye(d, dtype=torch.float64)
    loc = torch.randn(d, generator=g, dtype=torch.float64)
    return loc, cov


def test_known_noise_matches_closed_form_and_sequential_equals_batch():
    X, y, _ = _data()
    loc, cov = _mvn_prior()
    s = 0.3
    batch = BayesianLinear(dist.MultivariateNormal(loc, cov), noise_std=s)
    batch.update(X, y)
    seq = BayesianLinear(dist.MultivariateNormal(loc, cov), noise_std=s)
    for i in range(len(y)):
        seq.update(X[i], y[i])
    prec0 = torch.linalg.inv(cov)
    cov_n = torch.linalg.inv(prec0 + X.T @ X / s**2)
    mean_n = cov_n @ (prec0 @ loc + X.T @ y / s**2)
    for m in (batch, seq):
        assert m.conjugate
        torch.testing.assert_close(m.posterior_mean, mean_n, atol=1e-10, rtol=0)
        torch.testing.assert_close(m.posterior_covariance, cov_n, atol=1e-10, rtol=0)
    torch.testing.assert_close(seq.precision, batch.precision, atol=1e-10, rtol=0)
    Xq = torch.randn(7, D, dtype=torch.float64)
    mean, var = batch.predict(Xq)
    torch.testing.assert_close(mean, Xq @ mean_n, atol=1e-10, rtol=0)
    torch.testing.assert_close(var, torch.einsum("kd,de,ke->k", Xq, cov_n, Xq), atol=1e-10, rtol=0)


def test_isotropic_to_event_prior_is_conjugate_and_draws_have_posterior_moments():
    X, y, _ = _data(n=30)
    m = BayesianLinear(dist.Normal(0.0, 2.0).expand([D]).to_event(1), noise_std=0.3)
    m.update(X, y)
    g = torch.Generator().manual_seed(3)
    draws = torch.stack([m.sample(g) for _ in range(4000)])
    assert draws.shape == (4000, D)
    torch.testing.assert_close(draws.mean(0), m.posterior_mean, atol=4 * m.posterior_covariance.diagonal().sqrt().max() / 4000**0.5 * 3, rtol=0)
    emp = torch.cov(draws.T)
    torch.testing.assert_close(emp, m.posterior_covariance, atol=0.1 * m.posterior_covariance.abs().max(), rtol=0)


def test_normal_inverse_gamma_closed_form():
    X, y, _ = _data(n=40, noise=0.5)
    loc, V0 = _mvn_prior()
    a0, b0 = 3.0, 2.0
    m = BayesianLinear(dist.MultivariateNormal(loc, V0), noise_prior=dist.InverseGamma(a0, b0))
    seq = BayesianLinear(dist.MultivariateNormal(loc, V0), noise_prior=dist.InverseGamma(a0, b0))
    m.update(X, y)
    for i in range(len(y)):
        seq.update(X[i : i + 1], y[i : i + 1])
    L0 = torch.linalg.inv(V0)
    Ln = L0 + X.T @ X
    Vn = torch.linalg.inv(Ln)
    mn = Vn @ (L0 @ loc + X.T @ y)
    an = a0 + len(y) / 2
    bn = b0 + 0.5 * (y @ y + loc @ L0 @ loc - mn @ Ln @ mn)
    for model in (m, seq):
        torch.testing.assert_close(model.posterior_mean, mn, atol=1e-10, rtol=0)
        post = model.noise_variance_posterior
        torch.testing.assert_close(post.concentration, torch.tensor(an, dtype=torch.float64), atol=1e-10, rtol=0)
        torch.testing.assert_close(post.rate, bn, atol=1e-10, rtol=0)
        torch.testing.assert_close(model.posterior_covariance, Vn * bn / (an - 1), atol=1e-10, rtol=0)


def test_nig_draws_follow_the_student_t_marginal():
    X, y, _ = _data(n=8, noise=0.5)
    m = BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), noise_prior=dist.InverseGamma(3.0, 1.0))
    m.update(X, y)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([m.sample(g) for _ in range(6000)])
    torch.testing.assert_close(draws.mean(0), m.posterior_mean, atol=0.05, rtol=0)
    torch.testing.assert_close(draws.var(0), m.posterior_covariance.diagonal(), rtol=0.15, atol=0)


def test_batch_shape_updates_each_model_independently():
    X, y, _ = _data(n=20)
    Xb = torch.stack([X, 2 * X, -X])
    yb = torch.stack([y, y, 3 * y])
    batched = BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), noise_std=0.3, batch_shape=[3])
    batched.update(Xb, yb)
    assert batched.sample().shape == (3, D)
    for r in range(3):
        single = BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), noise_std=0.3)
        single.update(Xb[r], yb[r])
        torch.testing.assert_close(batched.posterior_mean[r], single.posterior_mean, atol=1e-10, rtol=0)


def test_laplace_prior_fitted_with_nuts_recovers_weights():
    g = torch.Generator().manual_seed(0)
    w = torch.tensor([1.0, -0.5, 0.0], dtype=torch.float64)
    X = torch.randn(80, 3, generator=g, dtype=torch.float64)
    y = X @ w + 0.1 * torch.randn(80, generator=g, dtype=torch.float64)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([3]).to_event(1), noise_std=0.1,
                       inference_options={"num_samples": 150, "warmup_steps": 150, "seed": 0})
    assert not m.conjugate
    before = m.sample(torch.Generator().manual_seed(1))
    m.update(X, y)
    m.fit()
    torch.testing.assert_close(m.posterior_mean, w, atol=0.05, rtol=0)
    after = m.sample(torch.Generator().manual_seed(1))
    assert not torch.equal(before, after)  # draws come from the refitted posterior
    mean, var = m.predict(X[:5])
    torch.testing.assert_close(mean, X[:5] @ w, atol=0.1, rtol=0)
    assert (var < 0.01).all()


def test_refit_every_refits_automatically():
    X, y, _ = _data(n=12, d=2)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_std=0.3, inference="svi",
                       refit_every=10, inference_options={"svi_steps": 200, "num_samples": 50})
    prior_draws = m._draws.clone()
    m.update(X[:9], y[:9])
    m.sample(torch.Generator().manual_seed(0))
    assert torch.equal(m._draws, prior_draws) and m.unfitted_observations == 9
    assert "unfitted_observations=9" in repr(m)
    m.update(X[9:], y[9:])  # 12 >= refit_every: the refit runs at the next query, not inside update
    assert torch.equal(m._draws, prior_draws)
    m.sample(torch.Generator().manual_seed(0))
    assert not torch.equal(m._draws, prior_draws)
    assert m.unfitted_observations == 0 and "unfitted" not in repr(m)


def test_a_nuts_or_svi_model_learns_by_default_at_doubling_data():
    X, y, _ = _data(n=12, d=2)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_std=0.3, inference="svi",
                       inference_options={"svi_steps": 50, "num_samples": 20})
    fits = []
    original = m.engine.fit
    m.engine.fit = lambda X, y, **kw: (fits.append(X.shape[-2]), original(X, y, **kw))[1]
    for i in range(12):
        m.update(X[i], y[i])
        m.sample(torch.Generator().manual_seed(i))
    assert fits == [1, 2, 4, 8]  # log2(n) refits: the data doubled since the last one
    assert m.unfitted_observations == 4 and "unfitted_observations=4" in repr(m)


def test_per_arm_updates_only_the_played_arm():
    prior = dist.Normal(0.0, 1.0).expand([3]).to_event(1)
    m = PerArmLinear(prior, num_arms=4, noise_std=0.5, batch_shape=[2])
    c = torch.randn(2, 3, dtype=torch.float64)
    m.update(c, torch.tensor([1.0, -1.0]), actions=torch.tensor([2, 0]))
    mean = m.posterior_mean  # [2, 4, 3]
    assert mean.shape == (2, 4, 3)
    moved = mean.abs().sum(-1) > 0
    assert moved.tolist() == [[False, False, True, False], [True, False, False, False]]
    single = BayesianLinear(prior, noise_std=0.5)
    single.update(c[0], torch.tensor(1.0))
    torch.testing.assert_close(mean[0, 2], single.posterior_mean, atol=1e-12, rtol=0)
    scores = m.sample_at(c[:, None, :].expand(2, 4, 3))
    assert scores.shape == (2, 4)


def test_per_arm_nig_counts_only_played_arm():
    prior = dist.Normal(0.0, 1.0).expand([2]).to_event(1)
    m = PerArmLinear(prior, num_arms=3, noise_prior=dist.InverseGamma(2.0, 1.0))
    m.update(torch.tensor([1.0, 0.5]), torch.tensor(2.0), actions=torch.tensor(1))
    a = m.arms.noise_variance_posterior.concentration
    assert a.tolist() == [2.0, 2.5, 2.0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prior": dist.Normal(0.0, 1.0), "noise_std": 1.0}, "prior: expected a distribution with event shape"),
        ({"prior": dist.Normal(0.0, 1.0).expand([3]).to_event(1), "noise_std": -1.0}, "noise_std"),
        ({"prior": dist.Normal(0.0, 1.0).expand([3]).to_event(1)}, "exactly one"),
        ({"prior": dist.Normal(0.0, 1.0).expand([3]).to_event(1), "noise_std": 1.0,
          "noise_prior": dist.InverseGamma(1.0, 1.0)}, "exactly one"),
        ({"prior": "normal", "noise_std": 1.0}, "prior"),
        ({"prior": dist.Laplace(0.0, 1.0).expand([3]).to_event(1), "noise_std": 1.0, "inference": "conjugate"}, "conjugate"),
        ({"prior": dist.Normal(0.0, 1.0).expand([3]).to_event(1), "noise_std": 1.0, "inference": "mcmc"}, "inference"),
        ({"prior": dist.Normal(0.0, 1.0).expand([2, 3]).to_event(1), "noise_std": 1.0, "batch_shape": [5]}, "batch shape"),
    ],
)
def test_bad_construction_is_rejected(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        BayesianLinear(**kwargs)


def test_bad_updates_are_rejected_before_any_change():
    m = BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_std=1.0, batch_shape=[2])
    before = m.precision.clone()
    with pytest.raises(ValueError, match="X: expected shape"):
        m.update(torch.randn(2, 5, 4), torch.randn(2, 5))
    with pytest.raises(ValueError, match="y: expected shape"):
        m.update(torch.randn(2, 5, 3), torch.randn(2, 4))
    bad = torch.randn(2, 5, 3)
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="X: expected finite"):
        m.update(bad, torch.randn(2, 5))
    with pytest.raises(ValueError, match="y: expected finite"):
        m.update(torch.randn(2, 5, 3), torch.tensor([[float("inf")] * 5] * 2))
    with pytest.raises(ValueError, match="X: expected last dimension"):
        m.predict(torch.randn(2, 4, 5))
    assert torch.equal(m.precision, before)


@pytest.mark.parametrize("noise", ["known", "nig"])
def test_per_arm_equals_separate_models_through_interleaved_draws(noise):
    """Per-arm updates touch (and refactor) only the played arms; draws between updates use
    the partially refreshed factor. Every arm must match a model fed only its own rows."""
    d, K, R, T = 3, 4, 2, 25
    prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)).expand([d]).to_event(1)
    kw = {"noise_std": 0.5} if noise == "known" else {"noise_prior": dist.InverseGamma(2.0, 1.0)}
    m = PerArmLinear(prior, num_arms=K, batch_shape=[R], **kw)
    refs = [[BayesianLinear(prior, **kw) for _ in range(K)] for _ in range(R)]
    g = torch.Generator().manual_seed(3)
    for t in range(T):
        m.sample(g)  # factor computed now, then partially refreshed after the next update
        c = torch.randn(R, d, dtype=torch.float64, generator=g)
        y = torch.randn(R, dtype=torch.float64, generator=g)
        a = torch.randint(K, (R,), generator=g)
        m.update(c, y, a)
        for r in range(R):
            refs[r][int(a[r])].update(c[r], y[r])
    for r in range(R):
        for k in range(K):
            ref = refs[r][k]
            torch.testing.assert_close(m.posterior_mean[r, k], ref.posterior_mean, atol=1e-12, rtol=0)
            torch.testing.assert_close(m.posterior_covariance[r, k], ref.posterior_covariance, atol=1e-12, rtol=0)
            torch.testing.assert_close(m.arms.factor[r, k], ref.factor, atol=1e-12, rtol=0)
            assert int(m.arms.num_observations[r, k]) == int(ref.num_observations)
            if noise == "nig":
                post, rp = m.arms.noise_variance_posterior, ref.noise_variance_posterior
                torch.testing.assert_close(post.concentration[r, k], rp.concentration, atol=1e-12, rtol=0)
                torch.testing.assert_close(post.rate[r, k], rp.rate, atol=1e-12, rtol=0)


def test_diagnostics_say_when_the_draws_miss_observations():
    from bayes_safe.diagnostics import to_inference_data

    X, y, _ = _data(n=6, d=2)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_std=0.3, inference="svi",
                       inference_options={"svi_steps": 50, "num_samples": 20})
    m.update(X[:2], y[:2])
    m.fit()
    m.update(X[2:], y[2:])
    with pytest.warns(UserWarning, match="4 observations arrived after the last SVI fit"):
        idata = to_inference_data(m)
    assert idata.attrs["unfitted_observations"] == 4
    m.fit()
    assert "unfitted_observations" not in to_inference_data(m).attrs
