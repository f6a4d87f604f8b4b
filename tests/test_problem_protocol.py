"""One problem protocol for every problem (issue 15): the built-in problems are ``Problem``s.

``simulate`` has one loop. The linear bandits keep their numbers bit for bit: a reference
loop written here (the step/observe loop ``simulate`` ran before the protocol existed:
fixed arms, ``N(0, 1)`` noise drawn from the run's streams under ``"env/noise"`` after the
policy selects) gives the same trace. A user's problem can opt in to replication-separable
streams; the video-upload simulator runs through ``simulate`` with its 0/1 success metric.
"""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import (
    Constraint,
    Problem,
    Units,
    VideoUpload,
    daulton2019,
    kazerouni2017,
    kazerouni2017_neurips,
)
from bayes_safe.envs.problem import check_problem
from bayes_safe.factory import make_policy
from bayes_safe.random import ReplicationRNG, replication_seeds, standard_normal, standard_uniform

F64 = torch.float64


@pytest.mark.parametrize("build", [lambda: daulton2019(2, seed=1), lambda: kazerouni2017(2, seed=1),
                                   lambda: kazerouni2017_neurips(2, seed=1), lambda: VideoUpload(seed=1)])
def test_every_builtin_problem_implements_the_protocol(build):
    problem = build()
    assert isinstance(problem, Problem)
    check_problem(problem)  # raises if a piece is missing
    units = problem.draw(problem.replications, torch.Generator().manual_seed(0)) if not problem.replication_streams \
        else problem.draw(problem.replications, ReplicationRNG(replication_seeds(0, problem.replications)))
    R = problem.replications
    K = units.features.shape[1]
    table = problem.expected_all(units)
    assert table.shape == (R, K, len(problem.metric_names))
    out = problem.outcomes(units, units.baseline)
    metrics = getattr(out, "metrics", out)
    assert metrics.shape == (R, len(problem.metric_names)) and metrics.dtype == F64


def _reference_run(policy, env, T, seed):
    """The pre-protocol loop of ``simulate`` on a linear bandit, written out here."""
    R, M = env.replications, env.num_metrics
    rng = ReplicationRNG(replication_seeds(seed, R))
    rows = torch.arange(R)
    actions, regret, violation = [], [], []
    alpha = env.alpha
    with torch.inference_mode():
        for _ in range(T):
            a = policy.select(env.arm_features, env.baseline_action, generator=rng)
            mean = env.expected[rows, a]
            noise = standard_normal((R, M), rng, key="env/noise")
            obs = torch.addcmul(mean, noise, env.noise_std)
            policy.update(env.arm_features[rows, a], obs[:, 0], obs[:, 1:] if M > 1 else None, actions=a)
            actions.append(a)
            regret.append(env.optimal_reward - mean[:, 0])
            if alpha is None:
                violation.append(torch.zeros(R, dtype=torch.bool))
            else:
                violation.append((mean[:, 1:] < (1 - alpha) * env.baseline_expected[:, 1:]).any(-1))
    return torch.stack(actions), torch.stack(regret), torch.stack(violation)


@pytest.mark.parametrize("name", ["ts-asc", "ts", "clucb"])
def test_linear_bandits_keep_their_numbers_bit_for_bit(name):
    build = (lambda: daulton2019(3, seed=4, alpha=0.05)) if name != "clucb" else (lambda: kazerouni2017(3, seed=4))
    env = build()
    trace = simulate(make_policy(name, env, alpha=0.1), env, 40, seed=9)
    actions, regret, violation = _reference_run(make_policy(name, build(), alpha=0.1), build(), 40, seed=9)
    assert torch.equal(trace.actions, actions)
    assert torch.equal(trace.regret, regret)
    assert torch.equal(trace.violation, violation)
    if name == "ts":
        assert trace.violation.any()  # the constraint is judged: vanilla TS breaks it


class Pricing(Problem):
    """A user's contextual problem drawing from replication-separable streams (5 prices, 3 features)."""

    name = "pricing"
    metric_names = ("revenue", "retention")
    constraints = (Constraint.relative("retention", at_least=0.97),)
    replication_streams = True

    def __init__(self, replications=1):
        self.replications = replications
        self.w = torch.linspace(-1, 1, 5 * 3 * 2, dtype=F64).reshape(5, 3, 2)

    def draw(self, n, generator):
        users = standard_uniform((n, 3), generator, key="env/users")
        noise = standard_normal((n, 2), generator, key="env/noise")
        feats = torch.eye(5, dtype=F64)[None].expand(n, 5, 5).clone()
        feats = torch.cat([feats, users[:, None, :].expand(n, 5, 3)], -1)
        return Units(feats, torch.full((n,), 2, dtype=torch.long), context=(users, noise))

    def expected_all(self, units):
        users = units.context[0]
        return 1.0 + torch.einsum("nd,kdm->nkm", users, self.w)

    def outcomes(self, units, actions):
        mean = self.expected_all(units)[torch.arange(len(actions)), actions]
        return (mean + 0.1 * units.context[1]).numpy()  # numpy, as a user might return


def _ts(dim, R):
    prior = dist.Normal(torch.zeros(dim, dtype=F64), 1.0).to_event(1)
    return ThompsonSampling(BayesianLinear(prior, noise_std=0.1, batch_shape=[R]))


def test_a_users_problem_with_replication_streams_is_separable():
    R, T = 4, 25
    batch = simulate(_ts(8, R), Pricing(R), T, seed=3)
    seeds = replication_seeds(3, R)
    for r in (0, 3):
        alone = simulate(_ts(8, 1), Pricing(1), T, seed=[seeds[r]])
        assert torch.equal(batch.actions[:, r], alone.actions[:, 0])
        assert torch.equal(batch.observed[:, r], alone.observed[:, 0])
    assert batch.attrs["regret_available"] and torch.isfinite(batch.regret).all()


def test_without_opting_in_a_batch_is_reproducible_but_not_separable():
    class Plain(Pricing):
        replication_streams = False

        def draw(self, n, generator):
            users = torch.rand(n, 3, generator=generator, dtype=F64)
            noise = torch.randn(n, 2, generator=generator, dtype=F64)
            feats = torch.cat([torch.eye(5, dtype=F64)[None].expand(n, 5, 5), users[:, None, :].expand(n, 5, 3)], -1)
            return Units(feats, torch.full((n,), 2, dtype=torch.long), context=(users, noise))

    a, b = (simulate(_ts(8, 4), Plain(4), 10, seed=3) for _ in range(2))
    assert torch.equal(a.observed, b.observed)
    alone = simulate(_ts(8, 1), Plain(1), 10, seed=[replication_seeds(3, 4)[0]])
    assert not torch.equal(a.observed[:, 0], alone.observed[:, 0])


def test_video_upload_runs_through_simulate_with_its_declared_constraint():
    env = VideoUpload(seed=2, alpha=0.0)
    model = BayesianLinear(dist.Normal(torch.zeros(env.feature_dim, dtype=F64), 1.0).to_event(1), noise_std=0.5,
                           batch_shape=[1])
    trace = simulate(ThompsonSampling(model), env, 60, seed=0)
    assert trace.metric_names == ["reward", "success"]
    assert trace.attrs["regret_available"] and trace.alpha == 0.0
    # regret is against the best action that keeps the upload's success probability: only an
    # action that breaks the constraint can earn more than that
    assert bool((trace.regret[~trace.violation] > -1e-12).all())
    # a violation is exactly a chosen action whose success probability is below the baseline's
    expected_success = trace.expected[..., 1]
    assert torch.equal(trace.violation, expected_success < trace.baseline_expected[..., 1])
    assert set(np.unique(trace.observed[..., 1].numpy())) <= {0.0, 1.0}


def test_video_upload_rejects_a_bad_alpha_before_any_work():
    with pytest.raises(ValueError, match="alpha"):
        VideoUpload(alpha=1.5)


def test_a_linear_bandit_draws_one_unit_per_replication():
    env = daulton2019(2, seed=0)
    with pytest.raises(ValueError, match="n: .*2 replications"):
        env.draw(3, ReplicationRNG(replication_seeds(0, 2)))


def test_a_model_without_the_replication_batch_is_refused_by_name():
    env = daulton2019(1, seed=0)
    model = BayesianLinear(dist.Normal(torch.zeros(4, dtype=F64), 1.0).to_event(1), noise_std=0.1)
    with pytest.raises(ValueError, match=r"reward model has batch_shape \[\].*batch_shape=\[1\]"):
        simulate(ThompsonSampling(model), env, 5)


def test_the_video_upload_simulator_runs_from_the_command_line_by_import_path(tmp_path, capsys):
    from bayes_safe.cli import main

    out = tmp_path / "run"
    code = main(["simulate", "--problem", "bayes_safe.envs.video_upload:VideoUpload", "--param", "alpha=0.01",
                 "--policy", "ts-asc", "--replications", "2", "--horizon", "20", "--out", str(out), "--no-progress"])
    assert code == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["violation_rate"] <= 1.0 and summary["final_cumulative_regret_mean"] is not None


def test_the_bcts_online_phase_is_a_problem_simulate_runs():
    """A table written here: 6 contexts, 3 arms; arm 2 pays most but the rule forbids it in half the contexts."""
    from bayes_safe.envs import BCTSProblem
    from bayes_safe.policies.bcts import ConstraintMask

    contexts = np.eye(6)
    rewards = np.tile([0.2, 0.5, 0.9], (6, 1))
    allowed = np.ones((6, 3), dtype=bool)
    allowed[::2, 2] = False
    table = BCTSProblem("six", contexts, rewards, allowed, [f"f{i}" for i in range(6)], ["a", "b", "c"], teaching_size=2)
    order = torch.as_tensor(np.random.default_rng(0).integers(0, 6, size=(40, 2)))
    online = table.online(order, mask=True)
    check_problem(online)
    trace = simulate(ConstraintMask(num_arms=3, dim=6, batch_shape=[2]), online, 40, seed=1)
    assert not trace.violation.any()  # the mask knows the rule
    # regret is against the best allowed arm: 0.9 where allowed, else 0.5
    best = torch.where(torch.as_tensor(allowed[:, 2])[order], 0.9, 0.5).double()
    torch.testing.assert_close(trace.optimal_reward, best)
    # without the rule, a violation is exactly a forbidden arm played
    from bayes_safe.policies import Random

    trace = simulate(Random(), table.online(order), 40, seed=1)
    ctx = order[:, 0]
    torch.testing.assert_close(trace.violation[:, 0], ~torch.as_tensor(allowed)[ctx, trace.actions[:, 0]])
    assert trace.violation.any()
