"""``simulate(..., record=...)``: preallocated recording of the fields asked for (issue 20).

The problems are written here (not library generators): one with fixed arms (the same mean
table every step, judged once per chunk of steps), one contextual (a new table every step),
one that gives no means. A full record must equal the trace a plain loop builds from the same
policy and streams (what ``simulate`` returned before recording was preallocated), and a
subset must equal the same fields of the full record.
"""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling, simulate, simulation
from bayes_safe.envs import Constraint, Problem, Units
from bayes_safe.envs.problem import chosen_rows
from bayes_safe.random import ReplicationRNG, replication_seeds, standard_normal
from bayes_safe.simulation import TRACE_FIELDS
from bayes_safe.trace import Trace

R, K, D = 3, 5, 3


class FixedArms(Problem):
    """``K`` fixed arms per replication, a reward and a guarded cost; replication-separable noise."""

    name = "fixed-arms"
    metric_names = ("reward", "cost")
    constraints = (Constraint.relative("cost", at_most=1.05),)
    replication_streams = True

    def __init__(self, replications: int = R, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.replications = replications
        self.arms = torch.randn(replications, K, D, generator=g, dtype=torch.float64)
        theta = torch.randn(replications, 2, D, generator=g, dtype=torch.float64)
        self.means = (self.arms[:, :, None, :] * theta[:, None, :, :]).sum(-1)  # [R, K, 2]
        self.base = torch.zeros(replications, dtype=torch.long)

    def draw(self, n, generator):
        return Units(self.arms, self.base, context=standard_normal((n, 2), generator, key="env/noise"))

    def outcomes(self, units, actions):
        return self.means[torch.arange(len(units)), actions] + 0.3 * units.context

    def expected_all(self, units):
        return self.means  # the same tensor every step


class Contextual(FixedArms):
    """New candidate features (and so a new mean table) every step, some actions masked."""

    name = "contextual"

    def draw(self, n, generator):
        x = standard_normal((n, K, D), generator, key="env/features")
        valid = torch.ones(n, K, dtype=torch.bool)
        valid[:, -1] = False
        return Units(x, self.base, valid, (x, standard_normal((n, 2), generator, key="env/noise")))

    def _table(self, x):
        return torch.stack([x.sum(-1), (x * x).sum(-1)], -1)

    def outcomes(self, units, actions):
        x, noise = units.context
        return self._table(x)[torch.arange(len(units)), actions] + 0.3 * noise

    def expected_all(self, units):
        return self._table(units.context[0])


class NoMeans(FixedArms):
    name = "no-means"

    def expected_all(self, units):
        return None


def _model(batch=R):
    prior = dist.Normal(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)).expand([D]).to_event(1)
    return BayesianLinear(prior, noise_std=0.3, batch_shape=[batch])


def _ts():
    return ThompsonSampling(_model())


def _ts_asc():
    return TSASC(_model(), [_model()], alpha=0.05)


class PlainTS(ThompsonSampling):
    """A subclass: takes simulate's general path (policy.select / policy.update)."""


def _reference(policy, problem, T: int, seed: int) -> Trace:
    """The trace of a plain loop: every step's tensors stacked at the end, judged per step."""
    seeds = replication_seeds(seed, problem.replications)
    rng = ReplicationRNG(seeds)
    n = problem.replications
    rows = torch.arange(n)
    out = {f: [] for f in TRACE_FIELDS}
    for _ in range(T):
        units = problem.draw(n, rng)
        a = policy.select(units.features, units.baseline, generator=rng, valid=units.valid)
        obs = problem.outcomes(units, a.clone())
        means = problem.expected_all(units)
        policy.update(units.features[rows, a], obs[:, 0], obs[:, 1:], actions=a)
        base = means[rows, units.baseline]
        broken = []  # per declared constraint [n, K]; a relative one never marks the baseline action itself
        for c in problem.constraints:
            m = list(problem.metric_names).index(c.metric)
            no = ~c.satisfied(means[..., m], base[:, m])
            if c.versus_baseline:
                no[rows, units.baseline] = False
            broken.append(no)
        broken = torch.stack(broken, -1)  # [n, K, C]
        ok = ~broken.any(-1)
        feasible = ok.clone() if units.valid is None else ok & units.valid
        feasible[rows, units.baseline] = ok[rows, units.baseline]  # allowed when it meets them, even if masked
        best = means[..., 0].masked_fill(~feasible, float("-inf")).max(-1).values
        best = torch.where(feasible.any(-1), best, base[:, 0])
        for f, v in (("actions", a), ("baseline", units.baseline), ("expected", means[rows, a]),
                     ("baseline_expected", base), ("observed", obs), ("optimal_reward", best),
                     ("regret", best - means[rows, a, 0]), ("violation", ~ok[rows, a]),
                     ("constraint_violation", broken[rows, a])):
            out[f].append(v)
    return Trace(**{f: torch.stack(v) for f, v in out.items()}, metric_names=list(problem.metric_names))


@pytest.fixture(params=["default-chunks", "small-chunks"])
def chunks(request, monkeypatch):
    """Also record in chunks of 10 steps (R = 3), so that runs cross many chunk boundaries."""
    if request.param == "small-chunks":
        monkeypatch.setattr(simulation, "_CHUNK_NUMBERS", 30)
        assert simulation._chunk_steps(R) == 10
    return request.param


@pytest.mark.parametrize("make_problem", [FixedArms, Contextual], ids=["fixed-arms", "contextual"])
@pytest.mark.parametrize("make_policy", [_ts, _ts_asc, lambda: PlainTS(_model())], ids=["ts", "ts-asc", "ts-subclass"])
def test_a_full_record_equals_the_plain_loop(make_problem, make_policy, chunks):
    T = 155  # more than fifteen small chunks, and a partial one
    trace = simulate(make_policy(), make_problem(), T, seed=4)
    want = _reference(make_policy(), make_problem(), T, seed=4)
    assert trace.recorded == list(TRACE_FIELDS)
    assert "recorded" not in trace.attrs
    for f in TRACE_FIELDS:
        got = getattr(trace, f)
        assert got.dtype == getattr(want, f).dtype and got.is_contiguous(), f
        assert torch.equal(got, getattr(want, f)), f
        assert not got.is_inference(), f  # ordinary tensors: the caller may change them in place


@pytest.mark.parametrize("record", [("actions",), ("regret", "violation"), ("expected",), ("observed", "baseline"),
                                    ("optimal_reward", "baseline_expected"), "regret", (),
                                    ("constraint_violation",), ("violation", "constraint_violation")])
@pytest.mark.parametrize("make_problem", [FixedArms, Contextual], ids=["fixed-arms", "contextual"])
def test_a_subset_records_those_fields_only(record, make_problem, chunks):
    T = 73
    full = simulate(_ts_asc(), make_problem(), T, seed=1)
    part = simulate(_ts_asc(), make_problem(), T, seed=1, record=record)
    names = [record] if isinstance(record, str) else list(record)
    assert part.recorded == [f for f in TRACE_FIELDS if f in names]
    assert part.attrs["recorded"] == part.recorded and part.shape == (T, R)
    assert (part.horizon, part.replications) == (T, R)
    for f in TRACE_FIELDS:
        if f in names:
            assert torch.equal(getattr(part, f), getattr(full, f)), f
        else:
            assert getattr(part, f) is None, f
    one = part.replication(1)
    assert one.shape == (T, 1)
    for f in one.recorded:
        assert torch.equal(getattr(one, f), getattr(full, f)[:, 1:2])
    frame = part.to_dataframe()
    assert len(frame) == T * R
    assert ("regret" in frame.columns) == ("regret" in names)


def test_a_subset_trace_round_trips_through_netcdf(tmp_path):
    trace = simulate(_ts(), FixedArms(), 20, seed=0, record=("actions", "regret"))
    trace.to_netcdf(tmp_path / "t.nc")
    back = Trace.from_netcdf(tmp_path / "t.nc")
    assert back.recorded == ["actions", "regret"] and back.shape == (20, R)
    assert torch.equal(back.actions, trace.actions) and torch.equal(back.regret, trace.regret)


def test_without_means_the_judged_fields_are_unavailable():
    trace = simulate(_ts(), NoMeans(), 30, seed=0, record=("actions", "regret", "violation"))
    assert not trace.regret_available
    assert trace.regret.isnan().all() and not trace.violation.any()
    full = simulate(_ts(), FixedArms(), 30, seed=0)
    assert torch.equal(trace.actions, full.actions)  # the same streams: the same decisions


def test_batched_subset_equals_one_replication_runs():
    seeds = replication_seeds(9, R)
    problem = FixedArms(R, seed=3)
    batched = simulate(_ts(), problem, 40, seed=seeds, record=("actions", "observed"))
    for r in range(R):
        alone = FixedArms(1, seed=3)
        alone.arms, alone.means, alone.base = problem.arms[r:r + 1], problem.means[r:r + 1], problem.base[r:r + 1]
        single = simulate(ThompsonSampling(_model(1)), alone, 40, seed=[seeds[r]], record=("actions", "observed"))
        assert torch.equal(batched.actions[:, r:r + 1], single.actions)
        assert torch.equal(batched.observed[:, r:r + 1], single.observed)


@pytest.mark.parametrize("record", [("actions", "regrets"), ["reward"], (1,), 5, "everything", [None]])
def test_bad_record_values_name_the_argument_and_the_allowed_names(record):
    with pytest.raises(ValueError, match=r"record: .*'actions', 'baseline', 'expected'.*'violation'"):
        simulate(_ts(), FixedArms(), 5, seed=0, record=record)


def test_the_chosen_rows_are_gathered_exactly_at_any_batch_size():
    g = torch.Generator().manual_seed(0)
    for n in (1, 63, 64, 200):
        features = torch.randn(n, K, D, generator=g, dtype=torch.float64)
        actions = torch.randint(0, K, (n,), generator=g)
        rows = torch.arange(n)
        assert torch.equal(chosen_rows(features, rows, actions), features[rows, actions])
        table = features[..., 0].contiguous()  # [n, K]: one number per candidate
        assert torch.equal(chosen_rows(table, rows, actions), table[rows, actions])
