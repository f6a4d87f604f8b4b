"""``ConservativeTS(budget="realised")`` (issue 32): the cumulative budget on observed 0/1 rewards,
on a small classification stream written here (numpy), with a calibrated per-arm model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayes_safe.models import calibrated_per_arm
from bayes_safe.policies import ConservativeTS

K, P = 3, 4


def _data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    W = np.array([[2.0, 0.0, -1.0], [0.0, 2.0, 0.5], [-1.0, -1.0, 2.0], [0.5, 0.0, 0.0]])
    Z = rng.normal(size=(n, P))
    y = np.argmax(Z @ W + rng.gumbel(size=(n, K)), axis=1)
    return np.hstack([Z, np.ones((n, 1))]), y


def _run(seed: int, steps: int = 300, budget: str = "realised"):
    X, y = _data(steps + 40, seed)
    cal = calibrated_per_arm(X[:40], labels=y[:40], num_arms=K)
    policy = ConservativeTS(cal.model, alpha=0.1, budget=budget, variance_scale=1 / cal.temperature)
    g = torch.Generator().manual_seed(seed)
    baseline = np.argmax(X[40:, :P] @ np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 0.2], [0, 0, 0]]), axis=1)
    learner_r, base_r = [], []
    for t in range(steps):
        x = torch.as_tensor(X[40 + t])
        a = int(policy.select(x.expand(K, P + 1), int(baseline[t]), generator=g))
        r = float(a == y[40 + t])
        learner_r.append(r)
        base_r.append(float(baseline[t] == y[40 + t]))
        policy.update(x, r, actions=a)
    return policy, np.cumsum(learner_r), np.cumsum(base_r)


def test_the_realised_budget_holds_and_the_policy_explores():
    broken, explored = 0, 0
    for seed in range(3):
        policy, L, B = _run(seed)
        broken += int((L < 0.9 * B - 1e-9).sum())
        explored += int(policy.explored)
        assert int(policy.deviations) == int(policy.explored)  # every deviation's reward settled
        assert not policy._pending
    assert broken <= 9  # at most 1 % of the 900 steps
    assert explored > 150  # it does not freeze on the baseline


def test_the_settled_terms_add_up():
    policy, L, _ = _run(7, steps=60)
    # the known part: every reward the learner earned, less (1 - alpha) of those on baseline plays
    assert float(policy.known) <= float(L[-1]) + 1e-9
    assert float(policy.baseline_successes) <= float(L[-1]) + 1e-9
    assert int(policy.baseline_plays) + int(policy.deviations) == 60
    torch.testing.assert_close(policy.budget, torch.zeros_like(policy.budget))  # nothing pending


def test_bad_budget_arguments_are_named():
    X, y = _data(30, 0)
    model = calibrated_per_arm(X, labels=y, num_arms=K).model
    with pytest.raises(ValueError, match="budget: expected 'expected' or 'realised'"):
        ConservativeTS(model, budget="both")
    with pytest.raises(ValueError, match="variance_scale"):
        ConservativeTS(model, variance_scale=0.0)


def test_the_streaming_fast_path_keeps_the_budget_too():
    from bayes_safe.policies import StreamingConservativeTS, StreamingPerArmTS

    broken, explored = 0, 0
    for seed in range(3):
        X, y = _data(340, seed)
        cal = calibrated_per_arm(X[:40], labels=y[:40], num_arms=K)
        policy = StreamingConservativeTS(StreamingPerArmTS.from_calibrated(cal, seed=seed), alpha=0.1)
        baseline = np.argmax(X[40:, :P] @ np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 0.2], [0, 0, 0]]), axis=1)
        L = B = 0.0
        for t in range(300):
            x = X[40 + t]
            a = policy.select(x, int(baseline[t]))
            r = float(a == y[40 + t])
            L, B = L + r, B + float(baseline[t] == y[40 + t])
            broken += L < 0.9 * B - 1e-9
            policy.update(x, r, a)
        explored += policy.explored
        assert policy.deviations == policy.explored and policy.baseline_plays + policy.deviations == 300
    # the same check as ConservativeTS's, other random numbers: its few violations are early steps
    # (before a margin is earned) where a confident deviation lost; at most 2 % of the 900 steps here
    assert broken <= 18 and explored > 150
    with pytest.raises(TypeError, match="StreamingPerArmTS"):
        StreamingConservativeTS(object())
