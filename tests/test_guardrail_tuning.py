"""Issue 26, "Tuning an own problem" and "A problem declares its models": the A/B tuner on the
dose-finding problem of tests/dose_finding.py (an NIG efficacy reward guarded relative to the
standard dose, a logistic adverse event capped at 5 %, whose standard dose breaks the cap for
part of the patients).

* a trial reports, per constraint and per arm (tuned, compared, baseline), the share of units
  whose played dose breaks the constraint in expectation, and it equals a recount from the
  true means of the doses the policies played;
* a study can bound that share (``max_violations``): a trial above it is infeasible even when
  the average AE level meets the cap;
* ``tune custom`` runs the problem's own models and ``tune resume`` runs them again;
* the report prints levels against their bound with enough digits, and re-runs the best point.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from dose_finding import AE_CAP, DoseFinding

from bayes_safe.envs import Constraint, Problem, Units
from bayes_safe.tuning import ABTest, SimulatedProblem, Study
from bayes_safe.tuning.ab_test import combine_replicates, replicate_seed

POINT = {"tolerance_efficacy": 0.2, "tolerance_adverse_event": 0.0}


def _needs_new_tsasc():
    from bayes_safe.policies import TSASC

    if "metric_names" not in TSASC.__init__.__code__.co_varnames:
        pytest.fail("TSASC(..., metric_names=..., fallback=...) has not landed (bayes_safe/policies/ts_asc.py)")


class Recording:
    """A policy that keeps what it played: ``(features, baseline, actions)`` per batch."""

    def __init__(self, policy, log):
        self.policy, self.log = policy, log

    def select(self, features, baseline=None, generator=None, valid=None):
        actions = self.policy.select(features, baseline, generator=generator, valid=valid)
        self.log.append((features.clone(), baseline.clone(), actions.clone()))
        return actions

    def update(self, *args, **kwargs):
        return self.policy.update(*args, **kwargs)


def _recount(plays) -> dict[str, float]:
    """% of units whose played dose breaks each guardrail in expectation, from the problem's true
    means, by plain arithmetic (not through Constraint.satisfied)."""
    problem = DoseFinding()
    eff_bad, ae_bad, n = 0, 0, 0
    for features, baseline, actions in plays:
        means = problem.expected_all(Units(features, baseline))
        rows = torch.arange(len(actions))
        played, standard = means[rows, actions], means[rows, baseline]
        eff_bad += int((played[:, 0] < 0.8 * standard[:, 0]).sum())
        ae_bad += int((played[:, 1] > AE_CAP).sum())
        n += len(actions)
    return {"efficacy_violations": 100 * eff_bad / n, "adverse_event_violations": 100 * ae_bad / n}


# ---------------------------------------------------------------------- the arms run the problem's models
def test_arms_run_the_problems_own_models_with_every_declared_constraint():
    _needs_new_tsasc()
    from bayes_safe.factory import describe_model

    problem = SimulatedProblem(DoseFinding(confidence=0.95, fallback="baseline"))
    assert problem.own_models
    asc = problem.make_policy("ts-asc", {"tolerance_efficacy": 0.1, "tolerance_adverse_event": 0.01}, None,
                              seed=0, refit_every=10)
    ts = problem.make_policy("ts", {}, None, seed=0, refit_every=10)
    assert describe_model(asc.reward_model) == describe_model(ts.model) == "BayesianLinear (conjugate NIG)"
    assert [describe_model(m) for m in asc.constraint_models] == ["BayesianLinear (gibbs, logistic)"]
    assert tuple(asc.metric_names) == ("efficacy", "adverse_event")
    assert asc.fallback == "baseline"
    # both guardrails, the reward's included, each at its tolerance; the chance constraint keeps its confidence
    eff, ae = asc.constraints
    assert (eff.metric, eff.at_most, eff.versus_baseline, eff.confidence) == ("efficacy", False, True, None)
    assert (ae.metric, ae.at_most, ae.versus_baseline, ae.confidence) == ("adverse_event", True, False, 0.95)
    assert (eff.bound, ae.bound) == (pytest.approx(0.7), pytest.approx(AE_CAP + 0.01))  # 0.8 - t, cap + t
    text = problem.describe(ABTest(problem, n_users=20, batches=2))
    assert "the problem's own (`DoseFinding.models`)" in text
    assert "BayesianLinear (conjugate NIG)" in text and "BayesianLinear (gibbs, logistic)" in text


class Plain(Problem):
    """No models of its own, no means: the ridge default, and no violation rates."""

    metric_names = ("click", "unsubscribe")
    constraints = (Constraint.relative("unsubscribe", at_most=1.05),)
    noise_std = (0.5, 0.5)

    def draw(self, n, generator):
        return Units(torch.eye(2, dtype=torch.float64).expand(n, 2, 2), torch.zeros(n, dtype=torch.long),
                     context=torch.rand(n, 2, generator=generator, dtype=torch.float64))

    def outcomes(self, units, actions):
        return (units.context < torch.tensor([[0.3, 0.1], [0.4, 0.1]], dtype=torch.float64)[actions]).double()


def test_a_problem_without_models_gets_the_ridge_default_and_says_so():
    problem = SimulatedProblem(Plain())
    ab = ABTest(problem, n_users=20, batches=2)
    assert not problem.own_models
    assert "the ridge default (the problem declares no `models`)" in problem.describe(ab)
    assert "conjugate, known noise" in problem.describe(ab)
    assert problem.violation_metric_names() == ()
    assert not any("violations" in m for m in ab.metric_names())
    with pytest.raises(ValueError, match="max_violations: problem .* gives no expected means"):
        SimulatedProblem(Plain(), max_violations={"unsubscribe": 0.01})


# ---------------------------------------------------------------------- per-unit violation rates
def test_trial_reports_per_arm_violation_rates_that_match_a_recount():
    _needs_new_tsasc()
    logs: dict[str, list] = {}
    inner = SimulatedProblem(DoseFinding())

    def factory(kind, parameters, env, *, seed, refit_every):
        log = logs.setdefault(f"{kind}@{len(logs)}", [])
        return Recording(inner.make_policy(kind, parameters, env, seed=seed, refit_every=refit_every), log)

    ab = ABTest(inner, n_users=60, batches=2, replicates=2, policy_factory=factory)
    names = ("efficacy_violations", "adverse_event_violations")
    for arm in ("", "ts_", "baseline_"):
        assert all(arm + v in ab.metric_names() for v in names)
    replicates = ab.evaluate_replicates(POINT, seed=3)
    assert len(logs) == 4  # two replicates of two learning arms
    runs = list(logs.values())
    for r, rep in enumerate(replicates):
        tuned, ts = runs[2 * r], runs[2 * r + 1]
        baseline = [(f, b, b) for f, b, _ in tuned]  # the baseline arm plays the standard dose on the same units
        for prefix, plays in (("", tuned), ("ts_", ts), ("baseline_", baseline)):
            recount = _recount(plays)
            for v in names:
                assert rep[prefix + v][0] == pytest.approx(recount[v]), (r, prefix, v)
                assert rep[prefix + v][1] > 0
        # the standard dose breaks the AE cap for part of the patients: the baseline's plays are counted
        assert rep["baseline_adverse_event_violations"][0] > 5
        assert rep == ab.evaluate_once(POINT, seed=replicate_seed(3, r))
    # the trial: the replicates' mean, with an SEM covering their spread
    trial = ab.evaluate(POINT, seed=3)
    combined, _ = combine_replicates(replicates)
    for v in names:
        for prefix in ("", "ts_", "baseline_"):
            mean, sem = trial[prefix + v]
            assert mean == pytest.approx(sum(rep[prefix + v][0] for rep in replicates) / 2)
            assert sem == pytest.approx(combined[prefix + v][1]) and sem > 0


def test_a_study_bounding_the_ae_violation_rate_calls_a_trial_above_it_infeasible():
    _needs_new_tsasc()
    with pytest.raises(ValueError, match="max_violations: 'dose' is not a guarded metric"):
        SimulatedProblem(DoseFinding(), max_violations={"dose": 0.01})
    with pytest.raises(ValueError, match=r"max_violations: 'adverse_event' expects a share of units in \[0, 1\]"):
        SimulatedProblem(DoseFinding(), max_violations={"adverse_event": 5})

    problem = SimulatedProblem(DoseFinding(), max_violations={"adverse_event": 0.01})
    # the guardrail on the reward is the objective's own metric: no outcome constraint on it (Ax refuses one)
    assert problem.outcome_constraints == ("adverse_event <= 0.05", "adverse_event_violations <= 1")
    ab = ABTest(problem, n_users=60, batches=2, replicates=1, compare=())
    study = Study(ab, sobol_trials=3, seed=0)
    study.run(trials=3, inline=True)
    observed = study.observed()
    assert len(observed) == 3
    level_only = Study(ABTest(SimulatedProblem(DoseFinding()), n_users=60, batches=2, replicates=1, compare=()))
    for metrics in observed.values():
        above = metrics["adverse_event_violations"][0] > 1
        assert study.is_feasible(metrics) == (not above and metrics["adverse_event"][0] <= AE_CAP)
    # the case: the mean AE level meets the cap while more than 1 % of patients get a dose above it
    caught = [i for i, m in observed.items() if m["adverse_event"][0] <= AE_CAP and m["adverse_event_violations"][0] > 1]
    assert caught, {i: (m["adverse_event"], m["adverse_event_violations"]) for i, m in observed.items()}
    assert all(level_only.is_feasible(observed[i]) and not study.is_feasible(observed[i]) for i in caught)


# ---------------------------------------------------------------------- the report
def test_report_digits_read_a_level_against_its_bound():
    from bayes_safe.tuning.report import _decimals, _fmt

    # the issue printed "+0.05 ± 0.00" next to a bound of 0.05
    assert _fmt(0.0452, 0.0031, digits=None, signed=False, bound=0.05) == "0.0452 ± 0.0031"
    assert _fmt(0.0496, 0.0004, digits=None, signed=False, bound=0.05) == "0.04960 ± 0.00040"
    assert _fmt(0.05, 0.0, digits=None, signed=False, bound=0.05) == "0.050 ± 0.000"
    assert _fmt(12.913, 2.36, digits=None) == "+12.91 ± 2.36"  # a % change keeps its two decimals
    assert _decimals(None, 250.0) == 2


def test_report_warns_when_the_chosen_trials_sem_is_far_below_the_studys():
    from bayes_safe.tuning.report import _rerun_text

    class Fake:
        objective_name, minimize, constraints = "efficacy_change", False, []

        @staticmethod
        def observed():
            return {i: {} for i in range(6)}

    best = {"trial": 4, "observed": {"efficacy_change": (9.0, 0.3)}}
    small = {"metric": "efficacy_change", "sem": 0.3, "median_sem": 1.5, "ratio": 0.2, "trials": 6, "small": True}
    text = "\n".join(_rerun_text(Fake, best, None, small, "not asked"))
    assert "not re-run with fresh seeds (not asked)" in text
    assert "**Warning: the chosen trial's SEM of `efficacy_change` (0.3) is 0.20 x the median SEM" in text
    rerun = {"replicates": 2, "seed": 11, "seconds": 1.0, "metrics": {"efficacy_change": [2.0, 0.5]}, "feasible": None}
    text = "\n".join(_rerun_text(Fake, best, rerun, dict(small, small=False, ratio=0.8)))
    assert "the trial +9.00 ± 0.30 %, the re-run +2.00 ± 0.50 %" in text
    assert "winner's curse" in text and "significantly worse" in text


# ---------------------------------------------------------------------- the command line: tune custom, tune resume
def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "bayes_safe.cli", *args], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# long job: resuming a problem's own models by import path is also covered by test_own_problem_tuning
@pytest.mark.long
def test_tune_custom_runs_the_problems_models_and_resume_runs_them_again(tmp_path):
    _needs_new_tsasc()
    out = tmp_path / "study"
    first = _cli(["tune", "custom", "--problem", "dose_finding:DoseFinding", "--users", "60", "--batches", "2",
                  "--replicates", "1", "--sobol", "3", "--trials", "2", "--max-violations", "adverse_event=0.5",
                  "--out", str(out)], tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    own = "models: the problem's own (DoseFinding.models): efficacy BayesianLinear (conjugate NIG), " \
          "adverse_event BayesianLinear (gibbs, logistic)"
    assert own in first.stdout
    report = (out / "report.md").read_text()
    assert "`efficacy` BayesianLinear (conjugate NIG), `adverse_event` BayesianLinear (gibbs, logistic)" in report
    # (a per-unit limit of 50 %: at 1 % no trial of this tiny study is shown feasible, and a study that shows
    # none recommends keeping the baseline and re-runs nothing, issue 39; tests/test_study_recommendation.py)
    assert "`adverse_event <= 0.05`, `adverse_event_violations <= 50`" in report
    # per-arm violation rates in the summary, the baseline's included
    assert re.search(r"`adverse_event_violations`: tuned arm [\d.]+ %.*`ts` [\d.]+ %.*baseline [\d.]+ %", report)
    # levels read against their bound: at least three decimals for a cap of 0.05
    rows = [line for line in report.splitlines() if line.startswith("| 0 | Sobol |")]
    assert rows and re.search(r"\| \d\.\d{3,} ± \d\.\d{3,} \|", rows[0]), rows
    # the best point re-run with fresh seeds, in the report and best.json
    assert "**Re-run with fresh seeds**" in report and "re-run (2 fresh replicates)" in report
    best = json.loads((out / "best.json").read_text())
    assert best["rerun"]["replicates"] == 2 and "efficacy_change" in best["rerun"]["metrics"]
    assert best["rerun"]["seed"] not in {Study.load(out / "study.sqlite").trial_seed(i) for i in range(2)}
    assert f"re-run of trial {best['trial']} with fresh seeds (2 replicates)" in first.stdout

    # the stored dose_finding:DoseFinding runs code: imported only with consent (issue 28)
    resumed = _cli(["tune", "resume", "--out", str(out), "--trials", "3", "--no-rerun", "--trust-source"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "problem class: dose_finding:DoseFinding" in resumed.stdout and own in resumed.stdout
    study = Study.load(out / "study.sqlite")
    assert study.counts() == {"COMPLETED": 3}
    assert study.ab_test.problem.own_models and study.ab_test.problem.max_violations == {"adverse_event_violations": 0.5}
    assert all("adverse_event_violations" in m for m in study.observed().values())
    report = (out / "report.md").read_text()
    assert "BayesianLinear (gibbs, logistic)" in report
    assert "the problem's own (`DoseFinding.models`)" in report
    # --no-rerun: no new re-run; one stored for the same best trial is still shown
    best = json.loads((out / "best.json").read_text())
    stored = study.properties.get("reruns", {})
    assert len(stored) == 1  # the first run's re-run only
    if str(best["trial"]) in stored:
        assert "**Re-run with fresh seeds**" in report and best["rerun"] == stored[str(best["trial"])]
    else:
        assert "not re-run with fresh seeds (not asked" in report and best["rerun"] is None
