"""Tuning against logs: ABTest / Study trials estimated off-policy (issue 8, bayes_safe.tuning.logged)."""

import json
import math
import re

import pytest

from bayes_safe.cli import main as cli_main
from bayes_safe.offline import skill_routing_logs
from bayes_safe.tuning import ABTest, LoggedDataProblem, Study, make_problem, write_report
from bayes_safe.tuning.ab_test import Range

SMALL = {"n": 6_000, "seed": 0}


def small_problem(**kw):
    return LoggedDataProblem(options=dict(SMALL), **{"epochs": 3, "n_boot": 50, **kw})


def test_offline_trial_is_a_pure_function_of_parameters_and_seed():
    ab = ABTest(small_problem())
    assert ab.compare == ()
    first = ab.evaluate({"eta": 0.1, "gamma": 1.0}, seed=3)
    assert first == ab.evaluate({"eta": 0.1, "gamma": 1.0}, seed=3)
    assert first != ab.evaluate({"eta": 0.1, "gamma": 1.0}, seed=4)
    assert set(first) <= set(ab.metric_names())
    for name in ("reward", "violation_macro", "violation_micro", "replication"):
        mean, se = first[name]
        assert se > 0 and math.isfinite(mean)
    assert 0 <= first["violation_macro"][0] <= 1


def test_the_tuned_parameter_changes_the_trained_policy():
    """A larger quadratic penalty weight trains a policy that stays closer to the logging policy."""
    ab = ABTest(small_problem(method="quadratic", epochs=4))
    loose = ab.evaluate({"weight": 0.0}, seed=0)
    tight = ab.evaluate({"weight": 1000.0}, seed=0)
    assert tight["replication"][0] > loose["replication"][0]
    assert tight["violation_macro"][0] < loose["violation_macro"][0]


def test_default_search_space_objective_and_constraint_follow_the_method():
    p = small_problem(method="minimax")
    assert [r.name for r in p.parameters] == ["eta", "gamma"]
    assert p.objective == "reward"
    assert p.outcome_constraints == ("violation_macro <= 0.2",)
    assert [r.name for r in small_problem(method="meta").parameters] == ["lam"]
    assert small_problem(method="ips", benchmark=None).outcome_constraints == ()
    assert "violation_macro" not in ABTest(small_problem(method="ips", benchmark=None)).metric_names()


def test_config_round_trip_rebuilds_the_problem():
    ab = ABTest(small_problem(method="meta", max_violation=0.1))
    again = ABTest.from_config(json.loads(json.dumps(ab.config())))
    assert isinstance(again.problem, LoggedDataProblem)
    assert again.problem.config() == ab.problem.config()
    in_memory = LoggedDataProblem(logged_data=skill_routing_logs(n=500, seed=0), benchmark="critical")
    assert in_memory.config() is None  # cannot be rebuilt from storage: Study.load needs the ABTest


def test_csv_logs_are_a_source(tmp_path):
    data = skill_routing_logs(n=4_000, seed=1)
    path = tmp_path / "logs.csv"
    data.to_dataframe().to_csv(path)
    problem = LoggedDataProblem(source=str(path), options=data.column_spec(), benchmark="critical", epochs=2, n_boot=20)
    out = ABTest(problem).evaluate({"eta": 0.1, "gamma": 1.0}, seed=0)
    assert {"reward", "violation_macro"} <= set(out)


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"method": "sgd"}, ValueError, "method: expected one of"),
    ({"source": "nowhere.csv"}, FileNotFoundError, "source: no such file"),
    ({"source": "logs.txt"}, ValueError, "source: expected 'synthetic', 'open-bandit' or a .csv"),
    ({"benchmark": None}, ValueError, "benchmark: method 'minimax' trains under replication constraints"),
    ({"benchmark": "no-such-benchmark"}, ValueError, "no-such-benchmark"),
    ({"holdout": 1.0}, ValueError, "holdout: expected a share in (0, 1)"),
    ({"max_violation": 2.0}, ValueError, "max_violation: expected a rate in [0, 1]"),
    ({"epochs": 0}, ValueError, "epochs: expected a positive int"),
    ({"defaults": {"weight": 3.0}}, ValueError, "defaults: method 'minimax' does not read ['weight']"),
    ({"logged_data": "logs"}, TypeError, "logged_data: expected a LoggedData"),
])
def test_bad_problem_configuration_is_a_clear_error(kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        LoggedDataProblem(**kwargs)


def test_bad_search_space_and_arms_are_rejected_before_any_trial(tmp_path):
    with pytest.raises(ValueError, match="parameter 'alpha': method 'minimax' reads only"):
        Study(ABTest(small_problem()), storage=tmp_path / "s.sqlite", parameters=[Range("alpha", 0.0, 0.1)])
    with pytest.raises(ValueError, match="parameter 'gamma'.*must lie in \\[0, 1\\]"):
        Study(ABTest(small_problem()), parameters=["gamma=0.9:1.5"])
    with pytest.raises(ValueError, match="compare: problem 'logged-data' estimates trials from logs"):
        ABTest(small_problem(), compare=("ts",))
    assert not (tmp_path / "s.sqlite").exists()  # rejected before the database is created


def test_study_on_logs_persists_resumes_and_reports(tmp_path):
    db = tmp_path / "s.sqlite"
    study = Study(ABTest(small_problem()), storage=db, sobol_trials=2, seed=0)
    study.run(trials=2, inline=True)
    resumed = Study.load(db)  # rebuilt from the stored config: same logs, same training
    assert isinstance(resumed.ab_test.problem, LoggedDataProblem)
    resumed.run(trials=3, inline=True)
    assert resumed.counts() == {"COMPLETED": 3}
    observed = resumed.observed()
    for metrics in observed.values():
        assert {"reward", "violation_macro"} <= set(metrics)
    result = write_report(resumed, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "estimates its metrics off-policy on the held-out part" in text
    assert "`violation_macro <= 0.2`" in text
    assert "tradeoff.png" in result["figures"]


def test_make_problem_knows_logged_data():
    p = make_problem({"name": "logged-data", "options": SMALL, "method": "quadratic"})
    assert isinstance(p, LoggedDataProblem) and p.benchmark == "critical"


# long job: `tune logged-data` runs in test_tuning_trust in the default run (and the deploying tutorial)
@pytest.mark.long
def test_cli_tune_logged_data_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["tune", "logged-data", "--rows", "5000", "--epochs", "2", "--trials", "2", "--sobol", "2",
            "--out", str(out), "--no-progress"]
    assert cli_main(args) == 0
    text = capsys.readouterr().out
    assert "trials estimated from the logs (minimax training)" in text
    assert (out / "report.md").exists() and (out / "trials.csv").exists()
    assert cli_main(["tune", "resume", "--out", str(out), "--trials", "3", "--no-progress"]) == 0
    assert "3 completed" in (out / "report.md").read_text()


def test_cli_logged_data_rejects_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main(["tune", "logged-data", "--method", "sgd", "--out", str(tmp_path / "a")])
    capsys.readouterr()
    for args, message in [(["--column", "action"], "--column: expected ARG=VALUE"),
                          (["--source", "open-bandit", "--rows", "10"], "--rows: only for --source synthetic"),
                          (["--objective", "q_1080p_change"], "unknown metric 'q_1080p_change'")]:
        with pytest.raises(SystemExit) as exc:
            cli_main(["tune", "logged-data", *args, "--out", str(tmp_path / "b")])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "b").exists()
