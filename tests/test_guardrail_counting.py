"""Issue 26, "Counting": ``simulate`` counts a violation for every play that breaks a declared
constraint in expectation, the baseline's plays included, per constraint; the trace and
``summary.json`` say which share the baseline caused; ``bayes-safe simulate --problem
module:Class`` runs the problem's own models and says so.

The truth is not read back from the library: the problems below log, at every ``draw``, the
units' candidate features, baseline and mask, and the tests compute the true means from the
dose-finding coefficients (tests/dose_finding.py) and judge them with the constraint rules
written out here:

* ``at_most``: ``value <= bound`` (absolute) or ``value <= bound x baseline value`` (relative);
  ``at_least`` the other way;
* an absolute constraint judges the baseline action like any other action; a relative one is
  never broken by the baseline action itself (its bound is relative to that action's own value);
* a chance constraint is counted against the true mean like any other.

Before the fix, a play of the baseline action never counted when the problem had no mask (the
feasibility table was the satisfaction table, with the baseline set feasible in place), and an
``expected`` that fills one buffer for every action gave every action the last one's means.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyro.distributions as dist
import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from dose_finding import AE_CAP, BETA_AE, BETA_EFFICACY, LEVELS, DoseFinding

from bayes_safe import TSASC, BayesianLinear, Random, ThompsonSampling, simulate
from bayes_safe.envs import Constraint, Problem, Units
from bayes_safe.factory import problem_models
from bayes_safe.metrics import summary, violation_breakdown
from bayes_safe.trace import Trace

R, T = 6, 50


# ---------------------------------------------------------------------- the problems
def truth(features: torch.Tensor) -> torch.Tensor:
    """``[n, K, 2]`` true (efficacy, adverse-event risk) of every dose, from the coefficients."""
    return torch.stack([features @ BETA_EFFICACY, 1.0 / (1.0 + torch.exp(-(features @ BETA_AE)))], -1)


class Logged(DoseFinding):
    """DoseFinding that keeps, per step, a copy of what it drew (features, baseline, mask)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []

    def draw(self, n, generator):
        units = super().draw(n, generator)
        return self._keep(units)

    def _keep(self, units):
        valid = None if units.valid is None else units.valid.clone()
        self.log.append((units.features.clone(), units.baseline.clone(), valid))
        return units

    def outcomes(self, units, actions):  # from the coefficients, not from expected_all
        noise, u_ae = units.context
        means = truth(units.features)[torch.arange(len(units)), actions]
        return torch.stack([means[:, 0] + noise, (u_ae < means[:, 1]).double()], -1)


class PerAction(Logged):
    """Means given per action only (``expected``), the protocol's default ``expected_all``."""

    expected_all = Problem.expected_all

    def expected(self, units, actions):
        return truth(units.features)[torch.arange(len(units)), actions]


class OneBufferPerAction(PerAction):
    """``expected`` fills one buffer and returns it for every action and every step."""

    def expected(self, units, actions):
        if not hasattr(self, "buffer"):
            self.buffer = torch.empty(len(units), 2, dtype=torch.float64)
        self.buffer.copy_(truth(units.features)[torch.arange(len(units)), actions])
        return self.buffer


class ReusedBuffers(Logged):
    """Features, baseline and the mean table live in buffers refilled in place at every step."""

    def draw(self, n, generator):
        units = DoseFinding.draw(self, n, generator)
        if not hasattr(self, "features"):
            self.features, self.baseline = units.features.clone(), units.baseline.clone()
            self.table = torch.empty(n, LEVELS, 2, dtype=torch.float64)
        self.features.copy_(units.features)
        self.baseline.copy_(units.baseline)
        return self._keep(Units(self.features, self.baseline, context=units.context))

    def expected_all(self, units):
        self.table.copy_(truth(units.features))
        return self.table


class Masked(Logged):
    """Doses 4 to 6 not allowed for units with ``z2 > 0`` (the baseline sometimes among them)."""

    def draw(self, n, generator):
        units = DoseFinding.draw(self, n, generator)
        z2 = units.features[:, 0, 5]
        valid = torch.ones(n, LEVELS, dtype=torch.bool)
        valid[z2 > 0, 4:] = False
        return self._keep(Units(units.features, units.baseline, valid, units.context))


# ---------------------------------------------------------------------- the recount
def judge(problem, table: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """``[n, K, C]``: which doses break which declared constraint (rules of the module docstring)."""
    names = list(problem.metric_names)
    rows = torch.arange(len(baseline))
    out = []
    for c in problem.constraints:
        value = table[..., names.index(c.metric)]
        limit = c.bound * value[rows, baseline][:, None] if c.versus_baseline else torch.full_like(value, c.bound)
        broken = value > limit if c.at_most else value < limit
        if c.versus_baseline:
            broken[rows, baseline] = False
        out.append(broken)
    return torch.stack(out, -1)


def recount(problem, trace: Trace) -> dict:
    """What the trace should say, from the problem's log of its draws and the actions played."""
    rows = torch.arange(trace.replications)
    broken, expected, base_expected, optimal = [], [], [], []
    for t, (features, baseline, valid) in enumerate(problem.log):
        table = truth(features)
        no = judge(problem, table, baseline)
        a = trace.actions[t]
        broken.append(no[rows, a])
        expected.append(table[rows, a])
        base_expected.append(table[rows, baseline])
        allowed = ~no.any(-1)
        if valid is not None:
            meets = allowed[rows, baseline].clone()
            allowed &= valid
            allowed[rows, baseline] = meets
        best = [table[r, allowed[r], 0].max() if allowed[r].any() else table[r, baseline[r], 0] for r in range(len(a))]
        optimal.append(torch.stack(best))
    return {"constraint_violation": torch.stack(broken), "expected": torch.stack(expected),
            "baseline_expected": torch.stack(base_expected), "optimal_reward": torch.stack(optimal)}


def ridge(replications: int = R) -> BayesianLinear:
    prior = dist.Normal(torch.zeros(6, dtype=torch.float64), torch.full((6,), 2.0, dtype=torch.float64)).to_event(1)
    return BayesianLinear(prior, noise_std=0.5, batch_shape=[replications])


def policy_for(kind: str, problem):
    if kind == "ts":
        return ThompsonSampling(problem_models(problem, problem.replications)[0])
    if kind == "ts-asc":  # the problem's own models, every declared constraint by metric name
        efficacy, ae = problem_models(problem, problem.replications)
        return TSASC(efficacy, [ae], constraints=problem.constraints, metric_names=problem.metric_names,
                     fallback=problem.fallback)
    if kind == "ts-asc-positional":  # the old form: one constraint per constraint model, in order
        n = problem.replications
        return TSASC(ridge(n), [ridge(n)], constraints=[Constraint.absolute("adverse_event", at_most=AE_CAP)])
    if kind == "random":
        return Random()
    if kind == "ts-ridge":
        return ThompsonSampling(ridge(problem.replications))
    raise AssertionError(kind)


def assert_matches_recount(problem, trace):
    want = recount(problem, trace)
    assert len(problem.log) == trace.horizon
    assert trace.constraint_violation.shape == (trace.horizon, trace.replications, len(problem.constraints))
    assert torch.equal(trace.constraint_violation, want["constraint_violation"])
    assert torch.equal(trace.violation, want["constraint_violation"].any(-1))
    torch.testing.assert_close(trace.expected, want["expected"], rtol=0, atol=1e-12)
    torch.testing.assert_close(trace.baseline_expected, want["baseline_expected"], rtol=0, atol=1e-12)
    torch.testing.assert_close(trace.optimal_reward, want["optimal_reward"], rtol=0, atol=1e-12)
    assert torch.equal(trace.baseline, torch.stack([b for _, b, _ in problem.log]))


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind", ["ts-asc", "ts", "ts-asc-positional"])
def test_the_count_equals_a_recount_baseline_plays_included(kind):
    """The reporter's check: the trace's count equals a recount from the true means, and some of
    the violations are plays of the standard dose, which breaks the absolute cap on its own."""
    problem = Logged(replications=10, fallback="baseline" if kind == "ts-asc" else "safest")
    trace = simulate(policy_for(kind, problem), problem, 80, seed=3)
    assert_matches_recount(problem, trace)
    played = trace.actions == trace.baseline
    ae = trace.constraint_violation[..., 1]
    assert (ae & played).any(), "no violating play of the baseline: the test would not see the bug"
    # the same plays judged from the trace's own expected means (what a user recounts from the file)
    own = trace.expected[..., 1] > AE_CAP
    assert torch.equal(ae, own)
    assert torch.equal(trace.constraint_violation[..., 0],
                       (trace.expected[..., 0] < 0.8 * trace.baseline_expected[..., 0]) & ~played)


@pytest.mark.parametrize("make", [PerAction, OneBufferPerAction, ReusedBuffers, Masked],
                         ids=["expected-per-action", "one-buffer-per-action", "reused-buffers", "masked"])
@pytest.mark.parametrize("kind", ["ts-ridge", "random"])
def test_every_way_of_giving_means_is_counted_the_same(make, kind):
    problem = make(replications=R)
    trace = simulate(policy_for(kind, problem), problem, 40, seed=5)
    assert_matches_recount(problem, trace)
    assert trace.violation.any() and not trace.violation.all()
    if make is Masked:
        logged_valid = torch.stack([v for _, _, v in problem.log])
        assert logged_valid.gather(-1, trace.actions[..., None]).all()  # the mask was respected
        assert not logged_valid.gather(-1, trace.baseline[..., None]).all()  # a masked baseline was seen


def test_per_constraint_columns_follow_the_declarations():
    problem = Logged(replications=R)
    trace = simulate(Random(), problem, T, seed=1)
    assert trace.constraint_labels() == ["efficacy >= 0.8 x baseline", "adverse_event <= 0.05"]
    counts = trace.constraint_violation.sum((0, 1)).tolist()
    want = recount(problem, trace)["constraint_violation"].sum((0, 1)).tolist()
    assert counts == want and all(n > 0 for n in counts)
    both = trace.constraint_violation.all(-1)
    assert int(trace.violation.sum()) == sum(counts) - int(both.sum())  # "any" counts a play once

    # declared the other way round, the columns follow
    swapped = Logged(replications=R)
    swapped.constraints = tuple(reversed(swapped.constraints))
    again = simulate(Random(), swapped, T, seed=1)
    assert torch.equal(again.constraint_violation, trace.constraint_violation.flip(-1))
    assert torch.equal(again.violation, trace.violation)


def test_a_chance_constraint_is_counted_against_the_true_mean():
    plain, chance = Logged(replications=R), Logged(replications=R, confidence=0.95)
    a = simulate(Random(), plain, 30, seed=2)
    b = simulate(Random(), chance, 30, seed=2)
    assert torch.equal(a.actions, b.actions)  # Random ignores the posterior
    assert torch.equal(a.constraint_violation, b.constraint_violation)
    assert b.attrs["constraints"][1]["confidence"] == 0.95
    assert summary(b)["constraints"][1]["confidence"] == 0.95


def test_summary_says_which_share_the_baseline_caused():
    problem = Logged(replications=R)
    trace = simulate(Random(), problem, 80, seed=4)
    info = summary(trace)
    played = torch.stack([trace.actions[t] == problem.log[t][1] for t in range(trace.horizon)])
    broken = recount(problem, trace)["constraint_violation"]
    base_table = torch.stack([truth(f)[torch.arange(R), b] for f, b, _ in problem.log])  # [T, R, 2]

    assert info["violation_rate"] == pytest.approx(float(broken.any(-1).double().mean()))
    assert info["baseline_play_rate"] == pytest.approx(float(played.double().mean()))
    any_broken = broken.any(-1)
    assert info["violation_baseline_share"] == pytest.approx(int((any_broken & played).sum()) / int(any_broken.sum()))
    efficacy, ae = info["constraints"]
    assert (efficacy["metric"], efficacy["form"], ae["metric"], ae["form"]) == ("efficacy", "relative",
                                                                                 "adverse_event", "absolute")
    b = broken[..., 1]
    assert ae["violations"] == int(b.sum())
    assert ae["violation_rate"] == pytest.approx(float(b.double().mean()))
    assert ae["baseline_share"] == pytest.approx(int((b & played).sum()) / int(b.sum()))
    assert 0 < ae["baseline_share"] < 1
    assert ae["baseline_violation_rate_when_played"] == pytest.approx(int((b & played).sum()) / int(played.sum()))
    assert ae["baseline_violation_rate"] == pytest.approx(float((base_table[..., 1] > AE_CAP).double().mean()))
    assert 0.05 < ae["baseline_violation_rate"] < 0.4  # the standard dose breaks the cap for part of the patients
    assert efficacy["baseline_share"] == 0.0 and efficacy["baseline_violation_rate"] == 0.0
    assert violation_breakdown(trace) == info["constraints"]
    # an absolute cap on metric 1: its ratio to the baseline's means nothing, and is not reported
    assert not any(k.startswith("normalized_constraint") for k in info)
    json.dumps(info)  # plain numbers


def test_the_normalized_constraint_stays_for_relative_and_undeclared_metric_1():
    from bayes_safe.envs import daulton2019
    from bayes_safe.factory import make_policy

    env = daulton2019(replications=3, seed=0)
    info = summary(simulate(make_policy("ts-asc", env), env, 20, seed=0))
    assert "normalized_constraint_last100_mean" in info
    assert [c["form"] for c in info["constraints"]] == ["relative"]

    relative = Logged(replications=R)
    relative.constraints = (Constraint.relative("adverse_event", at_most=1.1),)
    assert "normalized_constraint_last100_mean" in summary(simulate(Random(), relative, 10, seed=0))
    undeclared = Logged(replications=R)
    undeclared.constraints = (Constraint.relative("efficacy", at_least=0.8),)
    assert "normalized_constraint_last100_mean" in summary(simulate(Random(), undeclared, 10, seed=0))


def test_per_constraint_violations_survive_netcdf_dataframe_and_replication(tmp_path):
    problem = Logged(replications=R)
    trace = simulate(Random(), problem, 20, seed=6)
    trace.to_netcdf(tmp_path / "t.nc")
    back = Trace.from_netcdf(tmp_path / "t.nc")
    assert back.constraint_violation.dtype == torch.bool
    assert torch.equal(back.constraint_violation, trace.constraint_violation)
    assert torch.equal(back.violation, trace.violation)
    assert back.constraint_labels() == trace.constraint_labels()
    assert summary(back)["constraints"] == summary(trace)["constraints"]
    ds = trace.to_xarray()
    assert list(ds["constraint"].values) == ["efficacy >= 0.8 x baseline", "adverse_event <= 0.05"]

    frame = trace.to_dataframe()
    ae = frame["violation_adverse_event_le_0.05"].to_numpy()
    assert (ae == trace.constraint_violation[..., 1].reshape(-1).numpy()).all()
    assert "violation_efficacy_ge_0.8_x_baseline" in frame.columns

    one = trace.replication(2)
    assert torch.equal(one.constraint_violation, trace.constraint_violation[:, 2:3])


def test_files_written_before_the_field_still_load(tmp_path):
    two = simulate(Random(), Logged(replications=R), 10, seed=0)
    single = Logged(replications=R)
    single.constraints = (Constraint.absolute("adverse_event", at_most=AE_CAP),)
    one = simulate(Random(), single, 10, seed=0)
    for name, trace in (("two", two), ("one", one)):
        ds = trace.to_xarray().drop_vars(["constraint_violation", "constraint"])
        ds.to_netcdf(tmp_path / f"{name}.nc", engine="h5netcdf")
    old_two = Trace.from_netcdf(tmp_path / "two.nc")
    assert old_two.constraint_violation is None and torch.equal(old_two.violation, two.violation)
    assert "recorded" not in old_two.attrs
    assert summary(old_two)["violation_rate"] == summary(two)["violation_rate"]
    assert "constraints" not in summary(old_two)
    old_one = Trace.from_netcdf(tmp_path / "one.nc")
    assert torch.equal(old_one.constraint_violation, one.constraint_violation)


def test_a_policy_naming_a_metric_the_problem_lacks_is_refused():
    problem = DoseFinding(replications=R)
    policy = TSASC(ridge(), [ridge()], constraints=[Constraint.absolute("toxicity", at_most=0.1)],
                   metric_names=["efficacy", "toxicity"])
    with pytest.raises(ValueError, match=r"policy: its metric_names .*'toxicity'.*not metrics of problem"):
        simulate(policy, problem, 2, seed=0)


# ---------------------------------------------------------------------- the command line
def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "bayes_safe.cli", *args], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_runs_the_problems_own_models_and_counts_per_constraint(tmp_path):
    result = _cli(["simulate", "--problem", "dose_finding:DoseFinding", "--policy", "ts-asc", "--replications", "3",
                   "--horizon", "30", "--no-progress", "--out", "run"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    info = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert info["models_source"] == "problem"
    assert info["models"] == {"efficacy": "BayesianLinear (conjugate NIG)",
                              "adverse_event": "BayesianLinear (gibbs, logistic)"}
    assert not any(k.startswith("normalized_constraint") for k in info)
    assert [c["constraint"] for c in info["constraints"]] == ["efficacy >= 0.8 x baseline", "adverse_event <= 0.05"]
    assert 0 <= info["constraints"][1]["violation_rate"] <= 1
    assert "models: the problem's own (DoseFinding.models): efficacy BayesianLinear (conjugate NIG), " \
           "adverse_event BayesianLinear (gibbs, logistic)" in result.stdout
    assert "violations of adverse_event <= 0.05:" in result.stdout
    back = Trace.from_netcdf(tmp_path / "run" / "trace.nc")
    assert back.constraint_violation.shape == (30, 3, 2)
    assert info["violation_rate"] == pytest.approx(float(back.violation.double().mean()))


def test_cli_ridge_default_only_without_declared_models_and_ridge_with_them_is_an_error(tmp_path, monkeypatch, capsys):
    from bayes_safe.cli import main

    (tmp_path / "plain_dose.py").write_text(
        "from dose_finding import DoseFinding\n\n\n"
        "class PlainDose(DoseFinding):\n"
        "    def models(self, replications):\n"
        "        return None\n")
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--problem", "plain_dose:PlainDose", "--policy", "ts", "--replications", "2",
                 "--horizon", "5", "--no-progress", "--out", "plain"]) == 0
    info = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert info["models_source"] == "ridge"
    assert info["models"] == {"efficacy": "BayesianLinear (conjugate, known noise)"}
    assert "models: the ridge default" in capsys.readouterr().out

    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--problem", "dose_finding:DoseFinding", "--policy", "ts", "--replications", "2",
              "--horizon", "5", "--ridge", "1", "--no-progress", "--out", "ridge"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--ridge: DoseFinding declares its own models" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ridge").exists()
