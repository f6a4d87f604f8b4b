"""LUCB, CLUCB (Kazerouni et al. 2017) and CLUCB2-ASC (Daulton et al. 2019, Algorithm 2)."""

import pytest
import torch

from bayes_safe import simulate
from bayes_safe.cli import main
from bayes_safe.envs import daulton2019, kazerouni2017, kazerouni2017_neurips
from bayes_safe.factory import make_policy, ridge_model
from bayes_safe.metrics import cumulative_constraint_satisfied
from bayes_safe.policies import CLUCB, CLUCB2ASC, LUCB, EllipsoidConfidence, LinUCB
from bayes_safe.policies.clucb import _ArmBounds, _bounds
from bayes_safe.random import replication_seeds


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("alpha", [-0.1, 1.0, 1.5, float("nan")])
def test_clucb_rejects_alpha_outside_0_1(alpha):
    env = kazerouni2017(replications=2, seed=0)
    with pytest.raises(ValueError, match="alpha"):
        CLUCB(ridge_model(env), env.baseline_expected[:, 0], alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        make_policy("clucb", env, alpha=alpha)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.5, 2.0])
def test_policies_reject_delta_outside_0_1(delta):
    env = daulton2019(replications=2, seed=0)
    with pytest.raises(ValueError, match="delta"):
        CLUCB(ridge_model(env), env.baseline_expected[:, 0], alpha=0.1, delta=delta)
    with pytest.raises(ValueError, match="delta"):
        LUCB(ridge_model(env), delta=delta)
    with pytest.raises(ValueError, match="delta"):
        make_policy("clucb2-asc-c", env, delta=delta)


def test_clucb2asc_rejects_bad_arguments():
    env = daulton2019(replications=3, seed=0)
    r, c = ridge_model(env, 0), ridge_model(env, 1)
    with pytest.raises(ValueError, match="mode"):
        CLUCB2ASC(r, [c], mode="both")
    with pytest.raises(ValueError, match="alpha"):
        CLUCB2ASC(r, [c], alpha=[0.1, 0.2])
    with pytest.raises(ValueError, match="alpha"):
        CLUCB2ASC(r, [c], alpha=1.0)
    with pytest.raises(ValueError, match="constraint_models"):
        CLUCB2ASC(r, [])
    with pytest.raises(ValueError, match="constraint_weight_bounds"):
        CLUCB2ASC(r, [c], constraint_weight_bounds=[1.0, 2.0])
    with pytest.raises(ValueError, match="weight_bound"):
        CLUCB2ASC(r, [c], weight_bound=torch.ones(5))
    with pytest.raises(ValueError, match="weight_bound"):
        CLUCB2ASC(r, [c], weight_bound=-1.0)
    with pytest.raises(ValueError, match="baseline_lower_bound"):
        CLUCB2ASC(r, [c], baseline_lower_bound=-0.5)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_radius_scale_must_be_positive_and_finite(scale):
    env = kazerouni2017(replications=2, seed=0)
    with pytest.raises(ValueError, match="radius_scale"):
        LUCB(ridge_model(env), radius_scale=scale)
    with pytest.raises(ValueError, match="radius_scale"):
        CLUCB(ridge_model(env), env.baseline_expected[:, 0], alpha=0.1, radius_scale=scale)


def test_radius_scale_widens_the_ellipsoid():
    env = kazerouni2017(replications=2, seed=0)
    wide = LUCB(ridge_model(env), radius_scale=3.5).confidence
    plain = LUCB(ridge_model(env)).confidence
    torch.testing.assert_close(wide.beta(), 3.5 * plain.beta())


def test_clucb_rejects_baseline_reward_of_wrong_shape():
    env = kazerouni2017(replications=3, seed=0)
    with pytest.raises(ValueError, match="baseline_reward"):
        CLUCB(ridge_model(env), torch.ones(4), alpha=0.1)
    with pytest.raises(ValueError, match="baseline_reward"):
        CLUCB(ridge_model(env), torch.tensor([1.0, float("nan"), 1.0]), alpha=0.1)


@pytest.mark.parametrize("name", ["clucb", "clucb2-asc-c", "clucb2-asc-i", "ts-asc"])
def test_baseline_index_out_of_range_fails_before_any_step(name):
    env = daulton2019(replications=3, seed=0)
    policy = make_policy(name, env, alpha=0.1)
    for bad in (torch.tensor([0, 100, 1]), torch.tensor([0, -1, 1])):
        with pytest.raises(ValueError, match="baseline"):
            policy.select(env.arm_features, bad)
    with pytest.raises(ValueError, match="baseline"):
        policy.select(env.arm_features, None)


def test_constraint_model_count_must_match_the_outcomes():
    env = daulton2019(replications=3, seed=0)
    policy = make_policy("clucb2-asc-i", env, alpha=0.1)
    a = policy.select(env.arm_features, env.baseline_action)
    rows = torch.arange(3)
    with pytest.raises(ValueError, match="constraints"):
        policy.update(env.arm_features[rows, a], torch.zeros(3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="constraints"):
        policy.update(env.arm_features[rows, a], torch.zeros(3), None)
    # a policy with more constraint models than the problem has metrics: refused before any step
    two = CLUCB2ASC(ridge_model(env, 0), [ridge_model(env, 1), ridge_model(env, 1)], alpha=0.1)
    with pytest.raises(ValueError, match="constraint metrics"):
        simulate(two, env, 5)


def test_clucb_needs_alpha_on_problems_without_one_and_runs_from_the_cli(tmp_path, capsys):
    env = kazerouni2017(replications=2, seed=0)
    with pytest.raises(ValueError, match="alpha"):
        make_policy("clucb", env)
    out = tmp_path / "run"
    code = main(["simulate", "--problem", "kazerouni2017", "--policy", "clucb", "--alpha", "0.1", "--replications", "3",
                 "--horizon", "20", "--out", str(out), "--no-progress"])
    assert code == 0 and (out / "summary.json").exists()
    for name in ("lucb", "clucb2-asc-c", "clucb2-asc-i"):
        problem = "kazerouni2017" if name == "lucb" else "daulton2019"
        code = main(["simulate", "--problem", problem, "--policy", name, "--replications", "2", "--horizon", "10",
                     "--out", str(tmp_path / name), "--no-progress"])
        assert code == 0


# ---------------------------------------------------------------- confidence bounds
def _trained(env, metric=0, n=30, seed=0):
    model = ridge_model(env, metric)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, env.num_arms, (env.replications, n), generator=gen)
    X = torch.gather(env.arm_features, 1, idx[..., None].expand(-1, -1, env.dim))
    y = torch.gather(env.expected[..., metric], 1, idx) + 0.1 * torch.randn(env.replications, n, generator=gen, dtype=torch.float64)
    model.update(X, y)
    return model


def test_bounds_match_the_ellipsoid_of_ucb_py():
    env = daulton2019(replications=4, seed=1)
    model = _trained(env)
    conf = EllipsoidConfidence(model, 0.01, env.parameters[:, 0].norm(dim=-1))
    lo, hi = _bounds(conf, env.arm_features)
    lo2, hi2 = conf.bounds(env.arm_features)
    torch.testing.assert_close(lo, lo2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(hi, hi2, rtol=1e-10, atol=1e-10)


def test_fixed_arm_fast_path_tracks_the_exact_bounds_through_updates_and_refreshes():
    env = daulton2019(replications=5, seed=2)
    model = ridge_model(env, 1)
    conf = EllipsoidConfidence(model, 0.001, 2.0)
    arms = _ArmBounds(conf, refresh=7)
    gen = torch.Generator().manual_seed(0)
    rows = torch.arange(5)
    for step in range(25):
        offset = torch.randn(5, env.dim, generator=gen, dtype=torch.float64) if step % 2 else None
        extra = torch.randn(5, 2, env.dim, generator=gen, dtype=torch.float64) if step % 3 else None
        out = arms.bounds(env.arm_features, offset, extra)
        pts = env.arm_features if offset is None else env.arm_features + offset[:, None, :]
        expected = conf.bounds(pts) + (conf.bounds(extra) if extra is not None else ())
        assert len(out) == len(expected)
        for got, want in zip(out, expected):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
        a = torch.randint(0, env.num_arms, (5,), generator=gen)
        x = env.arm_features[rows, a]
        arms.observe(x)
        model.update(x, env.expected[rows, a, 1])
        arms.commit()
        if step == 10:  # an update the cache is not told about is detected
            model.update(x, env.expected[rows, a, 1])
    # other features: the exact path
    other = env.arm_features[:, :7].clone()
    torch.testing.assert_close(arms.bounds(other)[0], conf.bounds(other)[0], rtol=1e-9, atol=1e-9)


def test_lucb_plays_like_linucb_with_the_same_ellipsoid():
    env = kazerouni2017(replications=3, seed=0)
    bound = env.parameters[:, 0].norm(dim=-1)
    a = simulate(LUCB(ridge_model(env), delta=0.01, weight_bound=bound), env, 50, seed=1)
    b = simulate(LinUCB(ridge_model(env), delta=0.01, weight_bound=bound), env, 50, seed=1)
    assert torch.equal(a.actions, b.actions)


# ---------------------------------------------------------------- batching
@pytest.mark.parametrize("name", ["lucb", "clucb", "clucb2-asc-c", "clucb2-asc-i"])
def test_batched_run_equals_single_runs(name):
    R, T = 3, 80
    seeds = replication_seeds(11, R)
    build = (lambda s: daulton2019(replications=len(s), seed=s, alpha=0.1)) if "asc" in name else \
        (lambda s: kazerouni2017_neurips(replications=len(s), seed=s))
    env = build(seeds)
    batched = simulate(make_policy(name, env, alpha=0.1), env, T, seed=seeds)
    for r in range(R):
        env_r = build([seeds[r]])
        single = simulate(make_policy(name, env_r, alpha=0.1), env_r, T, seed=[seeds[r]])
        one = batched.replication(r)
        for f in ("actions", "baseline", "violation"):
            assert torch.equal(getattr(one, f), getattr(single, f)), f"{name}: {f} differs for replication {r}"
        # the problem's expected outcomes themselves differ in the last bit between a batched and
        # a single build of the one-metric problems (einsum rounding), hence a tolerance here
        for f in ("expected", "observed", "regret"):
            torch.testing.assert_close(getattr(one, f), getattr(single, f), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- CLUCB (Algorithm 1)
def _confidence_held(policy, env):
    """A simulate callback recording, per replication, whether theta* stayed in the ellipsoid."""
    held = torch.ones(env.replications, dtype=torch.bool)
    theta = env.parameters[:, 0]
    conf = policy.confidence
    sigma = conf.sigma

    def check(t, info):
        model = policy.model
        err = model.posterior_mean - theta
        # ||err||_{V_t} with V_t = sigma^2 Lambda_t
        norm = sigma * (err[:, None, :] @ model.precision @ err[:, :, None])[:, 0, 0].sqrt()
        held.logical_and_(norm <= conf.beta())

    return held, check


def test_clucb_never_violates_constraint_3_when_its_confidence_set_holds():
    # the v3 problem: a baseline close to the best arm, so that exploring costs budget
    env = kazerouni2017(replications=8, seed=3)
    alpha = 0.05
    policy = make_policy("clucb", env, alpha=alpha)
    held, check = _confidence_held(policy, env)
    trace = simulate(policy, env, 1500, seed=4, callback=check)
    ok = cumulative_constraint_satisfied(trace, metric=0, alpha=alpha).all(0)
    assert held.all(), "with delta = 0.001 the ellipsoid should hold in every realisation of this small test"
    assert ok[held].all()
    # bookkeeping: every step is either optimistic (and learnt from) or conservative (and not)
    assert torch.equal(policy.num_optimistic + policy.num_conservative, torch.full((8,), 1500))
    assert torch.equal(policy.model.num_observations, policy.num_optimistic)
    assert (policy.num_conservative > 0).all() and (policy.num_optimistic > 0).all()
    torch.testing.assert_close(policy.baseline_reward_total, 1500 * env.baseline_expected[:, 0])
    # the same instances do threaten the constraint: LUCB violates it
    lucb = simulate(make_policy("lucb", env), env, 1500, seed=4)
    assert (~cumulative_constraint_satisfied(lucb, metric=0, alpha=alpha)).any()


def test_clucb_plays_the_baseline_until_the_check_passes_and_then_the_optimistic_action():
    env = kazerouni2017(replications=4, seed=5)
    policy = make_policy("clucb", env, alpha=0.1)
    a = policy.select(env.arm_features, env.baseline_action)
    # t = 1: nothing saved yet, nothing learnt: the pessimistic check cannot pass
    assert torch.equal(a, env.baseline_action) and not policy.last_safe.any()
    trace = simulate(policy, env, 400, seed=6)
    safe_steps = trace.actions != trace.baseline
    assert safe_steps[-50:].float().mean() > 0.5  # by then CLUCB mostly plays its optimistic action


def test_clucb_accepts_a_callable_baseline_reward():
    env = kazerouni2017(replications=3, seed=0)
    fixed = make_policy("clucb", env, alpha=0.1)
    known = env.expected[..., 0]  # [R, K]
    func = CLUCB(ridge_model(env), lambda f, b: known[torch.arange(3), b], alpha=0.1,
                 weight_bound=env.parameters[:, 0].norm(dim=-1))
    a = simulate(fixed, env, 100, seed=1)
    b = simulate(func, env, 100, seed=1)
    assert torch.equal(a.actions, b.actions)


# ---------------------------------------------------------------- CLUCB2-ASC (Algorithm 2)
def test_clucb2asc_baseline_always_feasible_even_when_excluded_by_valid():
    env = daulton2019(replications=6, seed=0, alpha=0.01)
    for mode in ("cumulative", "instance"):
        policy = make_policy("clucb2-asc-c" if mode == "cumulative" else "clucb2-asc-i", env)
        ok = policy.feasible(env.arm_features, env.baseline_action)
        assert ok[torch.arange(6), env.baseline_action].all()
        valid = torch.ones(6, env.num_arms, dtype=torch.bool)
        valid[torch.arange(6), env.baseline_action] = False
        a = policy.select(env.arm_features, env.baseline_action, valid=valid)
        assert torch.equal(a, env.baseline_action)  # nothing certified yet: the baseline


def test_instance_and_cumulative_variants_differ_as_the_paper_describes():
    """Daulton s.4.3: CLUCB2-ASC-C keeps the *cumulative* constraint but violates the instance-level
    one often at large alpha; CLUCB2-ASC-I never violates it and stays near the baseline."""
    alpha = 0.1
    env = daulton2019(replications=24, seed=7, alpha=alpha)
    c = simulate(make_policy("clucb2-asc-c", env, alpha=alpha), env, 600, seed=8)
    i = simulate(make_policy("clucb2-asc-i", env, alpha=alpha), env, 600, seed=8)
    # cumulative: eq. (3) on the constraint metric holds throughout, instance-level violations are common
    assert cumulative_constraint_satisfied(c, metric=1).all()
    assert c.violation[-100:].float().mean() > 0.2
    # instance: no instance-level violation at all, and far more baseline plays
    assert not i.violation.any()
    on_base_i = (i.actions == i.baseline).float().mean()
    on_base_c = (c.actions == c.baseline).float().mean()
    assert on_base_i > 0.9 and on_base_c < 0.6
    # and the cumulative variant has the lower regret
    assert c.regret[-100:].mean() < i.regret[-100:].mean() - 0.5


def test_clucb2asc_cumulative_sums_follow_algorithm_2():
    env = daulton2019(replications=4, seed=9, alpha=0.1)
    policy = make_policy("clucb2-asc-c", env)
    trace = simulate(policy, env, 200, seed=1)
    rows = torch.arange(4)
    explored = trace.actions != trace.baseline  # [T, R]
    x_a = env.arm_features[rows, trace.actions]  # [T, R, d]
    x_b = env.arm_features[rows, env.baseline_action]  # [R, d]
    torch.testing.assert_close(policy.z, (explored[..., None] * x_a).sum(0))
    torch.testing.assert_close(policy.v, explored.sum(0)[:, None].double() * x_b)
    torch.testing.assert_close(policy.w, (~explored).sum(0)[:, None].double() * x_b)
    assert torch.equal(policy.num_conservative, (~explored).sum(0))
    # both confidence sets learn from every step (baseline outcomes are not known in advance)
    assert torch.equal(policy.reward_model.num_observations, torch.full((4,), 200))
