"""The tuning package: A/B trials, the Ax study, storage, failures, the report and the CLI.

Tiny A/B tests (a few hundred users, a one-epoch model) keep the whole file to about a minute.
"""

import json
import math

import pytest

from bayes_safe.cli import main
from bayes_safe.tuning import ABTest, Range, Study, VideoUploadProblem, write_report
from bayes_safe.tuning import storage as tuning_storage

TINY_PROBLEM = {"warmup": 300, "model": {"nn_epochs": 1, "nn_min_steps": 20}}
TINY_CLI = ["--users", "300", "--batches", "2", "--warmup", "300", "--model-epochs", "1"]
PARAMS = {"alpha": 0.01, "omega_480": 0.02, "omega_720": 0.02, "omega_1080": 0.02}


def tiny_ab(**kwargs) -> ABTest:
    return ABTest(VideoUploadProblem(**TINY_PROBLEM), n_users=300, batches=2, **kwargs)


# ---------------------------------------------------------------------- ABTest
def test_ab_test_is_a_pure_function_of_parameters_and_seed():
    ab = tiny_ab()
    a, b, c = ab.evaluate(PARAMS, seed=3), ab.evaluate(PARAMS, seed=3), ab.evaluate(PARAMS, seed=4)
    assert a == b
    assert a != c
    for name in ("q_1080p_change", "reliability_change", "ts_q_1080p_change", "ts_reliability_change",
                 "baseline_reliability", "reliability", "violation_rate", "share_1080p_change"):
        mean, sem = a[name]
        assert math.isfinite(mean) and sem >= 0, name
    assert set(a) <= set(ab.metric_names())
    # in one A/B test, the % change is the ratio of the paired levels (common random numbers: same
    # users in both arms); a trial reports the mean of its replicates' changes (issue 18)
    one = ab.evaluate_once(PARAMS, seed=3)
    rel, base = one["reliability"][0], one["baseline_reliability"][0]
    assert one["reliability_change"][0] == pytest.approx(100 * (rel / base - 1))
    reps = ab.evaluate_replicates(PARAMS, seed=3)
    assert a["reliability_change"][0] == pytest.approx(sum(r["reliability_change"][0] for r in reps) / len(reps))


def test_ab_test_rejects_bad_configuration():
    with pytest.raises(ValueError, match="n_users"):
        ABTest(n_users=0)
    with pytest.raises(ValueError, match="policy"):
        ABTest(policy="nope")
    with pytest.raises(ValueError, match="compare"):
        ABTest(compare=("ts-asc",))


@pytest.mark.parametrize("low, high, message", [(0.1, 0.1, "empty"), (0.2, 0.1, "reversed"), (float("nan"), 1, "finite")])
def test_range_rejects_empty_reversed_and_nonfinite_bounds(low, high, message):
    with pytest.raises(ValueError, match=message):
        Range("alpha", low, high)


def test_range_parses_command_line_form():
    assert Range.parse("omega_1080=0.001:0.03:log") == Range("omega_1080", 0.001, 0.03, log=True)
    with pytest.raises(ValueError, match="NAME=LOW:HIGH"):
        Range.parse("alpha")


# ---------------------------------------------------------------------- Study: bad input
def test_study_rejects_bad_search_space_and_metrics_before_touching_storage(tmp_path):
    db = tmp_path / "s.sqlite"
    with pytest.raises(ValueError, match="reversed"):
        Study(tiny_ab(), storage=db, parameters=[{"name": "alpha", "low": 0.05, "high": 0.01}])
    with pytest.raises(ValueError, match="empty"):
        Study(tiny_ab(), storage=db, parameters=["alpha=0.01:0.01"])
    with pytest.raises(ValueError, match="reads only alpha"):
        Study(tiny_ab(), storage=db, parameters=["beta=0:1"])
    with pytest.raises(ValueError, match="unknown metric 'nope'"):
        Study(tiny_ab(), storage=db, objective="nope")
    with pytest.raises(ValueError, match="unknown metric 'latency'"):
        Study(tiny_ab(), storage=db, outcome_constraints=["latency <= 3"])
    assert not db.exists()


def test_storage_that_cannot_be_opened_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot open the database.*does not exist"):
        Study(tiny_ab(), storage=f"sqlite:///{tmp_path}/missing/dir/s.sqlite")
    with pytest.raises(ValueError, match=r"storage postgresql://user:\*\*\*@127.0.0.1:1/db: cannot open"):
        Study(tiny_ab(), storage="postgresql://user:secret@127.0.0.1:1/db")


# ---------------------------------------------------------------------- Study: runs
def test_failed_trial_is_marked_failed_and_the_study_goes_on(tmp_path):
    def factory(kind, parameters, env, *, seed, refit_every):
        if parameters["alpha"] > 0.03:
            raise RuntimeError("simulated crash of the A/B test")
        return VideoUploadProblem(**TINY_PROBLEM).make_policy(kind, parameters, env, seed=seed, refit_every=refit_every)

    ab = ABTest(VideoUploadProblem(**TINY_PROBLEM), n_users=300, batches=2, policy_factory=factory)
    study = Study(ab, storage=tmp_path / "s.sqlite", parameters=["alpha=0:0.06"], sobol_trials=4, seed=0)
    events = []
    study.run(trials=3, inline=True, progress=events.append)
    counts = study.counts()
    assert counts["COMPLETED"] == 3 and counts.get("FAILED", 0) >= 1
    failed = [t for t in study.experiment.trials.values() if t.status.name == "FAILED"]
    assert all(t.arm.parameters["alpha"] > 0.03 for t in failed)
    assert any(e["event"] == "failed" and "simulated crash" in e["reason"] for e in events)
    # the failure survives a reload, with its reason
    again = Study.load(tmp_path / "s.sqlite", ab_test=ab)
    assert again.counts() == counts
    assert "simulated crash" in again.experiment.trials[failed[0].index].run_metadata["error"]


def test_study_persists_resumes_reports_and_exports(tmp_path):
    db = tmp_path / "study.sqlite"
    study = Study(tiny_ab(), storage=db, sobol_trials=3, seed=1)
    summary = study.run(trials=4, inline=True)
    assert summary["trials_completed"] == 4 and summary["sim_seconds_per_trial"] > 0
    nodes = [t.run_metadata["node"] for t in study.experiment.trials.values()]
    assert nodes[:3] == ["Sobol"] * 3 and nodes[-1] == "BoTorch"
    gs = study.client._generation_strategy
    bo = gs._nodes[-1].generator_specs[0].generator_kwargs
    assert bo["botorch_acqf_class"].__name__ == "qLogNoisyExpectedImprovement"
    # SEMs reach Ax as known noise
    df = study.experiment.lookup_data().df
    assert (df[df.metric_name == "reliability_change"]["sem"] > 0).all()

    resumed = Study.load(db)  # A/B test rebuilt from the stored description
    assert resumed.ab_test.config() == study.ab_test.config()
    observed_before = resumed.observed()
    resumed.run(trials=5, inline=True)
    assert resumed.counts() == {"COMPLETED": 5}
    assert all(resumed.observed()[i] == m for i, m in observed_before.items())

    out = tmp_path / "report"
    result = write_report(resumed, out)
    assert {"report.md", "trials.csv", "best.json", "study.json", "tradeoff.png", "surfaces.png", "progress.png"} <= {
        p.name for p in out.iterdir()}
    text = (out / "report.md").read_text()
    assert "## The paper's finding" in text and "Vanilla TS" in text and "## Time" in text
    if result["best"] is not None:
        # a recommended trial, or (none confidently feasible, issue 39) the closest ones ranked
        chosen = result["best"] if "parameters" in result["best"] else result["best"]["closest_infeasible"][0]
        assert set(chosen["predicted"]) >= {"q_1080p_change", "reliability_change"}
    from ax.api.client import Client

    snapshot = Client.load_from_json_file(str(out / "study.json"))
    assert len(snapshot._experiment.trials) == 5
    with pytest.raises(ValueError, match="already exists"):
        Study(tiny_ab(), storage=db)


def test_a_study_run_one_trial_at_a_time_is_reproducible():
    def params(study):
        return [dict(t.arm.parameters) for _, t in sorted(study.experiment.trials.items())]

    runs = []
    for _ in range(2):
        study = Study(tiny_ab(compare=()), parameters=["alpha=0:0.06", "omega_1080=0.001:0.03"], sobol_trials=2, seed=5)
        study.run(trials=3, inline=True)
        runs.append((params(study), study.observed()))
    assert runs[0] == runs[1]


def test_two_studies_in_one_process_keep_their_own_databases(tmp_path):
    # Ax keeps one global SQL engine per process; bayes_safe.tuning.storage re-points it per study
    a = Study(tiny_ab(), storage=tmp_path / "a.sqlite", name="a", parameters=["alpha=0:0.06"], sobol_trials=2)
    b = Study(tiny_ab(), storage=tmp_path / "b.sqlite", name="b", parameters=["alpha=0:0.06"], sobol_trials=2)
    a.run(trials=1, inline=True)
    assert tuning_storage.experiment_names(tuning_storage.resolve_url(tmp_path / "a.sqlite")) == ["a"]
    assert tuning_storage.experiment_names(tuning_storage.resolve_url(tmp_path / "b.sqlite")) == ["b"]
    assert Study.load(tmp_path / "a.sqlite").counts() == {"COMPLETED": 1}
    assert Study.load(tmp_path / "b.sqlite").counts() == {}
    del b


# ---------------------------------------------------------------------- the command line
# long job: the command-line study and its resume are also run by test_tuning_crash in the default run
@pytest.mark.long
def test_cli_tune_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["tune", "video-upload", *TINY_CLI, "--trials", "3", "--sobol", "3", "--parallel", "2", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("] trial ") == 3 and "best observed feasible" in printed and "Ax " in printed
    assert "power (a pilot trial" in printed and "minimum detectable change" in printed
    assert {"study.sqlite", "report.md", "trials.csv", "tradeoff.png", "study.json"} <= {p.name for p in out.iterdir()}
    code = main(["tune", "resume", "--out", str(out), "--trials", "4"])
    assert code == 0
    assert "resuming study 'video-upload'" in capsys.readouterr().out
    best = json.loads((out / "best.json").read_text())
    # a recommended trial with its prediction, or (nothing shown feasible) the baseline kept and the trials ranked
    assert best is None or "predicted" in best or (best["recommendation"] == "keep the baseline"
                                                   and best["closest_infeasible"] and "parameters" not in best)
    assert (out / "trials.csv").read_text().count("COMPLETED") == 4
    with pytest.raises(SystemExit) as exc:  # a second study in the same place must be asked for
        main(["tune", "video-upload", *TINY_CLI, "--trials", "1", "--out", str(out)])
    assert exc.value.code == 2 and "already exists" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--parameter", "alpha=0.05:0.01"], "bounds [0.05, 0.01] are reversed"),
    (["--parameter", "alpha=0.02:0.02"], "are empty"),
    (["--objective", "nope"], "unknown metric 'nope'"),
    (["--constraint", "reliability >= 0 * baseline"], "relative"),
    (["--storage", "sqlite:////nonexistent-dir/s.sqlite"], "cannot open the database"),
])
def test_cli_tune_rejects_bad_input_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(["tune", "video-upload", *TINY_CLI, "--trials", "2", "--out", str(out), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_resume_without_a_study_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["tune", "resume", "--out", str(tmp_path / "nothing")])
    assert exc.value.code == 2
    assert "no study database" in capsys.readouterr().err
