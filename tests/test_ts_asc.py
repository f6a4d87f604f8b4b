"""TS-ASC (Daulton et al. 2019, Algorithm 1)."""

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import simulate
from bayes_safe.envs import LinearBandit, daulton2019
from bayes_safe.factory import make_policy
from bayes_safe.models import BayesianLinear
from bayes_safe.policies import TSASC
from bayes_safe.random import ReplicationRNG, replication_seeds


def _model(R, d, loc=0.0, scale=1.0, noise=0.1):
    return BayesianLinear(dist.Normal(loc, scale).expand([d]).to_event(1), noise_std=noise, batch_shape=[R])


def _certain(env, metric, noise=1e-4):
    """A posterior that has seen every arm's exact expected outcome with tiny noise: near-certain."""
    m = _model(env.replications, env.dim, noise=noise)
    m.update(env.arm_features, env.expected[..., metric])
    return m


# ---------------------------------------------------------------- the feasible set
def test_feasible_set_is_the_sampled_constraint_check_plus_the_baseline():
    env = daulton2019(replications=12, seed=0, alpha=0.05)
    R = env.replications
    seeds = replication_seeds(3, R)
    policy = TSASC(_model(R, env.dim), _model(R, env.dim), alpha=0.05)
    ok = policy.feasible(env.arm_features, env.baseline_action, ReplicationRNG(seeds))
    fc = policy.constraint_models[0].sample_at(env.arm_features, ReplicationRNG(seeds), key="constraint0")
    rows = torch.arange(R)
    expected = fc >= 0.95 * fc[rows, env.baseline_action][:, None]
    expected[rows, env.baseline_action] = True
    assert torch.equal(ok, expected)


def test_baseline_is_always_feasible_even_when_it_fails_its_own_sampled_check():
    # a prior centred on negative constraint values: f~(b) < 0, so (1 - alpha) f~(b) > f~(b)
    env = daulton2019(replications=10, seed=1, alpha=0.3)
    R, rows = env.replications, torch.arange(env.replications)
    policy = TSASC(_model(R, env.dim), _model(R, env.dim, loc=-3.0, scale=0.01), alpha=0.3)
    gen = ReplicationRNG(replication_seeds(0, R))
    for _ in range(20):
        fc_b = policy.constraint_models[0].sample_at(env.arm_features, ReplicationRNG(replication_seeds(9, R)),
                                                     key="constraint0")[rows, env.baseline_action]
        ok = policy.feasible(env.arm_features, env.baseline_action, gen)
        assert ok[rows, env.baseline_action].all()
    assert (fc_b < 0).any()  # the situation the rule is for did occur
    # and when the step's valid mask leaves it out, the baseline is still playable
    valid = torch.zeros(R, env.num_arms, dtype=torch.bool)
    a = policy.select(env.arm_features, env.baseline_action, gen, valid=valid)
    assert torch.equal(a, env.baseline_action)


def test_baseline_is_feasible_over_a_whole_run():
    env = daulton2019(replications=8, seed=2, alpha=0.01)
    policy = make_policy("ts-asc", env)
    rows = torch.arange(8)
    seen = []

    def check(t, info):
        ok = policy.feasible(env.arm_features, env.baseline_action, torch.Generator().manual_seed(t))
        seen.append(bool(ok[rows, env.baseline_action].all()))

    simulate(policy, env, 40, seed=3, callback=check)
    assert all(seen) and len(seen) == 40


# ---------------------------------------------------------------- near-certain posterior
@pytest.mark.parametrize("alpha", [0.1, 0.01, 0.0001])
def test_near_certain_posterior_picks_the_best_truly_feasible_action(alpha):
    env = daulton2019(replications=40, seed=4, alpha=alpha)
    policy = TSASC(_certain(env, 0), [_certain(env, 1)], alpha=alpha)
    gen = ReplicationRNG(replication_seeds(5, env.replications))
    for _ in range(3):
        a = policy.select(env.arm_features, env.baseline_action, gen)
        assert torch.equal(a, env.optimal_action)
    # the best feasible arm is not the best arm (the problem is built so), so the constraint bites
    assert (env.expected[..., 0].argmax(-1) != env.optimal_action).all()


def test_several_constraint_metrics_with_one_alpha_each():
    gen = torch.Generator().manual_seed(6)
    R, K, d = 30, 40, 5
    arms = torch.randn(R, K, d, generator=gen, dtype=torch.float64).abs()
    params = torch.randn(R, 3, d, generator=gen, dtype=torch.float64)
    params[:, 1:] = params[:, 1:].abs()  # constraint metrics positive
    baseline = torch.randint(0, K, (R,), generator=gen)
    env = LinearBandit("three-metrics", arms, params, torch.full((3,), 0.1, dtype=torch.float64), baseline)
    alphas = [0.2, 0.02]
    policy = TSASC(_certain(env, 0), [_certain(env, 1), _certain(env, 2)], alpha=alphas)
    a = policy.select(env.arm_features, baseline, ReplicationRNG(replication_seeds(0, R)))
    rows = torch.arange(R)
    mean = env.expected  # [R, K, 3]
    feasible = torch.ones(R, K, dtype=torch.bool)
    for j, al in enumerate(alphas, start=1):
        feasible &= mean[..., j] >= (1 - al) * mean[rows, baseline, j][:, None]
    feasible[rows, baseline] = True
    best = mean[..., 0].masked_fill(~feasible, float("-inf")).argmax(-1)
    assert torch.equal(a, best)
    # a single metric's check alone would allow more: the AND matters in some replication
    only_first = mean[..., 1] >= (1 - alphas[0]) * mean[rows, baseline, 1][:, None]
    only_first[rows, baseline] = True
    assert (mean[..., 0].masked_fill(~only_first, float("-inf")).argmax(-1) != best).any()


def test_ts_asc_learns_to_respect_the_constraint_unlike_vanilla_ts():
    env = daulton2019(replications=16, seed=7, alpha=0.01)
    prior = lambda: _model(16, env.dim)
    asc = simulate(TSASC(prior(), [prior()], alpha=0.01), env, 400, seed=8)
    ts = simulate(make_policy("ts", env, ridge=0.01), env, 400, seed=8)
    assert asc.violation[-100:].float().mean() < 0.15
    assert ts.violation[-100:].float().mean() > 0.8
    gap = (env.optimal_reward - env.baseline_expected[:, 0]).mean()
    assert asc.regret[-100:].mean() < 0.1 * gap


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("alpha", [-0.01, 1.0, 2.0, float("inf"), [0.1, 1.0]])
def test_alpha_outside_0_1_is_refused(alpha):
    R, d = 2, 4
    cons = [_model(R, d)] if not isinstance(alpha, list) else [_model(R, d), _model(R, d)]
    with pytest.raises(ValueError, match="alpha"):
        TSASC(_model(R, d), cons, alpha=alpha)


def test_alpha_forms():
    R, d = 2, 4
    assert TSASC(_model(R, d), _model(R, d), alpha=0.0).alpha.tolist() == [0.0]
    assert TSASC(_model(R, d), _model(R, d), alpha=torch.tensor(0.2, dtype=torch.float64)).alpha.tolist() == [0.2]
    assert TSASC(_model(R, d), [_model(R, d)] * 2, alpha=torch.tensor([0.1, 0.3], dtype=torch.float64)).alpha.tolist() == [0.1, 0.3]
    with pytest.raises(ValueError, match="alpha: expected a scalar or 2 values"):
        TSASC(_model(R, d), [_model(R, d)] * 2, alpha=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="constraint_models"):
        TSASC(_model(R, d), [], alpha=0.1)


def test_baseline_out_of_range_and_constraint_count_mismatch_are_clear_errors():
    env = daulton2019(replications=3, seed=0)
    policy = TSASC(_model(3, 4), [_model(3, 4)], alpha=0.1)
    for bad in (torch.tensor([0, 100, 2]), torch.tensor([-1, 0, 2]), torch.tensor([0, 1])):
        with pytest.raises(ValueError, match="baseline"):
            policy.select(env.arm_features, bad)
    with pytest.raises(ValueError, match="constraints: expected shape"):
        policy.update(env.arm_features[:, 0], torch.zeros(3), torch.zeros(3, 2))
    too_many = TSASC(_model(3, 4), [_model(3, 4), _model(3, 4)], alpha=0.1)
    with pytest.raises(ValueError, match="constraint metrics"):
        simulate(too_many, env, 3)
