"""Issue 39 (items 2 and 6): one log, one standard error; a log study checks the declared limit.

``tune decision-log`` ran 4 replicates of each trial on the same logged rows (only the Thompson draws differ)
and ``combine_replicates`` divided their standard error by 2 (pilot SE of the AE level 0.0067 with 4 replicates
against 0.0133 with 1). The replicates of a log study now share their rows: the SE is never below one
estimate's. A served state whose constraint was tuned (``at_most=0.05 + t``) is checked against the declared
0.05, with tolerances measured from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from test_guardrail_logs import _serve

from bayes_safe.envs.ab_problem import ABProblem

PILOT = {"tolerance_efficacy": 0.2, "tolerance_adverse_event": 0.135}


class _SameRows(ABProblem):
    """An offline problem whose every replicate re-estimates the same rows: the same mean and SE each time."""

    name = "same-rows"
    offline = True
    objective = "reward"
    parameters = ({"name": "x", "low": 0.0, "high": 1.0},)
    outcome_constraints = ()

    def __init__(self, shared: bool):
        self.replicates_share_rows = shared

    def metric_names(self):
        return ("reward",)

    def known_parameters(self):
        return ("x",)

    def config(self):
        return None

    def estimate(self, parameters, seed):
        return {"reward": (0.01 + 1e-4 * (seed % 3), 0.0133)}


def test_replicates_that_share_rows_keep_one_estimates_standard_error():
    from bayes_safe.tuning import ABTest

    one, _ = ABTest(_SameRows(True), replicates=1).evaluate_with_noise({"x": 0.5}, seed=0)
    four, noise = ABTest(_SameRows(True), replicates=4).evaluate_with_noise({"x": 0.5}, seed=0)
    assert one["reward"][1] == pytest.approx(0.0133)
    assert four["reward"][1] >= one["reward"][1]                 # was 0.0133 / 2
    assert four["reward"][1] ** 2 == pytest.approx(0.0133 ** 2 + noise["reward"]["between"] ** 2)
    # independent replicates (simulated A/B tests) still average their unit noise
    indep, _ = ABTest(_SameRows(False), replicates=4).evaluate_with_noise({"x": 0.5}, seed=0)
    assert indep["reward"][1] < 0.0133


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return _serve(tmp_path_factory.mktemp("served_se"), n=600, seed=2)


def test_the_pilot_se_of_a_log_study_with_4_replicates_is_not_below_that_with_1(served):
    from bayes_safe.online.tuning import LoggedAlpha
    from bayes_safe.tuning import ABTest

    problem = LoggedAlpha(served / "log.sqlite", served / "state", num_draws=30, n_boot=30)
    assert problem.replicates_share_rows
    ab = ABTest(problem, replicates=4)
    single = ab.evaluate_replicates(PILOT, seed=5)           # the 4 replicates, each one estimate of the same rows
    one, _ = ABTest(problem, replicates=1).evaluate_with_noise(PILOT, seed=5)
    four, _ = ab.evaluate_with_noise(PILOT, seed=5)
    assert one == single[0]
    for metric in ("adverse_event", "reward", "efficacy_ratio"):
        sems = np.array([r[metric][1] for r in single])
        # never below one estimate's SE (the root mean square of the replicates' own SEs), which is what
        # one replicate reports; the old rule divided it by sqrt(4)
        assert four[metric][1] >= np.sqrt(np.mean(sems ** 2)) - 1e-12, (metric, sems, four[metric])
        assert four[metric][1] >= 1.9 * np.sqrt(np.mean(sems ** 2) / 4)
        assert four[metric][1] >= 0.7 * one[metric][1], (metric, one[metric], four[metric])  # was one / 2
    notes = problem.report_notes()
    assert "share of units above a cap" in notes and "--replicates 1" in notes


def test_a_tuned_served_constraint_is_checked_against_its_declared_limit(served, tmp_path):
    from bayes_safe import TSASC
    from bayes_safe.envs.tolerance import policy_constraint
    from bayes_safe.online import Decider
    from bayes_safe.online.tuning import LoggedAlpha

    policy = Decider.load(served / "state").policy
    efficacy, cap = policy.constraints
    tuned = [policy_constraint(efficacy, 0.1), policy_constraint(cap, 0.01)]  # efficacy >= (0.8 - 0.1) x, AE <= 0.06
    served_tuned = TSASC(policy.reward_model, list(policy.constraint_models), constraints=tuned,
                         metric_names=policy.metric_names, fallback=policy.fallback)
    tuned_state = Decider.load(served / "state")  # the served Decider (its id, its decisions: the log's) ...
    tuned_state.policy = served_tuned  # ... serving the tuned policy
    tuned_state.save(tmp_path / "state")
    loaded = Decider.load(tmp_path / "state").policy.constraints
    assert [c.declared for c in loaded] == [pytest.approx(0.8), pytest.approx(0.05)]

    problem = LoggedAlpha(served / "log.sqlite", tmp_path / "state", num_draws=30, n_boot=30)
    # the outcome constraints are the declared limits, not the served policy's bounds (0.7, 0.06)
    assert problem.outcome_constraints == ("efficacy_ratio >= 0.8", "adverse_event <= 0.05", "unsupported <= 0.05")
    back = problem._served_tolerances()
    assert back == {"tolerance_efficacy": pytest.approx(0.1), "tolerance_adverse_event": pytest.approx(0.01)}
    target = problem._target(back)
    assert [c.bound for c in target.constraints] == [pytest.approx(0.7), pytest.approx(0.06)]
    assert [c.declared_bound for c in target.constraints] == [pytest.approx(0.8), pytest.approx(0.05)]
    # the default ranges are around the declared limit and hold the served setting
    for p, t in zip(problem.parameters, (0.1, 0.01)):
        assert p["low"] <= t <= p["high"]
    assert "Declared limits" in problem.report_notes()
