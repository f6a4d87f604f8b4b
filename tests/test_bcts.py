"""BCTS, the Constraint Mask, the CTS posterior and the two-phase runner (Balakrishnan et al. 2018)."""

import math

import pyro.distributions as dist
import pytest
import torch

from bayes_safe._validation import trusted_inputs
from bayes_safe.envs import BCTSProblem
from bayes_safe.experiments import SharedStreams, run_bcts
from bayes_safe.experiments.bcts import _SharedRows
from bayes_safe.models import PerArmLinear
from bayes_safe.policies import BCTS, ConstraintMask, CTSPosterior, ThompsonSampling
from bayes_safe.random import ReplicationRNG, replication_seeds


def _problem(seed=0, n=80, K=4, d=3, teaching_size=20):
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.ones(n, 1), torch.rand(n, d - 1, generator=g)], 1).double()
    w = torch.rand(d, K, generator=g).double()
    rewards = (x @ w) / (x @ w).max()
    allowed = torch.rand(n, K, generator=g) < 0.6
    allowed[:, -1] = True  # an always-allowed arm
    return BCTSProblem("toy", x, rewards, allowed, [f"x{i}" for i in range(d)], [f"a{k}" for k in range(K)],
                       teaching_size=teaching_size)


def _online_loop(policy, problem, contexts, generator, steps, rewards=None):
    """Run ``policy`` online on the context sequence ``contexts [steps, R]``; returns the actions ``[steps, R]``."""
    rewards = problem.rewards if rewards is None else rewards
    K, d = problem.num_arms, problem.dim
    out = []
    with trusted_inputs():
        for t in range(steps):
            i = contexts[t]
            c = problem.contexts[i]
            a = policy.select(c[:, None, :].expand(len(i), K, d), generator=generator)
            policy.update(c, rewards[i, a], actions=a)
            out.append(a)
    return torch.stack(out)


def _taught(problem, R, teaching="random", N=300, seed=0):
    b = BCTS(0.5, problem.num_arms, problem.dim, teaching=teaching, batch_shape=[R])
    g = torch.Generator().manual_seed(seed)

    def teacher(step, generator):
        i = torch.randint(0, problem.num_contexts, (R,), generator=g)
        return problem.contexts[i][:, None, :].expand(R, problem.num_arms, problem.dim), problem.allowed[i]

    b.learn_constraints(teacher, N, ReplicationRNG.from_seed(seed, R))
    return b.constraint_model


# ------------------------------------------------------------------------------------------ the posterior
@pytest.mark.parametrize("refresh_every", [5, 10_000])
def test_cts_posterior_equals_per_arm_linear(refresh_every):
    torch.manual_seed(0)
    B, K, d, v = 3, 5, 4, 0.7
    # float64 prior parameters: Normal(0.0, 0.7) would hold the float32 rounding of 0.7 (a 1e-8 relative gap)
    prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(v, dtype=torch.float64))
    ref = PerArmLinear(prior.expand([d]).to_event(1), K, noise_std=v, batch_shape=[B])
    ours = CTSPosterior(K, d, v, batch_shape=[B], refresh_every=refresh_every)
    for _ in range(60):
        c, y, a = torch.randn(B, d).double(), torch.rand(B).double(), torch.randint(0, K, (B,))
        ref.update(c, y, a)
        ours.update(c, y, a)
    x = torch.randn(B, K, d).double()
    for p, q in zip(ref.predict(x), ours.predict(x)):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.posterior_mean, ref.posterior_mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.posterior_covariance, ref.posterior_covariance, rtol=1e-10, atol=1e-12)
    shared = torch.randn(B, d).double()
    for p, q in zip(ours.predict(shared), ours.predict(shared[:, None, :].expand(B, K, d).clone())):
        torch.testing.assert_close(p, q)
    assert int(ours.num_observations.sum()) == 60 * B


def test_score_draws_follow_the_posterior():
    torch.manual_seed(1)
    m = CTSPosterior(3, 2, 0.5, batch_shape=[2])
    for _ in range(20):
        m.update(torch.rand(2, 2).double(), torch.rand(2).double(), torch.randint(0, 3, (2,)))
    x = torch.rand(2, 3, 2).double()
    mean, var = m.predict(x)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([m.sample_at(x, g) for _ in range(4000)])
    torch.testing.assert_close(draws.mean(0), mean, atol=4 * (var.max().sqrt() / 60).item(), rtol=0)
    torch.testing.assert_close(draws.var(0), var, rtol=0.1, atol=0)
    w = torch.stack([m.sample(g) for _ in range(4000)])  # weight draws agree with the scores' law
    f = (w * x).sum(-1)
    torch.testing.assert_close(f.var(0), var, rtol=0.1, atol=0)


def test_take_cat_clone_are_independent_copies():
    m = CTSPosterior(2, 2, batch_shape=[3])
    m.update(torch.ones(3, 2).double(), torch.ones(3).double(), torch.tensor([0, 1, 0]))
    both = CTSPosterior.cat([m.take([2, 0]), m.clone()])
    assert both.batch_shape == (5,)
    torch.testing.assert_close(both.posterior_mean[0], m.posterior_mean[2])
    both.update(torch.ones(5, 2).double(), torch.ones(5).double(), torch.zeros(5, dtype=torch.long))
    assert int(m.num_observations.sum()) == 3


# ------------------------------------------------------------------------------------------ structural identities
def test_sigma_one_plays_exactly_plain_cts():
    p = _problem()
    R, T = 3, 150
    seeds = replication_seeds(5, R)
    ctx = torch.randint(0, p.num_contexts, (T, R), generator=torch.Generator().manual_seed(2))
    constraint = _taught(p, R)
    cts = ThompsonSampling(CTSPosterior(p.num_arms, p.dim, batch_shape=[R]))
    bcts = BCTS(1.0, reward_model=CTSPosterior(p.num_arms, p.dim, batch_shape=[R]), constraint_model=constraint.clone())
    a_cts = _online_loop(cts, p, ctx, ReplicationRNG(seeds), T)
    assert torch.equal(_online_loop(bcts, p, ctx, ReplicationRNG(seeds), T), a_cts)
    # a batch mixing settings: the sigma = 1 rows still equal plain CTS on the same streams
    mixed = BCTS(torch.tensor([0.0, 1.0, 0.5]), reward_model=CTSPosterior(p.num_arms, p.dim, batch_shape=[R]),
                 constraint_model=constraint.clone())
    a_mixed = _online_loop(mixed, p, ctx, ReplicationRNG(seeds), T)
    assert torch.equal(a_mixed[:, 1], a_cts[:, 1])
    assert not torch.equal(a_mixed[:, 0], a_cts[:, 0])
    # one torch.Generator: all-ones sigma skips the constraint draw, so the streams stay aligned
    bcts_g = BCTS(1.0, reward_model=CTSPosterior(p.num_arms, p.dim, batch_shape=[R]), constraint_model=constraint.clone())
    cts_g = ThompsonSampling(CTSPosterior(p.num_arms, p.dim, batch_shape=[R]))
    assert torch.equal(_online_loop(bcts_g, p, ctx, torch.Generator().manual_seed(3), T),
                       _online_loop(cts_g, p, ctx, torch.Generator().manual_seed(3), T))


def test_sigma_one_with_the_lead_per_arm_model_equals_thompson_sampling():
    p = _problem(1)
    R, T = 2, 60
    seeds = replication_seeds(9, R)
    ctx = torch.randint(0, p.num_contexts, (T, R), generator=torch.Generator().manual_seed(4))

    def model():
        return PerArmLinear(dist.Normal(0.0, 0.5).expand([p.dim]).to_event(1), p.num_arms, noise_std=0.5, batch_shape=[R])

    bcts = BCTS(1.0, reward_model=model(), constraint_model=_taught(p, R))
    assert torch.equal(_online_loop(bcts, p, ctx, ReplicationRNG(seeds), T),
                       _online_loop(ThompsonSampling(model()), p, ctx, ReplicationRNG(seeds), T))


@pytest.mark.parametrize("generator", ["replication", "torch"])
def test_sigma_zero_ignores_the_online_rewards(generator):
    p = _problem(2)
    R, T = 3, 120
    ctx = torch.randint(0, p.num_contexts, (T, R), generator=torch.Generator().manual_seed(5))
    constraint = _taught(p, R)
    other = torch.rand(p.rewards.shape, generator=torch.Generator().manual_seed(6)).double()
    runs = []
    for rewards in (p.rewards, other, -3.0 * other):
        gen = ReplicationRNG.from_seed(7, R) if generator == "replication" else torch.Generator().manual_seed(7)
        policy = BCTS(0.0, reward_model=CTSPosterior(p.num_arms, p.dim, batch_shape=[R]), constraint_model=constraint.clone())
        runs.append(_online_loop(policy, p, ctx, gen, T, rewards=rewards))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_constraint_mask_never_violates_and_needs_the_constraint():
    p = _problem(3)
    R = 4
    mask = ConstraintMask(num_arms=p.num_arms, dim=p.dim, batch_shape=[R])
    rng = ReplicationRNG.from_seed(0, R)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        i = torch.randint(0, p.num_contexts, (R,), generator=g)
        f = p.contexts[i][:, None, :].expand(R, p.num_arms, p.dim)
        a = mask.select(f, generator=rng, valid=p.allowed[i])
        assert bool(p.allowed[i, a].all())
        mask.update(p.contexts[i], p.rewards[i, a], actions=a)
    with pytest.raises(ValueError, match="valid"):
        mask.select(f, generator=rng)


def test_random_teaching_learns_the_constraint():
    p = _problem(4, n=200)
    m = _taught(p, 1, teaching="random", N=3000)
    mean = torch.einsum("nd,kd->nk", p.contexts, m.posterior_mean[0])
    cts_mean = torch.einsum("nd,kd->nk", p.contexts, _taught(p, 1, teaching="cts", N=3000).posterior_mean[0])
    # the toy constraint is random per context, hence not linear: the fit only beats the base rate
    base = max(p.allowed.double().mean().item(), 1 - p.allowed.double().mean().item())
    assert ((mean > 0.5) == p.allowed).double().mean() > base - 0.05
    assert int((_taught(p, 1, teaching="cts", N=500).num_observations > 0).sum()) >= 1
    assert torch.isfinite(cts_mean).all()


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("sigma", [-0.1, 1.5, float("nan"), torch.tensor([0.5, 2.0])])
def test_sigma_online_outside_unit_interval_is_rejected(sigma):
    with pytest.raises(ValueError, match="sigma_online"):
        BCTS(sigma, num_arms=3, dim=2, batch_shape=[2])
    with pytest.raises(ValueError, match="sigma"):
        run_bcts(_problem(), sigmas=[0.5, sigma if not isinstance(sigma, torch.Tensor) else 2.0], horizon=5,
                 num_teaching=5, replications=1)


def test_zero_teaching_budget_and_unknown_strategy_are_rejected():
    b = BCTS(0.5, num_arms=3, dim=2, batch_shape=[1])
    with pytest.raises(ValueError, match="teaching budget"):
        b.learn_constraints(lambda s, g: None, 0)
    with pytest.raises(ValueError, match="teaching budget"):
        run_bcts(_problem(), num_teaching=0, horizon=5, replications=1)
    with pytest.raises(ValueError, match="teaching"):
        BCTS(0.5, num_arms=3, dim=2, teaching="greedy")
    with pytest.raises(ValueError, match="learn_constraints"):  # online before any teaching
        b.select(torch.ones(1, 3, 2).double())
    with pytest.raises(ValueError, match="teaching_size"):
        BCTSProblem("x", torch.ones(5, 2), torch.ones(5, 3), torch.ones(5, 3, dtype=torch.bool), ["a", "b"],
                    ["0", "1", "2"], teaching_size=5)


# ------------------------------------------------------------------------------------------ the runner
def test_shared_rows_equal_the_duplicated_model():
    m = _taught(_problem(), 2)
    rows = torch.tensor([0, 1, 0, 1, 1])
    x = torch.rand(2, 4, 3).double()[rows.tolist()]
    x = x.clone()
    x[2], x[4] = x[0], x[1]
    a = _SharedRows(m, rows).sample_at(x, SharedStreams([1, 2, 3, 4, 5], torch.arange(5)), key="c")
    b = m.take(rows).sample_at(x, SharedStreams([1, 2, 3, 4, 5], torch.arange(5)), key="c")
    torch.testing.assert_close(a, b)


def test_batched_settings_equal_separate_runs():
    p = _problem(5)
    kw = {"horizon": 150, "replications": 2, "seed": 3, "record_points": 20}
    full = run_bcts(p, sigmas=[0.25, 1.0], teaching=["cts", "random"], num_teaching=[50, 200], **kw)
    alone = run_bcts(p, sigmas=[0.25], teaching=["random"], num_teaching=[200], **kw)
    i, j = full.index(sigma_online=0.25, teaching="random", num_teaching=200), alone.index(policy="bcts")
    for name in ("cumulative_regret", "errors", "constrained_regret"):
        assert (getattr(full, name)[:, i] == getattr(alone, name)[:, j]).all(), name
    m_full, m_alone = full.index("Constraint Mask"), alone.index("Constraint Mask")
    assert (full.cumulative_regret[:, m_full] == alone.cumulative_regret[:, m_alone]).all()
    assert (full.errors[:, m_full] == 0).all()
    # sigma = 1 ignores the constraint model, so the teaching strategy and budget do not matter
    ones = [k for k, s in enumerate(full.settings) if s["sigma_online"] == 1.0]
    for k in ones[1:]:
        assert (full.cumulative_regret[:, k] == full.cumulative_regret[:, ones[0]]).all()


def test_runner_metrics_follow_their_definitions():
    p = _problem(6)
    res = run_bcts(p, sigmas=[0.0, 1.0], teaching=["random"], num_teaching=400, horizon=300, replications=3,
                   seed=1, record_points=300)
    assert res.steps[0] == 1 and res.steps[-1] == 300
    # E(t) counts violations: integer, non-decreasing, at most t
    assert (res.errors == res.errors.round()).all() and (res.errors.max(-1)[-1] <= 300).all()
    assert (res.errors[1:] >= res.errors[:-1]).all()
    # regret against the best action >= regret against the best allowed action
    assert (res.cumulative_regret >= res.constrained_regret - 1e-9).all()
    rows = {r["label"]: r for r in res.summary()}
    assert rows["sigma=0, random"]["errors_mean"] < rows["sigma=1, random"]["errors_mean"]
    assert math.isclose(rows["Constraint Mask"]["errors_mean"], 0.0)
    assert set(res.to_dict()) >= {"summary", "curves", "steps", "config"}
