import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import daulton2019, kazerouni2017, kazerouni2017_neurips, make_problem
from bayes_safe.factory import make_policy
from bayes_safe.metrics import (
    cumulative_constraint_satisfied,
    moving_average,
    normalized_constraint,
    summary,
)
from bayes_safe.random import ReplicationRNG, replication_seeds, standard_gamma
from bayes_safe.trace import Trace

FIELDS = ("actions", "baseline", "expected", "baseline_expected", "observed", "optimal_reward", "regret", "violation")


@pytest.mark.parametrize("policy_name", ["ts", "ts-asc", "linucb", "random"])
def test_batched_run_equals_single_runs(policy_name):
    R, T = 4, 60
    seeds = replication_seeds(7, R)
    env = daulton2019(replications=R, seed=seeds, alpha=0.01)
    batched = simulate(make_policy(policy_name, env), env, T, seed=seeds)
    for r in range(R):
        env_r = daulton2019(replications=1, seed=[seeds[r]], alpha=0.01)
        single = simulate(make_policy(policy_name, env_r), env_r, T, seed=[seeds[r]])
        one = batched.replication(r)
        for f in FIELDS:
            assert torch.equal(getattr(one, f), getattr(single, f)), f"{policy_name}: field {f} differs for replication {r}"


def test_same_seed_same_trace_and_different_seed_differs():
    env = daulton2019(replications=3, seed=0)
    a = simulate(make_policy("ts", env), env, 40, seed=1)
    b = simulate(make_policy("ts", env), env, 40, seed=1)
    c = simulate(make_policy("ts", env), env, 40, seed=2)
    assert torch.equal(a.observed, b.observed) and torch.equal(a.actions, b.actions)
    assert not torch.equal(a.observed, c.observed)


def test_daulton_instances_follow_the_paper():
    env = daulton2019(replications=20, seed=3, alpha=0.01)
    assert env.arm_features.shape == (20, 100, 4)
    assert (env.expected > 0).all()  # both metrics positive for every arm
    rows = torch.arange(20)
    for r in range(20):
        mean = env.expected[r]
        top30 = mean[:, 0].argsort(descending=True)[:30]
        ranked = top30[mean[top30, 1].argsort(descending=True)]
        assert int(ranked[19]) == int(env.baseline_action[r])
    feasible = env.feasible
    assert feasible[rows, env.baseline_action].all()
    best_feasible = env.expected[..., 0].masked_fill(~feasible, -1e9).max(-1).values
    best_infeasible = env.expected[..., 0].masked_fill(feasible, -1e9).max(-1).values
    assert (best_feasible < best_infeasible).all()
    torch.testing.assert_close(env.optimal_reward, best_feasible)


def test_kazerouni_baseline_is_mean_of_second_and_third_best():
    env = kazerouni2017(replications=5, seed=0)
    assert env.arm_features.shape == (5, 101, 10)
    arms = env.expected[:, :100, 0]
    assert (arms > 0).all()
    top = arms.sort(-1, descending=True).values
    torch.testing.assert_close(env.baseline_expected[:, 0], 0.5 * (top[:, 1] + top[:, 2]))
    assert (env.arm_features[:, :100].abs() <= 1).all()
    assert float(env.noise_std[0]) == 2.0
    neurips = kazerouni2017_neurips(replications=3, seed=0)
    assert neurips.arm_features.shape == (3, 100, 4)
    ranks = (neurips.expected[..., 0] > neurips.baseline_expected[:, None, 0]).sum(-1)
    assert ranks.tolist() == [9, 9, 9]  # the 10th best arm


def test_thompson_sampling_learns_on_kazerouni():
    env = kazerouni2017_neurips(replications=20, seed=1)
    trace = simulate(make_policy("ts", env), env, 600, seed=2)
    early, late = trace.regret[:50].mean(), trace.regret[-100:].mean()
    assert late < 0.25 * early


def test_ts_asc_with_a_near_certain_posterior_plays_the_best_feasible_arm():
    env = daulton2019(replications=16, seed=5, alpha=0.01)
    d = env.dim
    tight = lambda m: BayesianLinear(
        dist.MultivariateNormal(env.parameters[:, m], 1e-10 * torch.eye(d, dtype=torch.float64)), noise_std=0.1,
        batch_shape=[16])
    policy = TSASC(tight(0), [tight(1)], alpha=0.01)
    trace = simulate(policy, env, 5, seed=0)
    assert torch.equal(trace.actions, env.optimal_action.expand(5, 16))
    assert not trace.violation.any()


def test_trace_round_trips_through_netcdf_and_dataframe(tmp_path):
    env = daulton2019(replications=2, seed=0)
    trace = simulate(make_policy("ts-asc", env), env, 10, seed=0)
    trace.to_netcdf(tmp_path / "t.nc")
    back = Trace.from_netcdf(tmp_path / "t.nc")
    for f in FIELDS:
        assert torch.equal(getattr(back, f), getattr(trace, f)), f
    df = trace.to_dataframe()
    assert len(df) == 20 and {"expected_constraint", "observed_reward", "violation"} <= set(df.columns)


def test_metrics():
    env = daulton2019(replications=3, seed=0)
    trace = simulate(make_policy("ts-asc", env), env, 30, seed=0)
    ma = moving_average(trace.violation, 10)
    torch.testing.assert_close(ma[9], trace.violation[:10].double().mean(0))
    torch.testing.assert_close(ma[29], trace.violation[20:30].double().mean(0))
    ok = cumulative_constraint_satisfied(trace, metric=1)
    manual = trace.expected[..., 1].cumsum(0) >= 0.99 * trace.baseline_expected[..., 1].cumsum(0)
    assert torch.equal(ok, manual)
    torch.testing.assert_close(normalized_constraint(trace), trace.expected[..., 1] / trace.baseline_expected[..., 1])
    s = summary(trace)
    assert s["horizon"] == 30 and 0 <= s["violation_rate"] <= 1


def test_replication_rng_streams_do_not_depend_on_batch_size():
    seeds = replication_seeds(0, 5)
    big = ReplicationRNG(seeds, block=3)
    small = ReplicationRNG(seeds[2:3], block=3)
    a = torch.stack([big.normal((4,), key="k") for _ in range(10)])
    b = torch.stack([small.normal((4,), key="k") for _ in range(10)])
    assert torch.equal(a[:, 2], b[:, 0])
    assert not torch.equal(a[:, 0], a[:, 1])


def test_standard_gamma_moments():
    g = torch.Generator().manual_seed(0)
    for shape in (0.4, 2.5, 30.0):
        x = standard_gamma(torch.full((20000,), shape, dtype=torch.float64), g)
        assert abs(float(x.mean()) - shape) < 0.05 * shape + 0.02
        assert abs(float(x.var()) - shape) < 0.1 * shape + 0.02


def test_bad_inputs():
    with pytest.raises(ValueError, match="problem: unknown name"):
        make_problem("nope")
    with pytest.raises(ValueError, match="alpha"):
        daulton2019(alpha=1.5)
    with pytest.raises(ValueError, match="replications"):
        daulton2019(replications=0)
    env = daulton2019(replications=2, seed=0)
    with pytest.raises(ValueError, match="policy: unknown name"):
        make_policy("ucb2", env)
    with pytest.raises(ValueError, match="horizon"):
        simulate(make_policy("ts", env), env, 0)
    with pytest.raises(ValueError, match="constraint"):
        make_policy("ts-asc", kazerouni2017(replications=1))
    with pytest.raises(ValueError, match="seed: got 3 per-replication seeds"):
        simulate(make_policy("ts", env), env, 5, seed=[1, 2, 3])
    with pytest.raises(ValueError, match="alpha"):
        TSASC(make_policy("ts", env).model, [make_policy("ts", env).model], alpha=[0.1, 0.2])
    with pytest.raises(ValueError, match="constraints: expected shape"):
        p = make_policy("ts-asc", env)
        p.update(torch.randn(2, 4, dtype=torch.float64), torch.randn(2, dtype=torch.float64), None)
    ThompsonSampling  # noqa: B018 - imported for the public API check


def test_batched_run_equals_single_runs_on_a_one_metric_problem():
    R, T = 3, 40
    seeds = replication_seeds(11, R)
    env = kazerouni2017_neurips(replications=R, seed=seeds)
    batched = simulate(make_policy("ts", env), env, T, seed=seeds)
    for r in range(R):
        env_r = kazerouni2017_neurips(replications=1, seed=[seeds[r]])
        single = simulate(make_policy("ts", env_r), env_r, T, seed=[seeds[r]])
        for f in FIELDS:
            assert torch.equal(getattr(batched.replication(r), f), getattr(single, f)), f


def test_daulton_generator_rejects_impossible_settings():
    with pytest.raises(ValueError, match="no instance with a reward/constraint trade-off"):
        daulton2019(replications=1, seed=0, baseline_rank=30, top_reward=30)


def test_ridge_prior_is_exact_in_float64():
    """The factory's ridge prior N(0, sigma^2 / ridge I) keeps sigma in float64 (a Python-float
    Normal would round it to float32 and shift the posterior by ~1e-8)."""
    from bayes_safe.envs import daulton2019
    from bayes_safe.factory import ridge_model
    from bayes_safe.models.linear import gaussian_prior_parameters

    env = daulton2019(replications=2, seed=0)
    loc, cov = gaussian_prior_parameters(ridge_model(env, 0, ridge=3.0).prior)
    sigma = float(env.noise_std[0])
    assert loc.dtype == torch.float64
    want = torch.full((env.dim,), sigma**2 / 3.0, dtype=torch.float64)
    assert torch.allclose(torch.diagonal(cov, dim1=-2, dim2=-1), want, rtol=1e-14, atol=0.0)


def test_a_shared_prior_factor_gives_the_dense_batched_numbers():
    """Before any observation, a batch with one prior is factored once (an expanded factor) and the
    draw is solved in chunks (issue 20: step 0 at R = 10,000, d = 64): the same numbers as the
    dense batched factorisation and solve."""
    R, d = 300, 64  # two chunks of the shared factor
    prior = dist.Normal(torch.zeros((), dtype=torch.float64), 0.5 * torch.ones((), dtype=torch.float64)).expand([d]).to_event(1)
    model = BayesianLinear(prior, noise_std=0.3, batch_shape=[R])
    z = torch.randn(R, d, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    dense = torch.linalg.cholesky(model.precision)
    u = torch.linalg.solve_triangular(dense, model.eta[..., None], upper=False)
    assert torch.equal(model.factor, dense) and model.factor.stride(0) == 0
    assert torch.equal(model._solve_upper(model._u + z), torch.linalg.solve_triangular(dense.mT, u + z, upper=True))
    model.update(torch.randn(R, d, dtype=torch.float64), torch.randn(R, dtype=torch.float64))
    assert model.factor.stride(0) != 0  # after data: the dense batched factor again
    torch.testing.assert_close(model.factor, torch.linalg.cholesky(model.precision), rtol=0, atol=0)
