"""The one-stream fast path of ``PerArmLinear`` (issue 32): kept covariances updated by
Sherman-Morrison, arm scores drawn from their marginals. What a user relies on: the same
posterior as the sufficient statistics say, the same law of decisions as a joint weight draw,
and no stale state when the arms change by any other route (another update path, a load, a
reused input buffer)."""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import ThompsonSampling
from bayes_safe.models import PerArmLinear
from bayes_safe.models import per_arm as per_arm_module
from bayes_safe.state import load_state, save_state

F64 = torch.float64
D, K = 6, 4


def _model(d=D, k=K, noise=0.4):
    prior = dist.Normal(torch.full((d,), 0.1, dtype=F64), 0.7).to_event(1)
    return PerArmLinear(prior, k, noise_std=noise)


def _exact(m):
    """Each arm's posterior mean and covariance from the sufficient statistics, by a fresh solve."""
    cov = torch.linalg.inv(m.arms.precision)
    return (cov @ m.arms.eta.unsqueeze(-1)).squeeze(-1), cov


def _play(m, steps, seed=0, policy=None):
    """A user's loop: numpy contexts, ``ThompsonSampling`` over the model, 0/1 rewards."""
    rng = np.random.default_rng(seed)
    policy = policy or ThompsonSampling(m)
    g = torch.Generator().manual_seed(seed)
    w = rng.normal(size=(K, D))
    for _ in range(steps):
        x = torch.from_numpy(rng.normal(size=D))
        a = int(policy.select(x.expand(K, D), generator=g))
        reward = float(rng.random() < 1 / (1 + np.exp(-float(w[a] @ x.numpy()))))
        policy.update(x, torch.tensor(reward, dtype=F64), actions=a)
    return policy


def test_the_kept_posterior_is_the_exact_one_after_many_rank_one_updates():
    m = _model()
    _play(m, 700)
    assert m._marginal is not None and m._marginal.updates == 700      # the fast path ran, no refresh yet
    cov, mean = m._marginal_state()
    exact_mean, exact_cov = _exact(m)
    np.testing.assert_allclose(mean, exact_mean.numpy(), atol=1e-10)
    np.testing.assert_allclose(cov, exact_cov.numpy(), atol=1e-10)
    assert int(m.arms.num_observations.sum()) == 700
    # the model's other views agree: sample() (a joint draw from the factor) has the exact mean
    draws = m.sample((4000,), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(draws.mean(0), exact_mean, atol=0.05)


def test_fast_updates_after_a_joint_draw_make_the_next_draw_from_the_new_posterior():
    """The played arms' factors are marked stale: a joint draw after fast updates is from the new
    posterior, not from the factor of the old one."""
    m = _model()
    m.sample((10,), generator=torch.Generator().manual_seed(0))          # the factor of the prior
    x = torch.ones(D, dtype=F64)
    for _ in range(30):
        m.update(x, torch.tensor(3.0, dtype=F64), torch.tensor(2))
    exact_mean, _ = _exact(m)
    draws = m.sample((4000,), generator=torch.Generator().manual_seed(1))
    assert float((exact_mean[2] - m.arms._prior_loc[2]).abs().max()) > 0.3   # arm 2 moved from the prior
    assert torch.allclose(draws.mean(0), exact_mean, atol=0.05)


def test_the_scores_have_the_law_of_a_joint_weight_draw():
    m = _model()
    _play(m, 200)
    rows = torch.randn(K, D, dtype=F64)                      # different rows per arm: the general product
    g = torch.Generator().manual_seed(3)
    scores = torch.stack([m.sample_at(rows, g) for _ in range(20000)])
    mean, var = m.predict(rows[None])                         # the policies' one-stream form [1, K, d]
    assert mean.shape == (1, K) and torch.equal(mean[0], m.predict(rows)[0])
    torch.testing.assert_close(scores.mean(0), mean[0], atol=0.02, rtol=0)
    torch.testing.assert_close(scores.var(0), var[0], atol=0.02, rtol=0.05)
    shared = torch.randn(D, dtype=F64).expand(K, D)         # one shared context (an expanded row)
    scores = torch.stack([m.sample_at(shared, g) for _ in range(20000)])
    mean, var = m.predict(shared[None])
    torch.testing.assert_close(scores.mean(0), mean[0], atol=0.02, rtol=0)
    torch.testing.assert_close(scores.var(0), var[0], atol=0.02, rtol=0.05)


def test_decisions_follow_the_law_of_the_general_path():
    """Action frequencies at one context: the fast path against the joint-draw path of a batch of
    one (``batch_shape=[1]``, which never takes the fast path), same posterior."""
    fast = _model()
    _play(fast, 150, seed=5)
    batched = PerArmLinear(fast.arms.prior, K, noise_std=0.4, batch_shape=[1])
    batched.arms.precision.copy_(fast.arms.precision[None])
    batched.arms.eta.copy_(fast.arms.eta[None])
    batched.arms._invalidate(None)
    x = torch.from_numpy(np.random.default_rng(9).normal(size=D))
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    n = 6000
    f = np.bincount([int(fast.sample_at(x.expand(K, D), g1).argmax()) for _ in range(n)], minlength=K) / n
    b = np.bincount([int(batched.sample_at(x.expand(1, K, D), g2).argmax()) for _ in range(n)], minlength=K) / n
    np.testing.assert_allclose(f, b, atol=0.03)


def test_other_routes_to_the_arms_are_seen():
    m = _model()
    _play(m, 50)
    # a batched update through the general path ([1, d] numpy rows with an int8 action) and a direct
    # update of the arms' model: the kept state is rebuilt, not reused
    m.update(np.ones((1, D)), np.array([1.0]), np.array([2], dtype=np.int8))
    exact_mean, _ = _exact(m)
    np.testing.assert_allclose(m._marginal_state()[1], exact_mean.numpy(), atol=1e-10)
    _play(m, 10, seed=1)
    m.arms.update(torch.ones(K, 1, D, dtype=F64), torch.zeros(K, 1, dtype=F64))
    exact_mean, exact_cov = _exact(m)
    np.testing.assert_allclose(m._marginal_state()[1], exact_mean.numpy(), atol=1e-10)
    np.testing.assert_allclose(m._marginal_state()[0], exact_cov.numpy(), atol=1e-10)


def test_a_reused_input_buffer_is_not_mistaken_for_the_selected_context():
    m = _model()
    _play(m, 20)
    buf = torch.zeros(D, dtype=F64)
    buf.copy_(torch.arange(D, dtype=F64))
    m.sample_at(buf.expand(K, D), torch.Generator().manual_seed(0))   # keeps S_k x of this context
    buf.copy_(-torch.arange(D, dtype=F64) / 3)                         # the user's buffer, refilled
    m.update(buf, torch.tensor(1.0, dtype=F64), torch.tensor(1))
    exact_mean, exact_cov = _exact(m)
    np.testing.assert_allclose(m._marginal_state()[1], exact_mean.numpy(), atol=1e-10)
    np.testing.assert_allclose(m._marginal_state()[0], exact_cov.numpy(), atol=1e-10)


def test_refresh_and_save_load_mid_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(per_arm_module, "REFRESH_EVERY", 25)
    m = _model()
    policy = _play(m, 60)
    assert m._marginal.updates < 25                                        # rebuilt from the precisions twice
    save_state(policy, tmp_path / "p")
    back = load_state(tmp_path / "p")
    torch.testing.assert_close(back.model.arms.precision, m.arms.precision)
    torch.testing.assert_close(back.model.arms.eta, m.arms.eta)
    # both continue on the same inputs with the same generator: the same decisions
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for i in range(30):
        x = torch.full((D,), 0.1 * i - 1.0, dtype=F64)
        a1, a2 = int(policy.select(x.expand(K, D), generator=g1)), int(back.select(x.expand(K, D), generator=g2))
        assert a1 == a2
        policy.update(x, torch.tensor(1.0, dtype=F64), actions=a1)
        back.update(x, torch.tensor(1.0, dtype=F64), actions=a2)


@pytest.mark.parametrize("bad", [
    (torch.full((D,), float("nan"), dtype=F64), torch.tensor(1.0, dtype=F64), 0, "contexts"),
    (torch.zeros(D, dtype=F64), torch.tensor(float("inf"), dtype=F64), 0, "y"),
    (torch.zeros(D, dtype=F64), torch.tensor(1.0, dtype=F64), K, "actions"),
    (torch.zeros(D, dtype=F64), torch.tensor(1.0, dtype=F64), torch.tensor(1.0), "actions"),
])
def test_bad_input_on_the_fast_path_is_named_and_changes_nothing(bad):
    m = _model()
    _play(m, 5)
    before = m.arms.precision.clone(), m.arms.eta.clone()
    x, y, a, name = bad
    with pytest.raises((ValueError, TypeError), match=name):
        m.update(x, y, a)
    assert torch.equal(m.arms.precision, before[0]) and torch.equal(m.arms.eta, before[1])


def test_models_outside_the_fast_path_keep_the_general_one():
    """Normal-Inverse-Gamma noise, forgetting and batches: no kept covariance, same results as before."""
    prior = dist.Normal(torch.zeros(D, dtype=F64), 1.0).to_event(1)
    for m in (PerArmLinear(prior, K, noise_prior=dist.InverseGamma(2.0, 1.0)),
              PerArmLinear(prior, K, noise_std=0.5, forgetting=0.99),
              PerArmLinear(prior, K, noise_std=0.5, batch_shape=[1])):
        shape = tuple(m.batch_shape)
        m.update(torch.ones(*shape, D, dtype=F64), torch.ones(shape, dtype=F64), torch.zeros(shape, dtype=torch.long))
        m.sample_at(torch.ones(*shape, K, D, dtype=F64), torch.Generator().manual_seed(0))
        assert m._marginal is None


def test_posterior_moments_are_exact_copies_a_caller_cannot_disturb():
    m = _model()
    _play(m, 120)
    mean, cov = m.posterior_mean, m.posterior_covariance
    exact_mean, exact_cov = _exact(m)
    torch.testing.assert_close(mean, exact_mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(cov, exact_cov, atol=1e-10, rtol=0)
    mean.zero_()
    cov.zero_()                                             # the caller's copies, not the model's state
    torch.testing.assert_close(m.posterior_mean, exact_mean, atol=1e-10, rtol=0)
