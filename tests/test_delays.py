"""simulate(..., delays=...): outcomes delivered metric by metric, late (issue 45, item 3)."""

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, Constraint, ThompsonSampling, simulate
from bayes_safe.envs import daulton2019
from bayes_safe.envs.problem import Problem, Units
from bayes_safe.factory import make_policy
from bayes_safe.random import replication_seeds
from bayes_safe.trace import Trace

FIELDS = ("actions", "baseline", "expected", "baseline_expected", "observed", "optimal_reward", "regret", "violation",
          "constraint_violation")


class Ledger(Problem):
    """One action with feature 1: a conjugate model's precision counts the rows it learned and its
    ``eta`` sums their outcomes (noise 1), exactly. A sale of ``t + 1`` and a refund of ``1000 (t + 1)
    + r`` at step ``t`` in replication ``r``: every delivered row can be told apart by its sums."""

    name = "ledger"
    metric_names = ("sale", "refund")

    def __init__(self, replications: int):
        self.replications = replications

    def draw(self, n, generator, step=0):
        return Units(torch.ones(n, 1, 1, dtype=torch.float64), torch.zeros(n, dtype=torch.long), context=step)

    def outcomes(self, units, actions):
        t, n = units.context, len(units)
        sale = torch.full((n,), float(t + 1), dtype=torch.float64)
        return torch.stack([sale, 1000.0 * (t + 1) + torch.arange(n, dtype=torch.float64)], -1)


def _model(R):
    prior = dist.Normal(torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)).to_event(1)
    return BayesianLinear(prior, noise_std=1.0, batch_shape=[R])


def _ledger_policy(R):
    return TSASC(_model(R), [_model(R)], alpha=0.1)


def _check_ledger(delays, T=30, R=5):
    """Run the ledger, checking after every step that each model learned exactly the rows due by then."""
    env = Ledger(R)
    policy = _ledger_policy(R)
    seen = []

    def callback(t, info):
        models = (policy.reward_model, policy.constraint_models[0])
        seen.append([(m.precision[:, 0, 0].clone() - 1.0, m.eta[:, 0].clone()) for m in models])

    trace = simulate(policy, env, T, seed=3, delays=delays, callback=callback)
    learned = trace.learned_at  # [T, R, M]
    obs = trace.observed
    for t in range(T):
        for m in range(2):
            due = (learned[..., m] >= 0) & (learned[..., m] <= t)  # [T, R]: delivered by step t
            count, total = seen[t][m]
            assert torch.equal(count, due.sum(0).to(torch.float64)), (t, m)  # each exactly once
            assert torch.equal(total, (obs[..., m] * due).sum(0)), (t, m)  # and the right rows
    return trace, policy


def test_fixed_lags_deliver_each_row_once_at_its_step():
    trace, policy = _check_ledger({"refund": 7})
    T, R = trace.shape
    steps = torch.arange(T)[:, None].expand(T, R)
    assert torch.equal(trace.learned_at[..., 0].long(), steps)
    expected = torch.where(steps + 7 < T, steps + 7, -1)
    assert torch.equal(trace.learned_at[..., 1].long(), expected)
    assert trace.attrs["delivery"] == "models"
    assert trace.attrs["pending_at_end"] == {"sale": 0, "refund": 7 * R}
    assert trace.pending().tolist() == [[0, 7]] * R
    # pending at the end: never learned (the model holds T - 7 rows, not T rows with zeros)
    assert policy.constraint_models[0].num_observations.tolist() == [T - 7] * R
    assert policy.reward_model.num_observations.tolist() == [T] * R


def test_one_shared_lag_delivers_whole_decisions_late():
    trace, _ = _check_ledger({"sale": 4, "refund": 4})
    assert trace.attrs["delivery"] == "whole"
    assert trace.pending().tolist() == [[4, 4]] * trace.replications


def test_a_lag_beyond_the_horizon_is_never_learned():
    trace, policy = _check_ledger({"sale": 2, "refund": 100}, T=20)
    assert bool((trace.learned_at[..., 1] == -1).all())
    assert trace.pending()[:, 1].tolist() == [20] * trace.replications
    assert policy.constraint_models[0].num_observations.tolist() == [0] * trace.replications


def test_random_lags_deliver_each_row_once_at_its_step():
    trace, policy = _check_ledger({"refund": torch.distributions.Geometric(probs=torch.tensor(0.25)),
                                   "sale": lambda u: (u * 4).floor()}, T=40, R=6)
    learned = trace.learned_at.long()
    lags = learned - torch.arange(40)[:, None, None]
    delivered = learned >= 0
    assert bool((lags[delivered] >= 0).all())
    assert len(set(lags[..., 1][delivered[..., 1]].tolist())) > 3  # lags vary
    assert set(lags[..., 0][delivered[..., 0]].tolist()) <= {0, 1, 2, 3}
    # the pending ones are those due at or after the horizon
    assert torch.equal(trace.pending(), (~delivered).sum(0))
    assert policy.constraint_models[0].num_observations.tolist() == delivered[..., 1].sum(0).tolist()


def test_geometric_lags_have_the_distribution_s_law():
    R, T = 400, 30
    trace = simulate(_ledger_policy(R), Ledger(R), T, seed=0,
                     delays={"refund": torch.distributions.Geometric(probs=torch.tensor(0.3))})
    first = trace.learned_at[0, :, 1].long()  # the first decision's lags (all below T with near certainty)
    assert bool((first >= 0).all())
    mean = float(first.double().mean())
    assert abs(mean - 0.7 / 0.3) < 4 * (0.7 ** 0.5 / 0.3) / R ** 0.5
    cont = simulate(_ledger_policy(R), Ledger(R), T, seed=0,
                    delays={"refund": torch.distributions.Uniform(torch.tensor(0.5), torch.tensor(2.5))})
    lag = cont.learned_at[0, :, 1].long()
    assert set(lag.tolist()) == {1, 2, 3}  # rounded up to steps
    assert abs(float((lag == 1).double().mean()) - 0.25) < 0.1


def test_lag_zero_is_the_run_without_delays_bit_for_bit():
    env = daulton2019(replications=6, seed=2, alpha=0.01)
    for name in ("ts", "ts-asc", "clucb"):
        plain = simulate(make_policy(name, env), env, 40, seed=4)
        zero = simulate(make_policy(name, env), env, 40, seed=4, delays={"reward": 0, "constraint": 0})
        for f in FIELDS:
            assert torch.equal(getattr(plain, f), getattr(zero, f)), (name, f)
        assert plain.learned_at is None and plain.pending() is None
        assert torch.equal(zero.learned_at[..., 0].long(), torch.arange(40)[:, None].expand(40, 6))
        assert zero.attrs["delivery"] == "step" and zero.pending().sum() == 0


def test_a_delay_on_a_metric_the_policy_does_not_learn_changes_nothing():
    env = daulton2019(replications=4, seed=2, alpha=0.01)
    plain = simulate(make_policy("ts", env), env, 30, seed=4)
    late = simulate(make_policy("ts", env), env, 30, seed=4, delays={"constraint": 10})
    assert torch.equal(plain.actions, late.actions) and late.attrs["delivery"] == "step"
    assert late.pending()[:, 1].tolist() == [10] * 4


@pytest.mark.parametrize("delays", [
    {"constraint": 6},
    {"reward": 3, "constraint": 3},
    {"reward": 2, "constraint": torch.distributions.Geometric(probs=torch.tensor(0.2))},
])
def test_batched_run_equals_single_runs(delays):
    R, T = 4, 40
    seeds = replication_seeds(11, R)
    env = daulton2019(replications=R, seed=seeds, alpha=0.01)
    batched = simulate(make_policy("ts-asc", env), env, T, seed=seeds, delays=delays)
    for r in range(R):
        env_r = daulton2019(replications=1, seed=[seeds[r]], alpha=0.01)
        single = simulate(make_policy("ts-asc", env_r), env_r, T, seed=[seeds[r]], delays=delays)
        one = batched.replication(r)
        for f in (*FIELDS, "learned_at"):
            assert torch.equal(getattr(one, f), getattr(single, f)), (f, r)
        assert one.attrs["pending_at_end"] == single.attrs["pending_at_end"]


@pytest.mark.parametrize("delays, mode", [({"reward": lambda u: (u * 6).floor()}, "models"), ({"reward": 4}, "whole")])
def test_thompson_lean_path_with_a_late_reward_equals_single_runs(delays, mode):
    R, T = 3, 30
    seeds = replication_seeds(5, R)
    env = daulton2019(replications=R, seed=seeds, alpha=0.01)
    batched = simulate(make_policy("ts", env), env, T, seed=seeds, delays=delays)
    assert batched.attrs["delivery"] == mode
    plain = simulate(make_policy("ts", env), env, T, seed=seeds)
    assert not torch.equal(plain.actions, batched.actions)  # learning late changed the decisions
    for r in range(R):
        env_r = daulton2019(replications=1, seed=[seeds[r]], alpha=0.01)
        single = simulate(make_policy("ts", env_r), env_r, T, seed=[seeds[r]], delays=delays)
        assert torch.equal(batched.replication(r).actions, single.actions)
        assert torch.equal(batched.replication(r).learned_at, single.learned_at)


def test_bad_delays_are_refused_before_the_run():
    env = daulton2019(replications=2, seed=0, alpha=0.01)
    policy = make_policy("ts-asc", env)
    calls = []

    def callback(t, info):
        calls.append(t)

    def run(delays, p=policy):
        return simulate(p, env, 5, seed=0, delays=delays, callback=callback)

    with pytest.raises(ValueError, match=r"delays: unknown metric name\(s\) \['refund'\].*'reward', 'constraint'"):
        run({"refund": 3})
    with pytest.raises(TypeError, match="delays: expected None or a dict"):
        run(3)
    with pytest.raises(ValueError, match=r"delays\['reward'\]: expected a lag >= 0"):
        run({"reward": -1})
    with pytest.raises(TypeError, match=r"delays\['constraint'\]: expected an int >= 0.*got a bool"):
        run({"constraint": True})
    with pytest.raises(TypeError, match=r"delays\['constraint'\]: expected an int"):
        run({"constraint": "30 days"})
    with pytest.raises(ValueError, match=r"delays\['constraint'\]: Normal's support includes negative lags"):
        run({"constraint": torch.distributions.Normal(torch.tensor(3.0), torch.tensor(1.0))})
    with pytest.raises(ValueError, match=r"delays\['constraint'\]: expected a distribution of scalar lags"):
        run({"constraint": torch.distributions.Poisson(torch.tensor([3.0, 4.0]))})
    with pytest.raises(ValueError, match=r"delays\['constraint'\]: the quantile function returned lags \[-1.0"):
        run({"constraint": lambda u: u * 0 - 1})
    with pytest.raises(ValueError, match=r"delays\['constraint'\]: the quantile function returned shape"):
        run({"constraint": lambda u: u.sum()})
    # policies that cannot take them, by name
    with pytest.raises(ValueError, match="delays: CLUCB's update settles the step of the last select"):
        run({"reward": 2}, make_policy("clucb", env))
    with pytest.raises(ValueError, match="delays: CLUCB2ASC's update settles"):
        run({"reward": 1, "constraint": 1}, make_policy("clucb2-asc-c", env))
    with pytest.raises(ValueError, match=r"delays\['constraint'\]: a random lag needs a model that learns a subset"):
        forgetful = TSASC(policy.reward_model, [BayesianLinear(
            dist.Normal(torch.zeros(env.dim, dtype=torch.float64), torch.ones(env.dim, dtype=torch.float64)).to_event(1),
            noise_std=1.0, batch_shape=[2], forgetting=0.99)], alpha=0.01)
        run({"constraint": torch.distributions.Geometric(probs=torch.tensor(0.5))}, forgetful)

    class Mine(ThompsonSampling):
        def update(self, *args, **kwargs):
            return super().update(*args, **kwargs)

    mine = Mine(make_policy("ts", env).model)
    with pytest.raises(ValueError, match="delays: Mine learns \\['reward'\\] through one update call"):
        run({"reward": lambda u: (u * 3).floor()}, mine)
    assert calls == []  # nothing ran
    # the alias: a problem whose reward is not called "reward"
    trace = simulate(_ledger_policy(2), Ledger(2), 6, seed=0, delays={"reward": 2})
    assert trace.attrs["delays"] == {"sale": "2"} and trace.pending()[:, 0].tolist() == [2, 2]
    with pytest.raises(ValueError, match="given twice"):
        simulate(_ledger_policy(2), Ledger(2), 6, seed=0, delays={"reward": 2, "sale": 3})


def test_a_late_guardrail_metric_costs_violations():
    """The cost of a delay on guardrail violations, measured: TS-ASC on the paper's problem learns its
    constraint metric 50 steps late and breaks the constraint more often than when it learns it at once."""
    R, T = 40, 150
    rates = {}
    for lag in (0, 50):
        env = daulton2019(replications=R, seed=3, alpha=0.01)
        trace = simulate(make_policy("ts-asc", env), env, T, seed=1, delays={"constraint": lag})
        rates[lag] = float(trace.violation.double().mean())
    assert rates[50] > rates[0] + 0.05, rates


def test_the_record_survives_netcdf_slicing_and_the_dataframe(tmp_path):
    env = daulton2019(replications=3, seed=0, alpha=0.01)
    trace = simulate(make_policy("ts-asc", env), env, 12, seed=0, delays={"constraint": 5}, record=["actions"])
    assert trace.learned_at.shape == (12, 3, 2) and trace.learned_at.dtype == torch.int32
    path = tmp_path / "t.nc"
    trace.to_netcdf(path)
    back = Trace.from_netcdf(path)
    assert torch.equal(back.learned_at, trace.learned_at)
    assert back.attrs["pending_at_end"] == {"reward": 0, "constraint": 15}
    assert back.attrs["delays"] == {"constraint": "5"}
    one = trace.replication(1)
    assert one.learned_at.shape == (12, 1, 2) and one.attrs["pending_at_end"] == {"reward": 0, "constraint": 5}
    frame = trace.to_dataframe()
    assert (frame["learned_at_constraint"] == -1).sum() == 15


# ---------------------------------------------------------------------------------- the A/B tuner
class _Pricing(Problem):
    """A user's pricing problem: 21 prices, a 0/1 conversion and a 0/1 refund capped at 2 % that the
    deepest discounts break (the refund known weeks later)."""

    name = "pricing"
    metric_names = ("conversion", "refund")
    constraints = (Constraint.absolute("refund", at_most=0.02),)
    noise_std = (0.5, 0.15)
    replications = 4

    def __init__(self):
        self.prices = torch.linspace(-0.5, 0.5, 21, dtype=torch.float64)

    def draw(self, n, generator):
        u = torch.randn(n, 1, generator=generator, dtype=torch.float64)
        p = self.prices.expand(n, -1)
        return Units(torch.stack([torch.ones_like(p), p, p * p, u * p], -1), baseline=torch.full((n,), 10),
                     context=torch.rand(n, 2, generator=generator, dtype=torch.float64))

    def expected(self, units, actions):
        x = units.features[torch.arange(len(units)), actions]
        return torch.stack([torch.sigmoid(-0.4 - 3.0 * x[:, 1] + x[:, 3]), torch.sigmoid(-4.2 - 3.0 * x[:, 1])], -1)

    def outcomes(self, units, actions):
        return (units.context < self.expected(units, actions)).double()


def test_the_ab_tuner_measures_what_a_late_refund_costs():
    from bayes_safe.tuning import ABTest

    def trial(delays):
        ab = ABTest(_Pricing(), n_users=2000, batches=8, compare=(), replicates=1, delays=delays)
        return ab.evaluate({"tolerance_refund": 0.0}, seed=0)

    now, zero, late = trial(None), trial({"refund": 0}), trial({"refund": 3})
    assert zero == now  # lag 0: the A/B test without delays, number for number
    assert late["refund"][0] > now["refund"][0] + 0.005  # learning the refund 3 batches late breaks the cap more
    ab = ABTest(_Pricing(), n_users=2000, batches=8, compare=(), replicates=1, delays={"refund": 3})
    assert ab.delay_names() == ["reward", "refund"] and ab.config()["delays"] == {"refund": 3}
    with pytest.raises(ValueError, match=r"delays: unknown metric name\(s\) \['refunds'\]; the learned metrics are "
                                         r"\['reward', 'refund'\]"):
        ABTest(_Pricing(), n_users=2000, batches=8, compare=(), delays={"refunds": 3})
    with pytest.raises(ValueError, match=r"delays\['refund'\]: expected a lag >= 0 in batches"):
        ABTest(_Pricing(), n_users=2000, batches=8, compare=(), delays={"refund": -1})


def test_the_command_line_simulates_a_late_metric_and_names_bad_delays(tmp_path):
    """``bayes-safe simulate --delay constraint=20``: the lags and the outcomes still pending in summary.json;
    a bad --delay is one line naming the option, before any work, no traceback."""
    import json
    import subprocess
    import sys

    def cli(*extra):
        return subprocess.run([sys.executable, "-m", "bayes_safe.cli", "simulate", "--problem", "daulton2019",
                               "--policy", "ts-asc", "--replications", "4", "--horizon", "40", "--no-progress",
                               "--out", str(tmp_path / "run"), *extra], capture_output=True, text=True, check=False)

    ok = cli("--delay", "constraint=15")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["delays"] == {"constraint": 15} and summary["pending_at_end"] == {"reward": 0, "constraint": 60}
    for bad, message in ((("--delay", "refunds=3"), "--delay: unknown metric name(s) ['refunds']"),
                         (("--delay", "constraint=-1"), "expected METRIC=STEPS with STEPS an int >= 0"),
                         (("--delay", "constraint=2", "--delay", "constraint=3"), "--delay: a metric given twice")):
        r = cli(*bad)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1


def test_the_ab_tuner_holds_late_refunds_for_a_pending_margin():
    """A TS-ASC arm with ``pending="margin"`` (built by a ``policy_factory``) holds each batch's late refunds
    until the batch they are learned after, in both delivery modes (one lag for every metric, a lag per
    metric), and the margin makes the late arm break the cap less than the plain late arm."""
    from bayes_safe import TSASC
    from bayes_safe.tuning import ABTest

    built = []

    def factory(pending):
        def make(kind, parameters, env, *, seed, refit_every):
            plain = ab.problem.make_policy(kind, parameters, env, seed=seed, refit_every=refit_every)
            policy = TSASC(plain.reward_model, plain.constraint_models, constraints=plain.constraints,
                           metric_names=plain.metric_names, pending=pending)
            built.append(policy)
            return policy
        return make

    results = {}
    for pending in ("ignore", "margin"):
        ab = ABTest(_Pricing(), n_users=2000, batches=8, compare=(), replicates=1, delays={"refund": 3},
                    policy_factory=factory(pending))
        results[pending] = ab.evaluate({"tolerance_refund": 0.0}, seed=0)
    margin = built[-1]
    # batches 4, 5 and 6 are never learned (due after the last decision): 3 batches of 250 units held
    assert int(margin.pending_held[0].sum()) == 3 * 250
    assert results["margin"]["refund"][0] < results["ignore"]["refund"][0]
    ab = ABTest(_Pricing(), n_users=2000, batches=8, compare=(), replicates=1, delays={"reward": 3, "refund": 3},
                policy_factory=factory("margin"))
    ab.evaluate({"tolerance_refund": 0.0}, seed=0)
    assert int(built[-1].pending_held[0].sum()) == 3 * 250
