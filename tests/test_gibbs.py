"""The Gibbs engine of BayesianLinear: Gaussian scale-mixture priors (Laplace, Student-t, horseshoe).

Accuracy is checked against exact references: the conjugate posterior (Gaussian prior), a
two-dimensional quadrature of the posterior density (Laplace, Student-t), draws of the Pyro
horseshoe prior itself (no data), and, in the long tests, long NUTS runs at n = 200, d = 4.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from chain_precision import mcse_of_mean

from bayes_safe import BayesianLinear, simulate
from bayes_safe.models.gibbs import inverse_gaussian, recognise_prior, uniform_rows
from bayes_safe.random import ReplicationRNG, replication_seeds

F64 = torch.float64


def _data(n: int, w, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.tensor(w, dtype=F64)
    X = torch.randn(n, w.numel(), generator=g, dtype=F64)
    return X, X @ w + noise * torch.randn(n, generator=g, dtype=F64)


def _chains(model: BayesianLinear, sweeps: int, seed: int = 0, burn: int = 200, by_chain: bool = False) -> torch.Tensor:
    """``[sweeps * R, d]`` Thompson draws of a batch of R chains (each ``sample`` is one sweep);
    ``by_chain``: ``[R, sweeps, d]``."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(burn):
        model.sample(g)
    draws = torch.stack([model.sample(g).clone() for _ in range(sweeps)])
    return draws.reshape(sweeps, -1, model.dim).transpose(0, 1) if by_chain else draws.reshape(-1, model.dim)


def _grid_moments(log_density, center, half_width, points: int = 301):
    """Mean and sd of a 2-d density known up to a constant, by quadrature on a regular grid."""
    a = torch.linspace(-1.0, 1.0, points, dtype=F64)
    g0 = center[0] + half_width[0] * a
    g1 = center[1] + half_width[1] * a
    W = torch.stack(torch.meshgrid(g0, g1, indexing="ij"), -1).reshape(-1, 2)
    lp = log_density(W)
    p = torch.exp(lp - lp.max())
    p = p / p.sum()
    mean = (p[:, None] * W).sum(0)
    sd = ((p[:, None] * (W - mean) ** 2).sum(0)).sqrt()
    return mean, sd


def _horseshoe_centred(d):
    def horseshoe():
        tau = pyro.sample("tau", dist.HalfCauchy(1.0))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d)).to_event(1))
        return pyro.sample("w", dist.Normal(0.0, tau * lam).to_event(1))

    return horseshoe


def _horseshoe_noncentred(d, global_scale=0.5):
    def horseshoe():
        tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(global_scale, dtype=F64)))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d, dtype=F64)).to_event(1))
        z = pyro.sample("z", dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1))
        return tau * lam * z

    return horseshoe


# ------------------------------------------------------------------------------ engine choice
def test_engine_is_chosen_from_the_prior():
    d = 3
    assert BayesianLinear(dist.Normal(0.0, 1.0).expand([d]).to_event(1), noise_std=1.0).engine_name == "conjugate"
    for prior in (dist.Laplace(0.0, 1.0).expand([d]).to_event(1), dist.StudentT(4.0, 0.0, 2.0).expand([d]).to_event(1),
                  dist.Cauchy(0.0, 1.0).expand([d]).to_event(1)):
        m = BayesianLinear(prior, noise_std=1.0)
        assert m.engine_name == "gibbs" and not m.conjugate and m.engine.method == "gibbs"
        assert BayesianLinear(prior, noise_std=1.0, inference="nuts").engine_name == "nuts"
        assert BayesianLinear(prior, noise_std=1.0, inference="svi").engine_name == "svi"
    for hs, scale in ((_horseshoe_centred(d), 1.0), (_horseshoe_noncentred(d, 0.5), 0.5)):
        m = BayesianLinear(hs, dim=d, noise_std=1.0)
        assert m.engine_name == "gibbs" and m.engine.prior.kind == "horseshoe"
        assert float(m.engine.prior.global_scale) == scale
    # NUTS options with inference='auto' keep the Pyro engine (old code keeps its meaning)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([d]).to_event(1), noise_std=1.0,
                       inference_options={"num_samples": 10, "warmup_steps": 10})
    assert m.engine_name == "nuts"

    def other():  # a callable that is not a horseshoe goes to the Langevin engine
        s = pyro.sample("s", dist.HalfCauchy(1.0))
        return pyro.sample("w", dist.Normal(0.0, s).expand([d]).to_event(1))

    assert recognise_prior(other, d, ()) is None
    assert BayesianLinear(other, dim=d, noise_std=1.0).engine_name == "langevin"
    assert BayesianLinear(other, dim=d, noise_std=1.0, inference="nuts").engine_name == "nuts"
    with pytest.raises(ValueError, match="prior: the Gibbs engine"):
        BayesianLinear(other, dim=d, noise_std=1.0, inference="gibbs")
    with pytest.raises(ValueError, match="inference_options"):
        BayesianLinear(dist.Laplace(0.0, 1.0).expand([d]).to_event(1), noise_std=1.0, inference="gibbs",
                       inference_options={"num_chains": 2})
    with pytest.raises(ValueError, match="inference_options: 'sweeps'"):
        BayesianLinear(dist.Laplace(0.0, 1.0).expand([d]).to_event(1), noise_std=1.0, inference_options={"sweeps": 0})


# ------------------------------------------------------------------------------ accuracy (fast)
def test_gibbs_with_a_gaussian_prior_reproduces_the_conjugate_posterior():
    X, y = _data(60, [0.8, -0.4, 0.1], 0.7, seed=1)
    prior = dist.MultivariateNormal(torch.tensor([0.2, 0.0, -0.1], dtype=F64),
                                    torch.tensor([[1.0, 0.3, 0.0], [0.3, 2.0, 0.1], [0.0, 0.1, 0.5]], dtype=F64))
    exact = BayesianLinear(prior, noise_std=0.7)
    exact.update(X, y)
    gibbs = BayesianLinear(prior, noise_std=0.7, inference="gibbs", batch_shape=[8])
    gibbs.update(X[None], y[None])
    draws = _chains(gibbs, 500)
    sd = exact.posterior_covariance.diagonal().sqrt()
    assert ((draws.mean(0) - exact.posterior_mean).abs() / sd).max() < 0.1
    assert ((draws.std(0) / sd) - 1).abs().max() < 0.1
    torch.testing.assert_close(torch.cov(draws.T), exact.posterior_covariance, atol=0.15 * float(sd.max()) ** 2, rtol=0)
    # the Rao-Blackwellised summaries are exact for a Gaussian prior
    torch.testing.assert_close(gibbs.posterior_mean[0], exact.posterior_mean, atol=1e-10, rtol=0)
    mean, var = gibbs.predict(X[None, :5].expand(8, 5, 3))
    emean, evar = exact.predict(X[:5])
    torch.testing.assert_close(mean[3], emean, atol=1e-10, rtol=0)
    torch.testing.assert_close(var[3], evar, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["laplace", "student-t", "cauchy"])
def test_scale_mixture_posterior_matches_quadrature(name):
    """Stationary mean within 0.1 posterior sd and sd within 10 % of the exact (grid) posterior, d = 2."""
    prior = {
        "laplace": dist.Laplace(torch.tensor([0.0, 0.5], dtype=F64), torch.tensor([0.3, 1.0], dtype=F64)).to_event(1),
        "student-t": dist.StudentT(3.0, torch.zeros(2, dtype=F64), 0.2).to_event(1),
        "cauchy": dist.Cauchy(torch.zeros(2, dtype=F64), torch.tensor(0.1, dtype=F64)).expand([2]).to_event(1),
    }[name]
    X, y = _data(30, [0.6, 0.05], 1.0, seed=2)  # few rows: the prior matters
    m = BayesianLinear(prior, noise_std=1.0, batch_shape=[16])
    assert m.engine_name == "gibbs"
    m.update(X[None], y[None])
    draws = _chains(m, 1500)

    def log_post(W):
        resid = y[None, :] - W @ X.T
        return -0.5 * (resid**2).sum(-1) + prior.log_prob(W)

    ls = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    mean, sd = _grid_moments(log_post, ls, torch.tensor([1.5, 1.5], dtype=F64))
    assert ((draws.mean(0) - mean).abs() / sd).max() < 0.1, (draws.mean(0), mean, sd)
    assert ((draws.std(0) / sd) - 1).abs().max() < 0.1, (draws.std(0), sd)


def test_noise_prior_posterior_matches_quadrature():
    """Unknown noise variance (InverseGamma prior, independent of w): grid over w with s2 integrated out."""
    X, y = _data(25, [0.5, -0.2], 0.8, seed=3)
    a0, b0 = 3.0, 2.0
    prior = dist.Laplace(0.0, 0.5).expand([2]).to_event(1)
    m = BayesianLinear(prior, noise_prior=dist.InverseGamma(a0, b0), batch_shape=[16])
    m.update(X[None], y[None])
    draws = _chains(m, 1500)

    def log_post(W):  # int IG(s2; a0, b0) N(y; Xw, s2) ds2 = const * (b0 + rss/2)^-(a0 + n/2)
        rss = ((y[None, :] - W @ X.T) ** 2).sum(-1)
        return -(a0 + len(y) / 2) * torch.log(b0 + rss / 2) + prior.log_prob(W)

    mean, sd = _grid_moments(log_post, torch.zeros(2, dtype=F64), torch.tensor([2.0, 2.0], dtype=F64))
    assert ((draws.mean(0) - mean).abs() / sd).max() < 0.1
    assert ((draws.std(0) / sd) - 1).abs().max() < 0.1


@pytest.mark.parametrize("form", ["centred", "non-centred"])
def test_horseshoe_without_data_samples_the_horseshoe_prior(form):
    """With no data the chain's stationary law is the prior: quantiles of |w_j| match Pyro's draws."""
    d = 3
    hs = _horseshoe_centred(d) if form == "centred" else _horseshoe_noncentred(d, 0.5)
    m = BayesianLinear(hs, dim=d, noise_std=1.0, batch_shape=[64])
    draws = _chains(m, 1500, burn=1000).abs().reshape(-1)  # no data: the global scale mixes slowly
    g = torch.Generator().manual_seed(0)
    N, s = 20000, 1.0 if form == "centred" else 0.5
    cauchy = lambda *shape: torch.tan(math.pi * (torch.rand(shape, generator=g, dtype=F64) - 0.5)).abs()
    ref = (s * cauchy(N, 1) * cauchy(N, d) * torch.randn(N, d, generator=g, dtype=F64)).abs().reshape(-1)
    q = torch.tensor([0.25, 0.5, 0.75], dtype=F64)
    ratio = torch.quantile(draws, q) / torch.quantile(ref, q)
    assert ((ratio - 1).abs() < 0.1).all(), ratio


def test_horseshoe_shrinks_and_keeps_the_signal():
    d = 6
    X, y = _data(40, [2.0, 0, 0, 0, 0, 0], 0.5, seed=4)
    m = BayesianLinear(_horseshoe_noncentred(d, 0.5), dim=d, noise_std=0.5)
    m.update(X, y)
    pm = m.posterior_mean
    ls = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    assert abs(float(pm[0]) - 2.0) < 0.2
    assert pm[1:].abs().mean() < 0.5 * ls[1:].abs().mean()


def test_inverse_gaussian_sampler_matches_its_cdf():
    """Kolmogorov distance to the exact IG(mean, shape) CDF (Chhikara & Folks 1989, eq. 2.4) below 0.01."""
    mean = torch.tensor([0.5, 2.0, 30.0, 1e6], dtype=F64).repeat(40000, 1)
    shape = torch.tensor([1.0, 4.0, 0.5, 2.0], dtype=F64).repeat(40000, 1)
    x = inverse_gaussian(mean, shape, torch.Generator().manual_seed(0))
    assert (x > 0).all() and torch.isfinite(x).all()
    x, _ = x.sort(0)
    mu, lam = mean[0], shape[0]
    r = torch.sqrt(lam / x)
    cdf = torch.special.ndtr(r * (x / mu - 1)) + torch.exp(2 * lam / mu) * torch.special.ndtr(-r * (x / mu + 1))
    emp = torch.arange(1, x.shape[0] + 1, dtype=F64)[:, None] / x.shape[0]
    assert (cdf - emp).abs().max() < 0.01


# ------------------------------------------------------------------------------ Thompson draws
def test_draws_are_warm_started_sweeps_not_refits():
    X, y = _data(50, [1.0, -1.0], 0.5, seed=5)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_std=0.5, inference_options={"sweeps": 3})
    g = torch.Generator().manual_seed(0)
    m.update(X, y)
    first = m.sample(g).clone()  # the data went from 0 to 50 rows: burn-in plus 3 sweeps
    second = m.sample(g).clone()
    assert not torch.equal(first, second)
    assert (first - torch.tensor([1.0, -1.0], dtype=F64)).abs().max() < 0.3
    # the same chain state and generator state give the same draw: the draw is a function of them
    m2 = BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_std=0.5, inference_options={"sweeps": 3})
    m2.update(X, y)
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(m2.sample(g2), first) and torch.equal(m2.sample(g2), second)
    # one more row: no burn-in, exactly `sweeps` sweeps
    calls = []
    sweep = m.engine.sweep
    m.engine.sweep = lambda *a, **k: (calls.append(1), sweep(*a, **k))
    m.update(X[:1], y[:1])
    m.sample(g)
    assert len(calls) == 3


def test_batched_chains_equal_single_runs_with_a_replication_rng():
    """Replication r of a batch equals a one-replication run (same per-replication seed)."""
    R, d = 3, 2
    seeds = replication_seeds(4, R)
    X, y = _data(R * 10, [0.5, -0.5], 0.5, seed=6)
    Xb, yb = X.reshape(R, 10, d), y.reshape(R, 10)
    ybin = (yb > 0).to(F64)
    for kind in ("laplace", "horseshoe", "probit", "logistic", "student-noise-prior"):
        def build(batch, kind=kind):
            if kind == "laplace":
                return BayesianLinear(dist.Laplace(0.0, 1.0).expand([d]).to_event(1), noise_std=0.5, batch_shape=batch)
            if kind == "horseshoe":
                return BayesianLinear(_horseshoe_centred(d), dim=d, noise_std=0.5, batch_shape=batch)
            if kind == "student-noise-prior":
                return BayesianLinear(dist.StudentT(3.0, 0.0, 1.0).expand([d]).to_event(1),
                                      noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=batch)
            return BayesianLinear(dist.Laplace(0.0, 1.0).expand([d]).to_event(1), likelihood=kind, batch_shape=batch)

        outcome = yb if kind in ("laplace", "horseshoe", "student-noise-prior") else ybin
        batched = build([R])
        rng = ReplicationRNG(seeds)
        out = []
        for t in range(10):
            batched.update(Xb[:, t], outcome[:, t])
            out.append(batched.sample_at(Xb, rng, key="reward"))
        for r in range(R):
            single = build([1])
            rng1 = ReplicationRNG(seeds[r: r + 1])
            for t in range(10):
                single.update(Xb[r: r + 1, t], outcome[r: r + 1, t])
                assert torch.equal(single.sample_at(Xb[r: r + 1], rng1, key="reward")[0], out[t][r]), (kind, r, t)


def test_counter_based_uniforms_are_uniform_and_separable():
    seeds = replication_seeds(1, 4)
    u = uniform_rows((4, 50000), ReplicationRNG(seeds), key="k")
    assert ((u > 0) & (u < 1)).all()
    torch.testing.assert_close(u.mean(1), torch.full((4,), 0.5, dtype=F64), atol=0.005, rtol=0)
    torch.testing.assert_close(u.var(1), torch.full((4,), 1 / 12, dtype=F64), atol=0.002, rtol=0)
    assert abs(float(torch.corrcoef(torch.stack([u[0, :-1], u[0, 1:]]))[0, 1])) < 0.02
    alone = uniform_rows((1, 50000), ReplicationRNG(seeds[2:3]), key="k")
    assert torch.equal(alone[0], u[2])


def test_the_model_learns_inside_simulate():
    """No extra argument: TS with a Laplace-prior model refits its chain at every decision."""
    from bayes_safe.envs import kazerouni2017_neurips
    from bayes_safe.policies import ThompsonSampling

    R, T = 4, 150
    env = kazerouni2017_neurips(replications=R, seed=0)
    model = BayesianLinear(dist.Laplace(0.0, 1.0).expand([4]).to_event(1), noise_std=1.0, batch_shape=[R])
    trace = simulate(ThompsonSampling(model), env, T, seed=1)
    assert model.engine_name == "gibbs" and int(model.engine.n) == T
    regret = trace.regret
    assert float(regret[-50:].mean()) < 0.5 * float(regret[:50].mean())


# ------------------------------------------------------------------------------ slow: NUTS references
_NUTS_CACHE: dict = {}


def _nuts_reference(key, model_fn, num_samples=3000, warmup=1000):
    """Posterior draws of the site "w" by a long NUTS run, computed once per test session."""
    if key not in _NUTS_CACHE:
        from pyro.infer import MCMC, NUTS

        pyro.set_rng_seed(0)
        mcmc = MCMC(NUTS(model_fn, target_accept_prob=0.9), num_samples=num_samples, warmup_steps=warmup,
                    disable_progbar=True)
        torch.set_num_threads(1)
        mcmc.run()
        _NUTS_CACHE[key] = mcmc.get_samples()["w"].to(F64)
    return _NUTS_CACHE[key]


def _nuts_data():
    return _data(200, [1.0, 0.0, -0.3, 0.05], 1.0, seed=10)


def _horseshoe_exact_moments(X, y, s, draws=400_000, seed=0, chunk=100_000):
    """Posterior mean and sd of w under w ~ N(0, diag(tau^2 lam^2)), tau ~ HalfCauchy(s), lam_j ~ HalfCauchy(1)
    and y ~ N(X w, 1), with w integrated out: importance sampling of (tau, lam) from their prior, weighted by
    the Gaussian marginal likelihood N(y; 0, I + X D X^T) (Woodbury and the determinant lemma on the d x d
    precision X^T X + D^-1). Exact up to Monte Carlo error: about 21,000 effective draws here, a standard error
    near 0.007 posterior sd, where a 1,000-draw NUTS run of the funnel was 0.09 sd off and took three minutes."""
    g = torch.Generator().manual_seed(seed)
    d = X.shape[1]
    XtX, b, yy = X.T @ X, X.T @ y, y @ y
    log_w, first, second = [], [], []
    for _ in range(draws // chunk):
        tau = s * torch.randn(chunk, generator=g, dtype=F64).abs() / torch.randn(chunk, generator=g, dtype=F64).abs()
        lam = torch.randn(chunk, d, generator=g, dtype=F64).abs() / torch.randn(chunk, d, generator=g, dtype=F64).abs()
        v = (tau[:, None] * lam).square().clamp_min(1e-30)  # the prior variances D, [chunk, d]
        L = torch.linalg.cholesky(XtX + torch.diag_embed(1 / v))
        m = torch.cholesky_solve(b[:, None].expand(chunk, d, 1), L)[..., 0]  # E[w | tau, lam, y]
        log_det = 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1) + v.log().sum(-1)  # log det(I + X D X^T)
        log_w.append(-0.5 * (yy - (b * m).sum(-1) + log_det))
        first.append(m)
        second.append(torch.cholesky_inverse(L).diagonal(dim1=-2, dim2=-1) + m.square())
    w = torch.softmax(torch.cat(log_w), 0)
    ess = float(1 / w.square().sum())
    mean = (w[:, None] * torch.cat(first)).sum(0)
    sd = ((w[:, None] * torch.cat(second)).sum(0) - mean.square()).sqrt()
    return mean, sd, ess


@pytest.mark.long
@pytest.mark.parametrize("name", ["laplace", "student-t", "horseshoe"])
def test_gaussian_likelihood_matches_a_long_nuts_run(name):
    X, y = _nuts_data()
    d = 4
    if name == "horseshoe":
        prior_arg = {"prior": _horseshoe_noncentred(d, 0.3), "dim": d}
        ref_mean, ref_sd, ess = _horseshoe_exact_moments(X, y, 0.3)
        assert ess > 10_000  # the reference itself is precise
        ref_mcse = ref_sd / math.sqrt(ess)  # (importance sampling: at most 0.01 sd)
    else:
        p = (dist.Laplace(torch.tensor(0.0, dtype=F64), 0.2) if name == "laplace"
             else dist.StudentT(torch.tensor(2.0, dtype=F64), 0.0, 0.1)).expand([d]).to_event(1)
        prior_arg = {"prior": p}

        def nuts_model(X, y):
            w = pyro.sample("w", p)
            pyro.sample("y", dist.Normal(X @ w, 1.0).to_event(1), obs=y)

        ref = _nuts_reference(name, lambda: nuts_model(X, y))
        ref_mean, ref_sd = ref.mean(0), ref.std(0)
        ref_mcse = mcse_of_mean(ref[None])
    m = BayesianLinear(**prior_arg, noise_std=1.0, batch_shape=[16])
    m.update(X[None], y[None])
    chains = _chains(m, 2000, burn=300, by_chain=True)  # [16, 2000, d]
    draws = chains.reshape(-1, d)
    # the check's own precision first: the difference's Monte Carlo error under a third of the bound
    mcse = (mcse_of_mean(chains) ** 2 + ref_mcse**2).sqrt()
    assert (mcse / ref_sd).max() < 0.1 / 3, f"the runs are too short to test a 0.1 sd bias: {mcse / ref_sd}"
    assert ((draws.mean(0) - ref_mean).abs() / ref_sd).max() < 0.1, (draws.mean(0), ref_mean, ref_sd)
    assert ((draws.std(0) / ref_sd) - 1).abs().max() < 0.1, (draws.std(0), ref_sd)


def test_a_thompson_draw_after_an_update_is_a_few_sweeps_not_a_refit():
    """100 updates, each followed by a draw: one sweep per draw, plus a short burn-in when the data
    have doubled (the cost is a fixed number of sweeps; the speed itself is in benchmarks/custom_priors.py)."""
    X, y = _data(100, [1.0, 0.0, -0.5, 0.2], 1.0, seed=8)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([4]).to_event(1), noise_std=1.0)
    g = torch.Generator().manual_seed(0)
    m.update(X[0], y[0])
    m.sample(g)
    engine, calls = m.engine, [0]
    sweep = engine.sweep

    def counted(*args, **kwargs):
        calls[0] += 1
        return sweep(*args, **kwargs)

    engine.sweep = counted
    for i in range(1, 100):
        m.update(X[i], y[i])
        m.sample(g)
    assert 99 <= calls[0] <= 99 + 20 * 8  # at most 7 doublings of the data between 1 and 100 rows
    assert math.isfinite(float(m.sample(g).sum()))


def test_gibbs_models_run_under_inference_mode_and_after_it():
    """needs_autograd is False: a loop may run the model under torch.inference_mode, and the
    model keeps working outside it afterwards (no in-place change of an inference tensor)."""
    X, y = _data(40, [0.5, -0.5], 0.5, seed=9)
    yb = (y > 0).to(F64)
    g = torch.Generator().manual_seed(0)
    models = [BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_std=0.5, batch_shape=[2]),
              BayesianLinear(_horseshoe_centred(2), dim=2, noise_std=0.5, batch_shape=[2]),
              BayesianLinear(dist.Normal(0.0, 1.0).expand([2]).to_event(1), likelihood="probit", batch_shape=[2]),
              BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), likelihood="logistic", batch_shape=[2])]
    for m in models:
        assert not m.needs_autograd
        out = y if m.likelihood == "gaussian" else yb
        with torch.inference_mode():
            for i in range(20):
                m.update(X[i].expand(2, 2), out[i].expand(2))
                m.sample_at(X[None, :5].expand(2, 5, 2), g)
        for i in range(20, 40):  # outside: updates (also growing the 0/1 data buffers) and draws
            m.update(X[i].expand(2, 2), out[i].expand(2))
            m.sample(g)
        mean, var = m.predict(X[None, :3].expand(2, 3, 2))
        assert torch.isfinite(mean).all() and (var > 0).all()
        m.fit()
    assert BayesianLinear(dist.Laplace(0.0, 1.0).expand([2]).to_event(1), noise_std=0.5, inference="svi").needs_autograd
    assert not BayesianLinear(dist.Normal(0.0, 1.0).expand([2]).to_event(1), noise_std=0.5).needs_autograd


def test_a_gibbs_model_learns_inside_simulate_shows_in_arviz_and_saves(tmp_path):
    from bayes_safe import ThompsonSampling
    from bayes_safe.diagnostics import to_inference_data
    from bayes_safe.envs import daulton2019
    from bayes_safe.state import save_state

    env = daulton2019(2, seed=0)
    model = BayesianLinear(dist.Laplace(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), noise_std=0.1,
                           batch_shape=[2])
    assert model.engine_name == "gibbs" and model.needs_autograd is False
    trace = simulate(ThompsonSampling(model), env, 60, seed=0)
    assert trace.regret[-20:].mean() < trace.regret[:20].mean()
    before = model.posterior_mean.clone()
    idata = to_inference_data(model, num_draws=50)
    assert idata.posterior["w"].shape[:2] == (4, 50)  # 4 independent copies of the chain by default
    assert torch.equal(model.posterior_mean, before)  # the diagnostics ran on a copy of the chain
    from bayes_safe.state import load_state

    save_state(model, tmp_path / "m")  # the chain resumes exactly: tests/test_chain_state.py
    assert load_state(tmp_path / "m").engine_name == "gibbs"
