"""ConservativeTS (issue 32): Thompson sampling that keeps Kazerouni et al.'s cumulative budget,
on problems written here (a per-arm stream of numpy contexts; fixed arms), one stream and batched."""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.envs import kazerouni2017_neurips
from bayes_safe.models import BayesianLinear, PerArmLinear
from bayes_safe.online import Decider
from bayes_safe.policies.conservative import ConservativeTS

F64 = torch.float64
ARMS = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])  # true weights, one row per arm


def _prior(d: int = 3):
    return dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1)


def _stream(seed: int, steps: int, alpha: float = 0.1):
    """One stream of contexts; the learner's and the baseline's cumulative expected rewards per step."""
    rng = np.random.default_rng(seed)
    policy = ConservativeTS(PerArmLinear(_prior(), 4, noise_std=0.5), alpha=alpha)
    g = torch.Generator().manual_seed(seed)
    learner, base = [], []
    total_l = total_b = 0.0
    for _ in range(steps):
        x = rng.normal(size=3) + np.array([1.0, 0.5, 0.2])
        means = ARMS @ x
        a = int(policy.select(np.tile(x, (4, 1)), baseline=2, generator=g).reshape(-1)[0])
        total_l, total_b = total_l + means[a], total_b + means[2]
        learner.append(total_l)
        base.append(total_b)
        policy.update(x, float(means[a] + 0.5 * rng.normal()), actions=a)
    return policy, np.array(learner), np.array(base)


def test_one_stream_keeps_the_budget_at_every_step_and_leaves_the_baseline():
    for seed in range(4):
        policy, learner, base = _stream(seed, 600)
        assert np.all(learner >= 0.9 * base - 1e-9), f"seed {seed}: the budget broke at step {np.argmin(learner - 0.9 * base)}"
        assert int(policy.explored) > 300  # it does not freeze on the baseline
        assert learner[-1] > base[-1]  # and ends ahead of it (arm 0 or 1 beats the baseline arm here)


def test_batched_fixed_arms_keep_the_budget_per_replication():
    env = kazerouni2017_neurips(replications=6, seed=1)
    R = env.replications
    policy = ConservativeTS(BayesianLinear(_prior(4), noise_std=1.0, batch_shape=[R]), alpha=0.1)
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(R)
    reward = env.expected[..., 0]                                          # [R, K]
    learner = torch.zeros(R, dtype=F64)
    base = torch.zeros(R, dtype=F64)
    broken = 0
    for _ in range(400):
        units = env.step()
        a = policy.select(units.features, units.baseline, generator=g)
        learner += reward[rows, a]
        base += reward[rows, units.baseline]
        broken += int((learner < 0.9 * base).sum())
        y = reward[rows, a] + env.noise_std[0] * torch.randn(R, generator=g, dtype=F64)
        policy.update(units.features[rows, a], y, actions=a)
    assert broken == 0
    assert bool((policy.explored > 0).all()) and float(learner.sum()) > float(base.sum())


def test_a_query_commits_nothing_and_the_decider_commits_the_played_draw():
    policy = ConservativeTS(PerArmLinear(_prior(), 4, noise_std=0.5), alpha=0.5)
    x = np.tile([1.0, 0.5, 0.2], (4, 1))
    for _ in range(50):  # some budget from baseline plays and their rewards
        policy.update(x[0], 0.6, actions=2)
        policy.select(x, baseline=2)
    before = policy.budget.clone()
    probs, _ = policy.action_probabilities(x, baseline=2, num_draws=64, seed=0)
    assert torch.equal(policy.budget, before) and abs(float(probs.sum()) - 1) < 1e-9
    decider = Decider(policy, num_draws=32, seed=0)
    d = decider.decide(x, baseline=2)
    step = policy.budget - before
    expected = policy._delta(torch.as_tensor(x)[None], torch.tensor([d.action]), torch.tensor([2]))[0]
    torch.testing.assert_close(step, expected)  # exactly one decision's worth, the played one's


def test_bad_models_and_arguments_are_named():
    with pytest.raises(ValueError, match="model: ConservativeTS checks its budget on a Gaussian posterior"):
        ConservativeTS(BayesianLinear(dist.Laplace(torch.zeros(3, dtype=F64), 1.0).to_event(1), noise_std=1.0))
    with pytest.raises(ValueError, match="alpha"):
        ConservativeTS(BayesianLinear(_prior(), noise_std=1.0), alpha=1.5)
    with pytest.raises(ValueError, match="confidence: expected a probability in"):
        ConservativeTS(BayesianLinear(_prior(), noise_std=1.0), confidence=0.4)
    with pytest.raises(ValueError, match="baseline: ConservativeTS needs"):
        ConservativeTS(BayesianLinear(_prior(), noise_std=1.0)).select(np.eye(3))
