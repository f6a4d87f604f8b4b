"""ProbitGP: weight-space posterior vs GPyTorch, vs a Laplace reference, sampling, views, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from bayes_safe.envs.video_upload import FEATURE_DIM, VideoUpload
from bayes_safe.models import ProbitGP, ScaledOutcome, SuccessProbability
from bayes_safe.models.probit_gp import holdout_rows
from bayes_safe.policies import TSASC, ThompsonSampling
from bayes_safe.threads import single_thread

SMALL = {"nn_epochs": 3, "nn_min_steps": 150, "refit_every": None}


def _logged(n: int, seed: int = 0):
    """``n`` uploads under uniformly random valid actions: (env, uploads, actions, X, y)."""
    env = VideoUpload(seed=seed)
    up = env.draw(n)
    g = torch.Generator().manual_seed(seed + 1)
    a = torch.rand(n, 4, generator=g, dtype=torch.float64).masked_fill(~up.valid, -1).argmax(-1)
    out = env.outcomes(up, a)
    return env, up, a, up.features[torch.arange(n), a], out.success.double()


@pytest.fixture(scope="module")
def fitted():
    with single_thread():
        env, _, _, X, y = _logged(6000)
        model = ProbitGP(FEATURE_DIM, seed=0, **SMALL)
        model.update(X, y)
        model.fit()
    return model, env, X, y


def test_weight_space_posterior_equals_gpytorch_predictive(fitted):
    model, env, _, _ = fitted
    test = env.draw(300).features  # [300, 4, 45]: batched input
    mean, var = model.predict(test)
    assert mean.dtype == torch.float64 and mean.shape == (300, 4)
    gm, gv = model.gp_predictive(test)
    assert torch.allclose(mean, gm, rtol=1e-9, atol=1e-10)
    assert torch.allclose(var, gv, rtol=1e-7, atol=1e-12)
    # the joint predictive covariance too, at a few points, straight from GPyTorch
    phi = model.features(test[:3].reshape(-1, FEATURE_DIM))
    model.gp.eval()
    with torch.no_grad():
        cov = model.gp(phi).covariance_matrix - model.gp.variational_strategy.jitter_val * torch.eye(12, dtype=torch.float64)
    assert torch.allclose(cov, phi @ model.weight_covariance @ phi.mT, rtol=1e-6, atol=1e-12)


def test_natural_gradient_fit_converged(fitted):
    model = fitted[0]
    info = model.fit_info
    assert info["polish_change"] < model.polish_tol
    assert info["polish_steps"] < model.polish_steps


def _laplace_probit(phi: torch.Tensor, y: torch.Tensor, prior_var: torch.Tensor, iters: int = 50):
    """Laplace approximation of Bayesian probit regression ``y ~ Bern(Phi(phi^T w))``, ``w ~ N(0, diag(v))``."""
    p = phi.shape[1]
    prec0 = torch.diag(1.0 / prior_var)
    w = torch.zeros(p, dtype=torch.float64)
    s = 2 * y - 1
    for _ in range(iters):
        f = phi @ w
        r = torch.exp(-0.5 * f * f - 0.5 * math.log(2 * math.pi) - torch.special.log_ndtr(s * f))
        grad = phi.T @ (s * r) - prec0 @ w
        hess = phi.T @ ((r * (s * f + r))[:, None] * phi) + prec0
        step = torch.linalg.solve(hess, grad)
        w = w + step
        if float(step.abs().max()) < 1e-12:
            break
    f = phi @ w
    r = torch.exp(-0.5 * f * f - 0.5 * math.log(2 * math.pi) - torch.special.log_ndtr(s * f))
    hess = phi.T @ ((r * (s * f + r))[:, None] * phi) + prec0
    return w, torch.linalg.inv(hess)


def test_predictive_variance_matches_laplace_reference(fitted):
    """Tolerance: predictive variances within 5% (median ratio within 1%), means within 0.02 + 2%.

    Both approximate the same posterior of a probit regression on the frozen learned features
    with the fitted prior ``Sigma_p``; with 6,000 observations and 5 weights the posterior is
    close to Gaussian, so the variational and Laplace answers should nearly agree (measured:
    variance ratios 0.9998-1.0004 at n = 6,000, 0.9992-1.0002 at n = 100,000). The
    unconverged Cholesky/Adam fit the issue describes overstated the variance ~100-fold.
    """
    model, env, X, y = fitted
    phi = model.features(X)
    prior_var = model.gp.covar_module.variance.detach().reshape(-1).expand(phi.shape[1])
    w_map, cov = _laplace_probit(phi, y, prior_var)
    test = model.features(env.draw(500).features.reshape(-1, FEATURE_DIM))
    var_ref = ((test @ cov) * test).sum(-1)
    mean_ref = test @ w_map
    mean, var = test @ model.weight_mean, ((test @ model.weight_covariance) * test).sum(-1)
    ratio = var / var_ref
    assert abs(float(ratio.median()) - 1) < 0.01, f"median variance ratio {float(ratio.median()):.4f}"
    assert float((ratio - 1).abs().max()) < 0.05, f"variance ratio range {float(ratio.min()):.4f}..{float(ratio.max()):.4f}"
    assert bool(((mean - mean_ref).abs() <= 0.02 + 0.02 * mean_ref.abs()).all())


def test_many_inducing_points_give_the_same_posterior():
    """M = 40 inducing points (data subset) vs the default M = p basis points: same model, same answer."""
    with single_thread():
        env, _, _, X, y = _logged(2000, seed=3)
        small = ProbitGP(FEATURE_DIM, seed=1, **SMALL)
        big = ProbitGP(FEATURE_DIM, seed=1, num_inducing=40, **SMALL)
        for m in (small, big):
            m.update(X, y)
            m.fit()
    test = env.draw(100).features
    mean_b, var_b = big.predict(test)
    gm, gv = big.gp_predictive(test)  # conversion exact for M > p as well
    assert torch.allclose(mean_b, gm, rtol=1e-6, atol=1e-8)
    assert torch.allclose(var_b, gv, rtol=1e-4, atol=1e-9)
    assert torch.equal(small.features(test), big.features(test))  # same network (same seed, same data)
    mean_s, var_s = small.predict(test)
    assert float((mean_s - mean_b).abs().max()) < 0.05
    assert float((var_s / var_b - 1).abs().max()) < 0.15


def test_sample_at_is_joint_over_candidates_and_matches_predict(fitted):
    model, env, _, _ = fitted
    one = env.draw(1).features  # [1, 4, 45]
    R = 20_000
    feats = one.expand(R, -1, -1)
    draws = model.sample_at(feats, torch.Generator().manual_seed(0))
    assert draws.shape == (R, 4) and draws.dtype == torch.float64
    mean, var = model.predict(one[0])
    phi = model.features(one[0])
    cov = phi @ model.weight_covariance @ phi.mT
    emp_cov = torch.cov(draws.T)
    sd = var.sqrt()
    assert bool(((draws.mean(0) - mean).abs() < 5 * sd / math.sqrt(R)).all())
    assert torch.allclose(emp_cov, cov, rtol=0.08, atol=0.08 * float(var.max()))
    # reproducible: the same generator seed gives the same draws
    again = model.sample_at(feats, torch.Generator().manual_seed(0))
    assert torch.equal(again, draws)


def test_decisions_never_send_batched_inputs_to_gpytorch(fitted, monkeypatch):
    model, env, _, _ = fitted
    feats = env.draw(2000).features

    def refuse(*args, **kwargs):  # pragma: no cover - fails the test if reached
        raise AssertionError("GPyTorch was called on a decision path")

    monkeypatch.setattr(type(model.gp), "__call__", refuse)
    assert model.sample_at(feats).shape == (2000, 4)
    assert model.predict(feats)[1].shape == (2000, 4)


def test_refits_every_n_observations_with_warm_start():
    with single_thread():
        _, _, _, X, y = _logged(900, seed=5)
        model = ProbitGP(FEATURE_DIM, seed=0, nn_epochs=1, nn_min_steps=20, refit_every=300, gp_epochs=1)
        before = model.network.body[0].weight.detach().clone()
        model.update(X[:200], y[:200])
        assert model.num_fits == 0
        model.update(X[200:350], y[200:350])
        assert model.num_fits == 1 and model.fit_info["n"] == 350
        after_first = model.network.body[0].weight.detach().clone()
        assert not torch.equal(before, after_first)
        model.update(X[350:500], y[350:500])
        assert model.num_fits == 1
        model.update(X[500:700], y[500:700])
        assert model.num_fits == 2 and model.fit_info["n"] == 700
        assert model.num_observations == 700


def test_same_seed_same_fit():
    with single_thread():
        _, _, _, X, y = _logged(800, seed=7)
        fits = []
        for _ in range(2):
            m = ProbitGP(FEATURE_DIM, seed=4, nn_epochs=1, nn_min_steps=30, refit_every=None, gp_epochs=1)
            m.update(X, y)
            m.fit()
            fits.append((m.weight_mean, m.weight_covariance))
    assert torch.equal(fits[0][0], fits[1][0]) and torch.equal(fits[0][1], fits[1][1])


def test_prior_before_any_fit_is_usable():
    m = ProbitGP(6, refit_every=None)
    draws = m.sample_at(torch.randn(10, 3, 6))
    assert draws.shape == (10, 3) and bool(torch.isfinite(draws).all())
    mean, var = m.predict(torch.randn(4, 6))
    assert torch.allclose(mean, torch.zeros(4, dtype=torch.float64), atol=1e-8) and bool((var > 0).all())


def test_tsasc_views_share_one_draw_and_one_update(fitted, monkeypatch):
    model, env, _, _ = fitted
    import copy

    m = copy.deepcopy(model)
    policy = TSASC(ScaledOutcome(m, env.reward_scale), SuccessProbability(m), alpha=0.01)
    calls = []
    original = ProbitGP.sample_at

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProbitGP, "sample_at", counting)
    up = env.draw(500)
    a = policy.select(up.features, up.baseline, generator=torch.Generator().manual_seed(0), valid=up.valid)
    assert len(calls) == 1, "reward and constraint must come from one joint draw"
    policy.select(up.features, up.baseline, valid=up.valid)
    assert len(calls) == 2, "a new decision must draw again"
    assert bool(up.valid[torch.arange(500), a].all())
    out = env.outcomes(up, a)
    n0 = m.num_observations
    policy.update(up.features[torch.arange(500), a], out.reward, out.success.double()[:, None], actions=a)
    assert m.num_observations == n0 + 500, "the shared model must record each observation once"


def test_tsasc_decision_uses_the_same_draw_for_reward_and_constraint(fitted):
    """With the shared draw, TS-ASC's choice is argmax of scale * Phi(f~) over the feasible set of the same f~."""
    model, env, _, _ = fitted
    up = env.draw(300)
    reward, success = ScaledOutcome(model, env.reward_scale), SuccessProbability(model)
    policy = TSASC(reward, success, alpha=0.02)
    a = policy.select(up.features, up.baseline, generator=torch.Generator().manual_seed(3), valid=up.valid)
    latent = model.sample_at(up.features, torch.Generator().manual_seed(3), key="reward")
    p = torch.special.ndtr(latent)
    rows = torch.arange(300)
    ok = (p >= 0.98 * p[rows, up.baseline][:, None]) & up.valid
    ok[rows, up.baseline] = True
    expected = (p * env.reward_scale).masked_fill(~ok, float("-inf")).argmax(-1)
    assert torch.equal(a, expected)


def test_thompson_sampling_with_scaled_outcome(fitted):
    model, env, _, _ = fitted
    import copy

    m = copy.deepcopy(model)
    ts = ThompsonSampling(ScaledOutcome(m, env.reward_scale))
    up = env.draw(400)
    a = ts.select(up.features, up.baseline, generator=torch.Generator().manual_seed(1), valid=up.valid)
    assert bool(up.valid[torch.arange(400), a].all())
    out = env.outcomes(up, a)
    ts.update(up.features[torch.arange(400), a], out.reward, actions=a)
    assert m.num_observations == model.num_observations + 400
    mean, var = ts.model.predict(up.features)
    assert mean.shape == (400, 4) and bool((mean <= env.reward_scale).all()) and bool((var >= 0).all())


# ---------------------------------------------------------------------- bad input
def test_bad_inputs_fail_with_clear_messages():
    m = ProbitGP(5, refit_every=None)
    with pytest.raises(ValueError, match="y: expected binary outcomes 0/1"):
        m.update(torch.randn(3, 5), torch.tensor([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="y: expected binary"):
        m.update(torch.randn(2, 5), torch.tensor([2.0, 1.0]))
    with pytest.raises(ValueError, match=r"X: expected shape \[\.\.\., 5\]"):
        m.update(torch.randn(3, 4), torch.ones(3))
    with pytest.raises(ValueError, match=r"features: expected shape \[\.\.\., 5\]"):
        m.sample_at(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match=r"features: expected shape \[\.\.\., 5\]"):
        m.predict(torch.randn(2, 6))
    with pytest.raises(ValueError, match="fit: no observations yet"):
        m.fit()
    with pytest.raises(ValueError, match="y: expected shape"):
        m.update(torch.randn(3, 5), torch.ones(2))
    with pytest.raises(ValueError, match="finite"):
        m.update(torch.full((1, 5), float("nan")), torch.ones(1))
    with pytest.raises(ValueError, match="input_dim"):
        ProbitGP(0)
    with pytest.raises(ValueError, match="num_inducing"):
        ProbitGP(5, num_inducing=3)
    with pytest.raises(TypeError, match="variance_prior"):
        ProbitGP(5, variance_prior="gamma")
    with pytest.raises(ValueError, match="scale: expected positive"):
        ScaledOutcome(m, [1.0, 0.0, 1.1])
    view = ScaledOutcome(m, [1.0, 1.02])
    with pytest.raises(ValueError, match="reward: expected 0 .failure. or scale"):
        view.update(torch.randn(2, 5), torch.tensor([1.0, 1.0]), actions=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="features: expected 2 candidate actions"):
        view.sample_at(torch.randn(4, 3, 5))
    assert m.num_observations == 0  # nothing half-recorded


def test_custom_prior_is_used():
    import gpytorch

    prior = gpytorch.priors.GammaPrior(5.0, 5.0)
    m = ProbitGP(5, variance_prior=prior, refit_every=None, ard=False)
    assert m.gp.covar_module.variance.numel() == 1
    assert any(p is prior for _, _, p, _, _ in m.gp.named_priors())


# ---------------------------------------------------------------------- refits (issue 16 item 7)
_CATEGORY_EFFECT = torch.linspace(-0.6, 0.6, 24, dtype=torch.float64)[torch.randperm(24, generator=torch.Generator().manual_seed(5))]


def _known_probit(n: int, seed: int):
    """A known probit problem, written here (not the library's simulator): ``(X [n, 36], y [n], p [n])``.

    Twelve standard-normal inputs, of which three matter (one through a ``tanh``), and a
    24-level categorical input, one-hot and skewed (rare levels are seen a few times in the
    first rows), with effects spread over +-0.6: ``p = Phi(f(x))``,
    ``f = 1 + 0.8 x0 - 0.6 x1 + 0.5 tanh(2 x2) + effect[category]``. The irrelevant inputs and
    the rare levels are what a network trained hundreds of epochs over the first rows memorises.
    """
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(n, 12, generator=g, dtype=torch.float64)
    level = torch.multinomial(torch.linspace(1.0, 0.05, 24), n, replacement=True, generator=g)
    X = torch.cat([dense, torch.nn.functional.one_hot(level, 24).double()], 1)
    f = 1.0 + 0.8 * dense[:, 0] - 0.6 * dense[:, 1] + 0.5 * torch.tanh(2 * dense[:, 2]) + _CATEGORY_EFFECT[level]
    p = torch.special.ndtr(f)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).double()
    return X, y, p


@pytest.mark.parametrize("seed", [0, 1])
def test_ten_warm_refits_are_within_1_5x_of_one_fit(seed):
    """10 warm refits every 500 rows vs one fit on the same 5,000 rows, default training settings.

    Error: mean |E[Phi(f)] - p| against the true success probability on 20,000 fresh points.
    Measured (seed 0 / 1): one fit 0.048 / 0.040, 10 warm refits 0.050 / 0.042 (ratios 1.03 / 1.05);
    before the fix, when every refit trained >= nn_min_steps = 500 steps from where the last
    one stopped: one fit 0.048 / 0.038, 10 warm refits 0.128 / 0.130 (2.6x / 3.4x).
    """
    X, y, _ = _known_probit(5000, seed)
    X_test, _, p_test = _known_probit(20_000, 100 + seed)
    with single_thread():
        one = ProbitGP(X.shape[1], seed=seed, refit_every=None)
        one.update(X, y)
        one.fit()
        warm = ProbitGP(X.shape[1], seed=seed, refit_every=500)
        for start in range(0, 5000, 500):
            warm.update(X[start:start + 500], y[start:start + 500])
    assert warm.num_fits == 10 and warm.fit_info["n"] == 5000
    # a warm refit trains at most nn_epochs passes (no step floor), stopped on the held-out slice
    assert warm.fit_info["nn_epochs_run"] <= warm.nn_epochs
    assert warm.fit_info["nn_holdout_rows"] == int(holdout_rows(5000, warm.nn_holdout).sum())
    err_one = float((one.predict_proba(X_test) - p_test).abs().mean())
    err_warm = float((warm.predict_proba(X_test) - p_test).abs().mean())
    assert err_warm <= 1.5 * err_one, f"10 warm refits: error {err_warm:.4f} vs one fit {err_one:.4f}"


def test_held_out_rows_keep_their_side_as_data_grows():
    small, big = holdout_rows(500, 0.1), holdout_rows(5000, 0.1)
    assert torch.equal(big[:500], small)  # a held-out row stays held out at every later refit
    assert abs(int(big.sum()) - 500) <= 2
    for start in range(0, 5000, 500):  # spread evenly over arrival order
        assert abs(int(big[start:start + 500].sum()) - 50) <= 2
    assert not bool(holdout_rows(100, 0.0).any())


def test_without_a_held_out_slice_a_fit_trains_its_whole_budget():
    X, y, _ = _known_probit(600, 3)
    with single_thread():
        m = ProbitGP(X.shape[1], seed=0, refit_every=None, nn_holdout=0.0, nn_epochs=2, nn_min_steps=10, gp_epochs=1)
        m.update(X, y)
        m.fit()
    assert m.fit_info["nn_holdout_rows"] == 0 and m.fit_info["nn_epochs_run"] == 4  # ceil(10 / 3) epochs of 3 steps
    with pytest.raises(ValueError, match="nn_holdout"):
        ProbitGP(4, nn_holdout=0.6)
    with pytest.raises(ValueError, match="nn_patience"):
        ProbitGP(4, nn_patience=0)


# ---------------------------------------------------------------------- replications (issue 16 item 8)
def test_a_replication_batch_is_refused_not_pooled(fitted):
    """A ProbitGP is one posterior: driven as R > 1 replications it refuses, naming ``replications``."""
    from bayes_safe import _validation
    from bayes_safe.random import ReplicationRNG

    model, env, _, _ = fitted
    import copy

    m = copy.deepcopy(model)
    n0 = m.num_observations
    up = env.draw(4)
    with pytest.raises(ValueError, match=r"replications: .*4 replications.*one posterior.*replications=1"):
        m.sample_at(up.features, ReplicationRNG([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="replications"):
        SuccessProbability(m).sample_at(up.features, ReplicationRNG([1, 2, 3, 4]))
    with _validation.trusted_inputs(), pytest.raises(ValueError, match="replications: .*one posterior"):
        m.update(up.features[:, 0], torch.ones(4, dtype=torch.float64))
    assert m.num_observations == n0
    # one replication is one stream: accepted
    assert m.sample_at(up.features[:1], ReplicationRNG([1])).shape == (1, 4)
    with _validation.trusted_inputs():
        m.update(up.features[:1, 0], torch.ones(1, dtype=torch.float64))
    assert m.num_observations == n0 + 1


def test_the_elbo_term_is_the_expected_log_probit_to_quadrature_accuracy():
    """The variational fit's data term ``E[log Phi(s f)]``, ``f ~ N(mu, sigma^2)``, ``s = 2 y - 1``, against
    an adaptive numerical integral (scipy) at means and sds a fit meets: within 1e-5 relative (the
    20-node Gauss-Hermite rule's own error, 2.3e-6 at a wide sd). GPyTorch's own ``BernoulliLikelihood``,
    whose ``log_normal_cdf`` is off by 1.9e-3 at ``f = -1``, misses the same integrals by up to 3e-4.
    The model's term keeps a finite gradient in the far tail (``mu = -30``)."""
    import gpytorch
    from scipy import integrate, special

    ours, theirs = ProbitGP(3, seed=0).likelihood, gpytorch.likelihoods.BernoulliLikelihood().double()
    mu = torch.tensor([-30.0, -4.0, -1.0, 0.0, 0.3, 2.0, 6.0], dtype=torch.float64, requires_grad=True)
    sd = torch.tensor([0.05, 0.5, 0.2, 1.0, 2.0, 0.7, 0.1], dtype=torch.float64)
    worst = {"ours": 0.0, "theirs": 0.0}
    for label in (0.0, 1.0):
        y = torch.full_like(sd, label)
        dist = gpytorch.distributions.MultivariateNormal(mu, torch.diag(sd ** 2))
        s = 2 * label - 1
        truth = torch.tensor([integrate.quad(
            lambda f, m=m, v=v, s=s: special.log_ndtr(s * f) * math.exp(-0.5 * ((f - m) / v) ** 2) / (v * math.sqrt(2 * math.pi)),
            m - 12 * v, m + 12 * v, epsabs=1e-12, epsrel=1e-12)[0] for m, v in zip(mu.tolist(), sd.tolist())])
        for name, lik in (("ours", ours), ("theirs", theirs)):
            term = lik.expected_log_prob(y, dist)
            err = float(((term.detach() - truth).abs() / truth.abs().clamp_min(1e-12)).max())
            worst[name] = max(worst[name], err)
        (grad,) = torch.autograd.grad(ours.expected_log_prob(y, dist).sum(), mu)
        assert bool(torch.isfinite(grad).all())
    assert worst["ours"] < 1e-5, worst
    assert worst["theirs"] > 1e-4, worst  # what the model no longer uses
