"""A study never recommends what it has not shown safe (issue 39, items 5 and 6).

* When no trial is confidently feasible, ``Study.best``, ``best.json``, the report and the command
  line say so, recommend keeping the baseline, and rank the trials safest first by log-probabilities
  that do not underflow; Ax's ERROR lines for this normal outcome do not reach the user.
* The default tolerance range is sized by a pilot, so a per-unit violation limit that only a
  stricter setting than the old default range meets is reached; a constraint's confidence can be
  a study parameter; the declared limit stays the study's limit, the tuned policy bound is shown
  beside it.
* ``P(feasible)`` is calibrated: trials called feasible with ``P >= 0.9`` are truly feasible at
  least about 90 % of the time (a check of the computation on synthetic outcomes).

The problem is written here (``FEED``): which of 3 feed rankings, clicks against a quality floor.
The two study tests that need a known response use ``Synthetic``, an ``ABTest`` whose trial is a
closed-form function of the tolerance (with seeded noise), so the right answer is known exactly.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

FEED = textwrap.dedent('''
    import torch

    from bayes_safe.envs import Constraint, Problem, Units


    class Feed(Problem):
        """Which of 3 feed rankings for a user u ~ U(0, 1): clicks 10, 14, 18 %; quality (kept at
        least ``floor``) 0.9, 0.9 (0.3 in a band of u) and 0.35."""

        name = "feed"
        metric_names = ("click", "quality")
        noise_std = (0.05, 0.05)

        def __init__(self, floor=0.5, confidence=None):
            self.floor, self.confidence = floor, confidence
            self.constraints = (Constraint.absolute("quality", at_least=floor, confidence=confidence),)

        def draw(self, n, generator):
            u = torch.rand(n, generator=generator, dtype=torch.float64)
            eye = torch.eye(3, dtype=torch.float64)
            features = torch.cat([eye[None].expand(n, 3, 3), eye[None] * u[:, None, None]], -1)
            eps = torch.randn(n, 2, generator=generator, dtype=torch.float64)
            return Units(features, torch.zeros(n, dtype=torch.long), context=torch.cat([u[:, None], eps], -1))

        def expected_all(self, units):
            u = units.context[:, 0]
            click = torch.tensor([0.10, 0.14, 0.18], dtype=torch.float64).expand(len(u), 3)
            band = (u > 0.4) & (u < 0.6)
            quality = torch.stack([torch.full_like(u, 0.9), torch.where(band, 0.3, 0.9), torch.full_like(u, 0.35)], -1)
            return torch.stack([click, quality], -1)

        def outcomes(self, units, actions):
            means = self.expected_all(units)[torch.arange(len(units)), actions]
            return means + 0.05 * units.context[:, 1:]
''')


@pytest.fixture
def feed_dir(tmp_path, monkeypatch):
    (tmp_path / "feed_problem.py").write_text(FEED)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("feed_problem", None)
    yield tmp_path
    sys.modules.pop("feed_problem", None)


def _synthetic(feed_dir, floor: float, limit: float):
    """An ``ABTest`` of ``Feed(floor)`` with ``max_violations={"quality": limit}`` whose trial is
    closed-form in ``t = tolerance_quality`` (lower t: a stricter floor): the per-unit violation
    rate is ``3 + 100 max(0, t + 0.2)`` % (so at most 8 % needs ``t <= -0.15``, beyond the
    default range [-0.125, 0.125]), clicks rise with ``t``, quality falls with it; every metric
    with a small seeded noise and its SE."""
    from feed_problem import Feed

    from bayes_safe.tuning import ABTest, SimulatedProblem

    class Synthetic(ABTest):
        def evaluate_once(self, parameters, seed=0):
            self.problem.check_parameter_values(parameters)
            t = float(parameters["tolerance_quality"])
            rng = np.random.default_rng(int(seed))
            rate = 3 + 100 * max(0.0, t + 0.2)
            click = 40 + 100 * t
            quality = 0.9 - 0.5 * max(0.0, t + 0.2)
            out = {"quality_violations": (rate + 0.3 * rng.standard_normal(), 0.3),
                   "baseline_quality_violations": (0.0, 0.0),
                   "click_change": (click + 0.5 * rng.standard_normal(), 0.5),
                   "quality": (quality + 0.002 * rng.standard_normal(), 0.002),
                   "baseline_quality": (0.9, 0.002), "click": (0.1 * (1 + click / 100), 0.001),
                   "baseline_click": (0.1, 0.001), "quality_change": (100 * (quality / 0.9 - 1), 0.2)}
            return {k: (float(m), float(s)) for k, (m, s) in out.items()}

    return Synthetic(SimulatedProblem(Feed(floor=floor), max_violations={"quality": limit}), n_users=1000, batches=2,
                     replicates=1, compare=())


# ---------------------------------------------------------------------- log-space feasibility
def test_log_feasibility_does_not_underflow_and_ranks_far_misses():
    from bayes_safe.tuning.study import log_feasibility

    cons = [({"hide_violations": 1.0}, "<=", 5.0), ({"revenue_violations": 1.0}, "<=", 10.0)]
    # the trials: 11.6-20.6 % and 5.7-25 % of users against 5 % and 10 %, tight SEs
    safest = {"hide_violations": (12.0, 0.1), "revenue_violations": (5.7, 0.1)}
    riskiest = {"hide_violations": (20.6, 0.1), "revenue_violations": (25.0, 0.1)}
    a, b = log_feasibility(cons, safest), log_feasibility(cons, riskiest)
    assert math.isfinite(a) and math.isfinite(b) and a > b
    assert math.exp(a) == 0.0  # the probability itself underflows: only its log can rank these trials
    # exact where it does not underflow: log Phi(z) summed over constraints
    near = {"hide_violations": (4.0, 1.0), "revenue_violations": (11.0, 2.0)}
    expected = math.log(0.5 * math.erfc(-1 / math.sqrt(2))) + math.log(0.5 * math.erfc(0.5 / math.sqrt(2)))
    assert log_feasibility(cons, near) == pytest.approx(expected, rel=1e-9)
    # an SE of 0 stays finite (floored), and a missing metric is NaN
    assert math.isfinite(log_feasibility(cons, {"hide_violations": (100.0, 0.0), "revenue_violations": (0.0, 0.0)}))
    assert math.isnan(log_feasibility(cons, {"hide_violations": (1.0, 1.0)}))


def test_p_feasible_is_calibrated_on_synthetic_trials_with_known_truth():
    """Over many seeded synthetic trials (true values spread around the bounds, observed with noise),
    those the computation calls feasible with P >= 0.9 are truly feasible at least ~90 % of the time."""
    from bayes_safe.tuning.study import log_feasibility

    rng = np.random.default_rng(2026)
    cons = [({"a": 1.0}, "<=", 0.0), ({"b": 1.0}, ">=", 1.0)]
    called = truly = 0
    for _ in range(20_000):
        mu_a, mu_b = rng.uniform(-3, 3), rng.uniform(-2, 4)
        se_a, se_b = rng.uniform(0.2, 1.5), rng.uniform(0.2, 1.5)
        obs = {"a": (mu_a + se_a * rng.standard_normal(), se_a), "b": (mu_b + se_b * rng.standard_normal(), se_b)}
        if log_feasibility(cons, obs) >= math.log(0.9):
            called += 1
            truly += mu_a <= 0.0 and mu_b >= 1.0
    assert called > 1_500
    assert truly / called >= 0.88, (truly, called)


# ---------------------------------------------------------------------- no trial feasible
def test_an_infeasible_study_recommends_keeping_the_baseline_and_ranks_safest_first(feed_dir, capfd):
    from bayes_safe.tuning import Study, write_report

    # every trial harms at least 3 % of units, the limit is 1 %: nothing can be feasible
    ab = _synthetic(feed_dir, floor=0.5, limit=0.01)
    study = Study(ab, sobol_trials=5, seed=1, parameters=[{"name": "tolerance_quality", "low": -0.15, "high": 0.125}])
    study.run(trials=5, inline=True, progress=False)
    observed = study.observed()
    rates = {i: m["quality_violations"][0] for i, m in observed.items()}
    best = study.best()
    assert best["trial"] is None and best["confident"] is False and "parameters" not in best
    assert best["recommendation"] == "keep the baseline"
    ranked = best["closest_infeasible"]
    assert sorted(r["trial"] for r in ranked) == sorted(observed)
    # safest first: the trial with the fewest violations leads both rankings (the old rule, with every
    # P(feasible) 0, chose the highest objective: the trial with the most violations)
    safest = min(rates, key=rates.get)
    assert ranked[0]["trial"] == safest and best["ranked_by_observed"][0] == safest
    assert [r["trial"] for r in ranked] == sorted(rates, key=rates.get)
    assert best["ranked_by_observed"] == sorted(rates, key=rates.get)
    for r in ranked:
        assert math.isfinite(r["log_p_feasible"]) and math.isfinite(r["log_p_feasible_observed"])
        miss = next(m for m in r["misses"] if m["constraint"] == "quality_violations <= 1")
        assert miss["shortfall"] == pytest.approx(rates[r["trial"]] - 1) and miss["shortfall_se"] > 1
    assert [r["log_p_feasible"] for r in ranked] == sorted((r["log_p_feasible"] for r in ranked), reverse=True)

    out = feed_dir / "report"
    capfd.readouterr()
    result = write_report(study, out, rerun=False)
    printed = capfd.readouterr()
    assert "ERROR" not in printed.out + printed.err  # Ax's best-point utility is silenced for this normal outcome
    stored = json.loads((out / "best.json").read_text())
    assert "parameters" not in stored and stored["trial"] is None
    assert stored["recommendation"] == "keep the baseline"
    assert stored["closest_infeasible"][0]["trial"] == safest
    assert stored["ax"].get("no_feasible") is True and stored["agrees_with_ax"] is True
    assert "quality_violations <= 1" in stored["outcome_constraints"]
    assert any(u["constraint"] == "quality_violations <= 1" for u in stored["unreachable"])
    text = (out / "report.md").read_text()
    assert "**No trial is confidently feasible: keep the baseline.**" in text
    assert "Limits that look unreachable in this search space" in text and "widen `tolerance_quality`" in text
    assert f"| 1 | {safest} |" in text
    assert result["best"]["recommendation"] == "keep the baseline"


@pytest.mark.slow  # moved to the slow job to keep the default run under 15 minutes (2026-11-28)
def test_tune_custom_with_nothing_feasible_prints_no_ax_error_and_writes_no_parameters(feed_dir):
    out = feed_dir / "study"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(feed_dir), str(ROOT)])}
    # a quality floor of 0.95 that no ranking reaches (the best is 0.9) and a per-unit limit of 5 %
    run = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "tune", "custom", "--problem", "feed_problem:Feed",
                          "--param", "floor=0.95", "--max-violations", "quality=0.05", "--users", "120", "--batches", "2",
                          "--replicates", "1", "--sobol", "3", "--trials", "3", "--no-rerun", "--no-progress",
                          "--out", str(out)], check=False, cwd=feed_dir, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ERROR" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert "no trial confidently feasible (P >= 0.9): recommendation: keep the baseline" in run.stdout
    assert "most likely feasible" not in run.stdout
    assert "range pilot: tolerance_quality searched in" in run.stdout  # the limited tolerance's range was sized
    best = json.loads((out / "best.json").read_text())
    assert "parameters" not in best and best["recommendation"] == "keep the baseline"
    assert all(math.isfinite(r["log_p_feasible"]) for r in best["closest_infeasible"])
    # the declared limits are the study's; the report names them, and no trial meets the floor
    assert best["outcome_constraints"] == ["quality >= 0.95", "quality_violations <= 5"]
    text = (out / "report.md").read_text()
    assert "keep the baseline" in text and "`quality >= 0.95` (declared)" in text


# ---------------------------------------------------------------------- the pilot-sized range
def test_the_pilot_sized_range_reaches_a_per_unit_limit_the_old_default_range_cannot(feed_dir):
    from bayes_safe.envs.tolerance import default_range
    from bayes_safe.tuning import Study

    ab = _synthetic(feed_dir, floor=0.5, limit=0.08)
    old = default_range(ab.problem.declared[0])
    assert (old["low"], old["high"]) == (-0.125, 0.125)
    # the old default range: every setting harms more than 8 % of units (10.5 % at its strict end)
    fixed = Study(ab, sobol_trials=4, seed=0, parameters=[old])
    fixed.run(trials=4, inline=True, progress=False)
    assert "parameters" not in fixed.best() and fixed.best()["recommendation"] == "keep the baseline"
    assert fixed.unreachable_constraints()  # the report will say the limit looks unreachable in that space

    sized = Study(ab, sobol_trials=4, seed=0)  # default space: the pilot sizes it
    pilot = sized.properties["range_pilot"]
    row = pilot["constraints"][0]
    assert row["parameter"] == "tolerance_quality" and row["default"] == [-0.125, 0.125]
    assert row["reached"] is True and row["range"] == [-0.375, 0.125]  # extended once by the range's width
    assert row["rate_at_strict_end"][0] <= 8
    space = sized.experiment.search_space.parameters["tolerance_quality"]
    assert (space.lower, space.upper) == (-0.375, 0.125)
    sized.run(trials=4, inline=True, progress=False)
    best = sized.best()
    assert best["confident"] is True and best["parameters"]["tolerance_quality"] < old["low"]
    assert best["observed"]["quality_violations"][0] <= 8
    # the declared limit, and the recommended setting's policy floor beside it
    (bound,) = best["policy_bounds"]
    assert bound["declared"] == "quality >= 0.5" and bound["declared_bound"] == 0.5
    assert bound["policy_bound"] == pytest.approx(0.5 - best["parameters"]["tolerance_quality"])
    from bayes_safe.tuning.report import _policy_bounds_text

    text = _policy_bounds_text(best["policy_bounds"], "the recommended setting's policy bound")
    assert f"`quality >= 0.5` (declared); the recommended setting's policy bound {bound['policy_bound']:.4g}" in text


def test_a_study_of_a_served_policy_recommends_keeping_the_served_setting():
    from types import SimpleNamespace

    from bayes_safe.tuning import Study

    def keep(problem):
        study = Study.__new__(Study)
        study.ab_test = SimpleNamespace(problem=problem)
        return study.keep_setting()

    served = SimpleNamespace(state_path="state", policy=SimpleNamespace(alpha=0.07), tune="alpha", offline=True)
    assert keep(served) == ("keep the served setting", {"alpha": 0.07})
    assert keep(SimpleNamespace(offline=True)) == ("keep the logging policy", None)
    assert keep(SimpleNamespace(offline=False)) == ("keep the baseline", None)


def test_pilot_ranges_stop_at_the_strictest_bound_and_say_when_the_limit_is_not_reached(feed_dir):
    from feed_problem import Feed

    from bayes_safe.envs import Constraint
    from bayes_safe.envs.tolerance import strictest_tolerance
    from bayes_safe.tuning import ABTest, SimulatedProblem

    class Cap(Feed):
        def __init__(self):
            super().__init__()
            self.constraints = (Constraint.absolute("quality", at_most=0.02),)

    calls = []

    class Always(ABTest):  # every setting harms 50 % of units
        def evaluate_once(self, parameters, seed=0):
            calls.append(dict(parameters))
            return {"quality_violations": (50.0, 1.0)}

    ab = Always(SimulatedProblem(Cap(), max_violations={"quality": 0.05}), n_users=100, batches=2, replicates=1,
                compare=())
    assert strictest_tolerance(ab.problem.declared[0]) == -0.02
    params, record = ab.problem.pilot_ranges(ab, seed=0)
    row = record["constraints"][0]
    # [-0.005, 0.005] -> [-0.015, 0.005] -> [-0.02, 0.005] (a cap of 0), then it stops: not reached
    assert [c["tolerance_quality"] for c in calls] == [-0.005, -0.015, -0.02]
    assert row["reached"] is False and params[0]["low"] == -0.02 and params[0]["high"] == 0.005
    # a problem that declares its own search space, or no per-unit limit: nothing to size
    assert SimulatedProblem(Cap()).pilot_ranges(ab, 0) is None


# ---------------------------------------------------------------------- confidence as a parameter
def test_confidence_is_a_study_parameter(feed_dir):
    from feed_problem import Feed

    from bayes_safe.tuning import ABTest, Study

    ab = ABTest(Feed(), n_users=60, batches=2, replicates=1, compare=())
    problem = ab.problem
    assert problem.confidence_names() == ["confidence_quality"]
    assert "confidence_quality" in problem.known_parameters()
    (c,) = problem.policy_constraints({"tolerance_quality": 0.1, "confidence_quality": 0.8})
    assert c.confidence == 0.8 and c.bound == pytest.approx(0.4) and c.declared_bound == 0.5
    (c,) = problem.policy_constraints({"confidence_quality": "0.95"})  # a choice's value; tolerance: declared bound
    assert c.confidence == 0.95 and c.bound == 0.5 and not c.tuned
    (c,) = problem.policy_constraints({"confidence_quality": "none"})
    assert c.confidence is None
    with pytest.raises(ValueError, match="confidence_quality"):
        problem.check_parameter_values({"confidence_quality": "sure"})
    with pytest.raises(ValueError, match="within \\(0, 1\\)"):
        Study(ab, parameters=["confidence_quality=0.5:1.5"])
    # given alone, a confidence joins the default search space; a choice of values works too
    study = Study(ab, sobol_trials=2, seed=0, parameters=["confidence_quality=0.6:0.99"])
    assert study.parameter_names == ["tolerance_quality", "confidence_quality"]
    study.run(trials=2, inline=True, progress=False)
    assert study.counts() == {"COMPLETED": 2}
    choice = Study(ab, sobol_trials=2, seed=0, parameters=["tolerance_quality=-0.1:0.1", "confidence_quality=0.9,none"])
    assert choice.parameter_names == ["tolerance_quality", "confidence_quality"]
    choice.run(trials=2, inline=True, progress=False)
    assert choice.counts() == {"COMPLETED": 2}


def test_outcome_constraints_keep_the_declared_limit_of_a_tuned_constraint():
    from bayes_safe.envs import Constraint
    from bayes_safe.envs.tolerance import policy_constraint
    from bayes_safe.tuning.own_problem import outcome_constraint

    declared = Constraint.absolute("hide", at_most=0.02)
    tuned = policy_constraint(declared, 0.0032)
    assert tuned.bound == pytest.approx(0.0232) and tuned.declared_bound == 0.02
    assert outcome_constraint(tuned) == outcome_constraint(declared) == "hide <= 0.02"
    rel = policy_constraint(Constraint.relative("unsub", at_most=1.02), 0.05, confidence=0.9)
    assert rel.bound == pytest.approx(1.07) and rel.confidence == 0.9  # 1.02 + t: around the declared factor
    assert outcome_constraint(rel) == "unsub_change <= 2"


def test_report_shows_fallback_rates_and_calibration_when_trials_carry_them_and_nothing_otherwise():
    from bayes_safe.tuning.report import _calibration_text, _diagnostic_metrics

    class Fake:
        pass

    rows = [{"status": "COMPLETED", "metrics": {"click_change": (1.0, 0.1), "fallback_rate": (4.0, 0.5),
                                                "fallback_rate_hide": (3.0, 0.5), "chance_claimed_hide": (0.95, 0.0),
                                                "chance_realised_hide": (0.90, 0.01)}},
            {"status": "COMPLETED", "metrics": {"click_change": (1.0, 0.1), "chance_claimed_hide": (0.95, 0.0),
                                                "chance_realised_hide": (0.92, 0.01)}}]
    assert _diagnostic_metrics(Fake, rows) == ["fallback_rate", "fallback_rate_hide", "chance_claimed_hide",
                                               "chance_realised_hide"]
    text = "\n".join(_calibration_text(Fake, rows))
    assert "claimed >= 0.95 safe, realised 0.92" in text
    plain = [{"status": "COMPLETED", "metrics": {"click_change": (1.0, 0.1)}}]
    assert _diagnostic_metrics(Fake, plain) == [] and _calibration_text(Fake, plain) == []
