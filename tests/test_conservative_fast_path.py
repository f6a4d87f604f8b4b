"""``ConservativeTS``'s one-stream fast path (issue 42 item 3): an unbatched ``PerArmLinear`` with its
kept moments decides and learns in numpy. What a user relies on: the same decisions as the general
path (``fast_path = False``) for the same seed, the same budget bookkeeping (the same numbers), a
copy or pickle mid-stream that carries on as the original, and the general path still there for
everything else (a mask, a batch, inputs to convert), in any order with the fast one."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.models import PerArmLinear, calibrated_per_arm
from bayes_safe.policies import ConservativeTS

F64 = torch.float64
K, P = 5, 4  # arms, raw features (a constant feature is appended)
STATE = ("budget", "explored", "fallbacks", "known", "deviations", "baseline_plays", "baseline_successes",
         "counterfactual")


def _data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(P, K))
    Z = rng.normal(size=(n, P))
    y = np.argmax(Z @ W + rng.gumbel(size=(n, K)), axis=1)
    baseline = np.argmax(Z[:, :2] @ W[:2], axis=1)  # a weaker classifier: the learner has room to explore
    return np.hstack([Z, np.ones((n, 1))]), y, baseline


def _policy(X, y, budget: str, fast: bool = True):
    cal = calibrated_per_arm(X[:40], labels=y[:40], num_arms=K)
    policy = ConservativeTS(cal.model, alpha=0.1, budget=budget, variance_scale=1 / cal.temperature)
    policy.fast_path = fast
    return policy


def _loop(policy, X, y, baseline, steps, seed, lag: int = 0, start: int = 40):
    """A user's loop (numpy rows, 0/1 rewards); ``lag`` decisions wait for their reward (first in, first out)."""
    g = torch.Generator().manual_seed(seed)
    actions, waiting = [], []
    for t in range(start, start + steps):
        x = torch.from_numpy(X[t])
        a = int(policy.select(x.expand(K, P + 1), int(baseline[t]), generator=g))
        actions.append(a)
        waiting.append((x, float(a == y[t]), a))
        while len(waiting) > lag:
            x0, r, a0 = waiting.pop(0)
            policy.update(x0, torch.tensor(r, dtype=F64), actions=a0)
    return actions


def _same_state(a, b):
    for name in STATE:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert len(a._pending) == len(b._pending)
    torch.testing.assert_close(a.model.posterior_mean, b.model.posterior_mean, rtol=0, atol=1e-12)


@pytest.mark.parametrize("budget", ["realised", "expected"])
@pytest.mark.parametrize("lag", [0, 3])
def test_the_fast_path_makes_the_general_paths_decisions_and_bookkeeping(budget, lag, monkeypatch):
    X, y, baseline = _data(260, 1)
    fast, general = _policy(X, y, budget), _policy(X, y, budget, fast=False)
    calls = []
    one = ConservativeTS._select_one
    monkeypatch.setattr(ConservativeTS, "_select_one", lambda self, *a: calls.append(1) or one(self, *a))
    a_fast = _loop(fast, X, y, baseline, 200, seed=3, lag=lag)
    assert len(calls) == 200  # every decision took the fast path ...
    a_general = _loop(general, X, y, baseline, 200, seed=3, lag=lag)
    assert len(calls) == 200  # ... and none of the general policy's
    assert a_fast == a_general
    _same_state(fast, general)
    assert 0 < int(fast.explored) < 200 and int(fast.fallbacks) > 0  # both branches of the check were taken


def test_a_wide_problem_the_bakeoffs_size_decides_the_same():
    """K = 26, d = 17 (the bake-off's learner at its size), the realised budget, 200 steps."""
    rng = np.random.default_rng(5)
    k, d, n = 26, 17, 460
    W = rng.normal(size=(d - 1, k))
    Z = rng.normal(size=(n, d - 1))
    y = np.argmax(Z @ W + rng.gumbel(size=(n, k)), axis=1)
    X = np.hstack([Z, np.ones((n, 1))])
    base = np.argmax(Z[:, :4] @ W[:4], axis=1)
    cal = calibrated_per_arm(X[:260], labels=y[:260], num_arms=k)
    out = []
    for fast in (True, False):
        policy = ConservativeTS(copy.deepcopy(cal.model), alpha=0.1, budget="realised",
                                variance_scale=1 / cal.temperature)
        policy.fast_path = fast
        g, actions = torch.Generator().manual_seed(0), []
        for t in range(260, n):
            x = torch.from_numpy(X[t])
            a = int(policy.select(x.expand(k, d), int(base[t]), generator=g))
            policy.update(x, float(a == y[t]), actions=a)
            actions.append(a)
        out.append((actions, policy))
    assert out[0][0] == out[1][0]
    _same_state(out[0][1], out[1][1])


def test_a_copy_or_pickle_mid_stream_carries_on_as_the_original():
    X, y, baseline = _data(300, 2)
    policy = _policy(X, y, "realised")
    _loop(policy, X, y, baseline, 80, seed=1, lag=2)  # two decisions pending
    copies = [copy.deepcopy(policy), pickle.loads(pickle.dumps(policy))]
    runs = [_loop(p, X, y, baseline, 100, seed=9, lag=2, start=120) for p in [policy, *copies]]
    assert runs[0] == runs[1] == runs[2]
    for other in copies:
        _same_state(policy, other)
        assert other.budget.data_ptr() != policy.budget.data_ptr()  # its own memory, not the original's


def test_the_paths_mix_in_any_order():
    """A fast decision settled by the general update (a reward to convert), a general decision (a mask)
    settled by the fast one, rows of their own per arm now and then: the same numbers as the general
    path throughout."""
    X, y, baseline = _data(200, 4)
    fast, general = _policy(X, y, "realised"), _policy(X, y, "realised", fast=False)
    shift = torch.linspace(-0.3, 0.3, K, dtype=F64)[:, None]
    for policy in (fast, general):
        g = torch.Generator().manual_seed(2)
        for t in range(40, 160):
            x = torch.from_numpy(X[t])
            features = x.expand(K, P + 1) + shift if t % 5 == 0 else x.expand(K, P + 1)
            valid = torch.ones(1, K, dtype=torch.bool) if t % 3 == 0 else None
            a = int(policy.select(features, int(baseline[t]), generator=g, valid=valid))
            r = float(a == y[t])
            policy.update(features[a].clone(), int(r) if t % 4 == 0 else r, actions=a)
    _same_state(fast, general)
    assert not fast._pending


def test_other_models_and_inputs_keep_the_general_path(monkeypatch):
    called = []
    monkeypatch.setattr(ConservativeTS, "_select_one", lambda self, *a: called.append(1))
    prior = dist.Normal(torch.zeros(3, dtype=F64), 1.0).to_event(1)
    x = torch.randn(3, dtype=F64)
    batched = ConservativeTS(PerArmLinear(prior, 4, noise_std=0.5, batch_shape=[1]), alpha=0.1)
    assert batched.select(x.expand(1, 4, 3), torch.tensor([2])).shape == (1,)
    nig = ConservativeTS(PerArmLinear(prior, 4, noise_prior=dist.InverseGamma(2.0, 1.0)), alpha=0.1)
    assert int(nig.select(x.expand(4, 3), 2)) == 2
    one = ConservativeTS(PerArmLinear(prior, 4, noise_std=0.5), alpha=0.1)
    assert int(one.select(x.expand(4, 3).float(), 2)) == 2                   # float32: converted by the general path
    assert int(one.select(x.expand(4, 3), np.int64(2))) == 2                  # a numpy baseline: likewise
    with pytest.raises(ValueError, match="features"):
        one.select(torch.full((4, 3), float("nan"), dtype=F64), 2)            # named by the general check
    assert not called
    one.select(x.expand(4, 3), torch.tensor(2))                               # a long tensor baseline: the fast path
    assert called == [1]



def test_a_copied_per_arm_model_keeps_its_moments_on_its_own_memory():
    """``PerArmLinear``'s kept moments are numpy views of its tensors: a deepcopy or pickle views the
    copy's tensors again (else the copy's rank-one updates would miss its covariance and ``eta``)."""
    X, y, baseline = _data(120, 6)
    policy = _policy(X, y, "expected")
    _loop(policy, X, y, baseline, 30, seed=0)
    for m in (copy.deepcopy(policy.model), pickle.loads(pickle.dumps(policy.model))):
        kept = m._marginal
        assert kept is not None and kept.describes(m.arms)
        assert np.shares_memory(kept.cov, kept.cov_t.numpy()) and np.shares_memory(kept.eta, m.arms.eta.numpy())
        assert np.shares_memory(kept.counts, m.arms._masked_count.numpy())
        x = torch.from_numpy(X[100])
        m.update(x, 1.0, actions=2)
        torch.testing.assert_close(m.posterior_covariance, torch.linalg.inv(m.arms.precision), rtol=0, atol=1e-10)
