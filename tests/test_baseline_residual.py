"""``bayes_safe.models.baseline_residual`` (issue 44): a per-arm model whose prior mean is the baseline
classifier, its torch and numpy forms, and ``ConservativeTS``'s win check (``min_win_probability``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayes_safe import ThompsonSampling
from bayes_safe.models.baseline_residual import baseline_residual, residual_features
from bayes_safe.policies import ConservativeTS, StreamingConservativeTS, StreamingPerArmTS


def _data(n=120, K=3, p=4, seed=0):
    """Rows with a constant, labels, and a softmax 'baseline' of a noisy linear score."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(p, K))
    X = rng.normal(size=(n, p))
    logits = X @ W
    y = np.array([rng.choice(K, p=np.exp(r) / np.exp(r).sum()) for r in logits])
    noisy = logits + rng.normal(scale=1.0, size=logits.shape)
    P = np.exp(noisy) / np.exp(noisy).sum(1, keepdims=True)
    return np.hstack([X, np.ones((n, 1))]), y, P


def test_features_and_the_prior_mean_is_the_baseline():
    X, y, P = _data()
    F = residual_features(X[:5], P[:5])
    assert F.shape == (5, 3, 6)
    np.testing.assert_array_equal(F[:, 1, :5], X[:5])
    np.testing.assert_array_equal(F[:, :, -1], P[:5])
    res = baseline_residual(X, P, labels=y)
    assert res.prior_mean[-1] == 1.0 and res.prior_scale[-1] == 0.25 and res.dim == 6 and res.num_arms == 3
    mean, _cov = res.posterior()   # warm_posterior=False: the prior
    np.testing.assert_allclose(mean, np.tile(res.prior_mean, (3, 1)), atol=1e-12)
    # before any data every arm's mean reward is the baseline's probability (plus the small residual mean)
    scores = (F[0] * mean).sum(-1)
    np.testing.assert_allclose(scores, P[0] + X[0] @ res.prior_mean[:-1], atol=1e-12)
    assert np.abs(X[0] @ res.prior_mean[:-1]).max() < 0.1
    # the residual's prior sd is the reward fit's, wider than the residual fit's
    narrow = baseline_residual(X, P, labels=y, scale_from="residuals")
    assert res.prior_scale[0] > narrow.prior_scale[0]
    with pytest.raises(ValueError):
        baseline_residual(X, P[:, :1], labels=y)
    with pytest.raises(ValueError):
        baseline_residual(X, P, labels=y, scale_from="other")


def test_warm_posterior_is_every_arm_updated_with_every_row():
    X, y, P = _data(n=40)
    res = baseline_residual(X, P, labels=y, warm_posterior=True)
    prior = baseline_residual(X, P, labels=y)
    ts = StreamingPerArmTS.from_residual(prior, seed=0)
    F = residual_features(X, P)
    for i in range(len(y)):
        for k in range(3):
            ts.update(F[i], float(y[i] == k), k)
    mean, cov = res.posterior()
    np.testing.assert_allclose(ts.mean, mean, atol=1e-8)
    np.testing.assert_allclose(ts.covariance, cov, atol=1e-8)


def test_torch_and_numpy_forms_hold_the_same_posterior_and_draw_the_same_law():
    X, y, P = _data()
    res = baseline_residual(X, P, labels=y, warm_posterior=True, temperature=0.5)
    model, ts = res.model(), StreamingPerArmTS.from_residual(res, seed=1)
    F = residual_features(X[0], P[0])
    mean_t, var_t = model.predict(torch.from_numpy(F))
    mean, cov = res.posterior()
    np.testing.assert_allclose(mean_t.numpy(), (F * mean).sum(-1), atol=1e-10)
    # the torch model holds the tempered posterior: T times the calibrated variance
    np.testing.assert_allclose(var_t.numpy(), 0.5 * np.einsum("ki,kij,kj->k", F, cov, F), rtol=1e-8)
    # the decisions' law: action frequencies of 3000 draws each, within sampling error
    policy, g = ThompsonSampling(model), torch.Generator().manual_seed(0)
    Ft = torch.from_numpy(F)
    a = np.bincount([int(policy.select(Ft, generator=g)) for _ in range(3000)], minlength=3) / 3000
    b = np.bincount([ts.select(F) for _ in range(3000)], minlength=3) / 3000
    assert np.abs(a - b).max() < 0.05


def test_conservative_torch_and_numpy_make_the_same_decisions():
    """At a tiny temperature the proposal is the posterior mean's argmax in both forms, so the two
    checks (budget and win, on the calibrated posterior) must agree step by step."""
    X, y, P = _data(n=260, seed=3)
    P = 0.6 * P + 0.4 / 3   # a weak baseline: proposals differ from it
    w = 60
    res = baseline_residual(X[:w], P[:w], labels=y[:w], temperature=1e-8)
    for q, exclusive in ((None, False), (0.6, False), (None, True), (0.6, True)):
        kw = {"min_win_probability": q, "exclusive_rewards": exclusive}
        torch_policy = ConservativeTS(res.model(), alpha=0.1, budget="realised",
                                      variance_scale=1.0 / res.temperature, **kw)
        general = ConservativeTS(res.model(), alpha=0.1, budget="realised", variance_scale=1.0 / res.temperature, **kw)
        general.fast_path = False
        numpy_policy = StreamingConservativeTS(StreamingPerArmTS.from_residual(res, seed=0), alpha=0.1, **kw)
        g, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
        moved = 0
        for t in range(w, len(y)):
            F = residual_features(X[t], P[t])
            b = int(P[t].argmax())
            a_t = int(torch_policy.select(torch.from_numpy(F), b, generator=g))
            a_g = int(general.select(torch.from_numpy(F), b, generator=g2))
            a_n = numpy_policy.select(F, b)
            assert a_t == a_n == a_g, t
            r = float(y[t] == a_t)
            for pol in (torch_policy, general):
                pol.update(torch.from_numpy(F[a_t]), torch.tensor(r, dtype=torch.float64), actions=a_t)
            numpy_policy.update(F, r, a_n)
            moved += a_t != b
        assert moved > 5
        assert int(torch_policy.explored) == numpy_policy.explored == int(general.explored)
        assert int(torch_policy.vetoes) == numpy_policy.vetoes == int(general.vetoes)
        assert float(torch_policy.deviation_rewards) == numpy_policy.deviation_rewards == float(general.deviation_rewards)
        if q is not None:
            assert numpy_policy.vetoes > 0   # q = 0.6 turned some proposals down


def test_exclusive_rewards_charge_every_lost_deviation_as_a_baseline_win():
    """Exclusive rewards (one action pays): the deviations' term is (1 - alpha) x (deviations - their rewards),
    in the torch general path, its fast path and the numpy form alike, whatever the model says."""
    X, y, P = _data(n=40, K=2, seed=1)
    res = baseline_residual(X[:20], P[:20], labels=y[:20], temperature=1e-8)
    pols = [ConservativeTS(res.model(), alpha=0.1, budget="realised", variance_scale=1e8, exclusive_rewards=True)
            for _ in range(2)]
    pols[1].fast_path = False
    stream = StreamingConservativeTS(StreamingPerArmTS.from_residual(res, seed=0), alpha=0.1, exclusive_rewards=True)
    F = residual_features(X[20], P[20])
    # settle two deviations by hand (one lost, one won) and three baseline plays (two won)
    for moved, r in ((True, 0.0), (True, 1.0), (False, 1.0), (False, 1.0), (False, 0.0)):
        for pol in pols:
            pol._pending.append(pol._pending_tensors((((0, F[0]),), moved, 1, F[1].copy())))
            pol.update(torch.from_numpy(F[0]), torch.tensor(r, dtype=torch.float64), actions=0)
        stream._pending.append((moved, 1, np.zeros((2, F.shape[1])), F[1].copy()))
        stream.update(F, r, 0)
    for pol in pols:
        assert int(pol.deviations) == 2 and float(pol.deviation_rewards) == 1.0
        mean, cov = pol._moments()
        np.testing.assert_allclose(pol._counterfactual_cost(mean, cov).numpy(), [0.9])
    assert stream.deviations == 2 and stream.deviation_rewards == 1.0
    assert stream._counterfactual_cost() == pytest.approx(0.9)
    with pytest.raises(ValueError):
        ConservativeTS(res.model(), budget="expected", exclusive_rewards=True)
    with pytest.raises(TypeError):
        StreamingConservativeTS(StreamingPerArmTS.from_residual(res), exclusive_rewards=1)


def test_the_win_check_turns_down_a_proposal_the_posterior_does_not_favour():
    """Budget ample; the proposal's calibrated P(win) is about 0.7: played at q = 0.5, not at q = 0.9;
    the general (torch) path and the fast path agree."""
    import pyro.distributions as dist

    from bayes_safe.models import PerArmLinear

    def policy(q, fast):
        prior = dist.Normal(torch.zeros(2, dtype=torch.float64), 1.0).to_event(1)
        m = PerArmLinear(prior, 2, noise_std=0.5)
        pol = ConservativeTS(m, alpha=0.1, budget="expected", min_win_probability=q)
        pol.fast_path = fast
        x0 = torch.tensor([1.0, 0.0], dtype=torch.float64)
        for _ in range(200):                                 # the baseline (arm 0) pays 1 at x0: a large margin
            pol.select(x0.expand(2, 2), 0)
            pol.update(x0, torch.tensor(1.0, dtype=torch.float64), actions=0)
        return pol

    x = torch.tensor([0.0, 1.0], dtype=torch.float64).expand(2, 2)   # arm 0 unknown here too: N(0, 1) each
    for fast in (True, False):
        pol = policy(None, fast)
        # arm 1 learns a small win at x: mean above arm 0's, uncertain
        for r in (1.0, 0.0, 1.0):
            pol.model.update(torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor(r, dtype=torch.float64),
                             actions=1)
        mean, var = pol.model.predict(x)
        z = float((mean[1] - mean[0]) / (var[0] + var[1]).sqrt())
        assert 0.2 < z < 1.2   # P(win) between 0.58 and 0.88
        outcomes = {}
        for q in (0.5, 0.95):
            p2 = policy(q, fast)
            for r in (1.0, 0.0, 1.0):
                p2.model.update(torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor(r, dtype=torch.float64),
                                actions=1)
            g = torch.Generator().manual_seed(5)
            picks = [int(p2.select(x, 0, generator=g)) for _ in range(50)]
            outcomes[q] = (sum(picks), int(p2.vetoes), int(p2.fallbacks))
        assert outcomes[0.5][0] > 0 and outcomes[0.95][0] == 0
        assert outcomes[0.95][1] > 0      # turned down by the win check (the budget may turn others down)
        assert outcomes[0.5][1] < outcomes[0.95][1]
    with pytest.raises(ValueError):
        ConservativeTS(pol.model, min_win_probability=1.0)
    with pytest.raises(ValueError):
        StreamingConservativeTS(StreamingPerArmTS.from_residual(baseline_residual(*_data()[::2], labels=_data()[1])), min_win_probability=0.0)


def test_streaming_learn_batch_and_to_model_with_one_prior_sd_per_weight():
    X, y, P = _data(n=30)
    res = baseline_residual(X, P, labels=y)
    ts, rows = StreamingPerArmTS.from_residual(res, seed=0), StreamingPerArmTS.from_residual(res, seed=0)
    F = residual_features(X, P)
    actions = np.arange(30) % 3
    rewards = (y == actions).astype(float)
    ts.learn_batch(F, rewards, actions)
    for f, r, a in zip(F, rewards, actions):
        rows.update(f, r, a)
    np.testing.assert_allclose(ts.mean, rows.mean, atol=1e-9)
    np.testing.assert_allclose(ts.covariance, rows.covariance, atol=1e-9)
    assert ts.counts.tolist() == [10, 10, 10]
    model = ts.to_model()
    mean_t, _ = model.predict(torch.from_numpy(F[0]))
    np.testing.assert_allclose(mean_t.numpy(), (F[0] * ts.mean).sum(-1), atol=1e-9)
