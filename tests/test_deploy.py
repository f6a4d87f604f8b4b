"""From a study to a served state in one step (issue 41, item 1): ``bayes-safe deploy``, the
state's provenance, and one meaning of a tolerance in every form.

The study is a user's own problem (``tests/dose_finding.py``: seven dose levels, an efficacy
reward guarded at 0.8 x the standard dose, a 5 % cap on a 0/1 adverse event), tuned for three
trials on the command line; the deployed state is served by a real ``bayes-safe serve``.
"""

from __future__ import annotations

import json
import shutil
import types

import pytest
import torch

from bayes_safe.cli import main
from bayes_safe.envs import Constraint
from bayes_safe.envs.tolerance import TOLERANCE_MEANING, default_range, policy_constraint
from bayes_safe.online import Decider


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    pytest.importorskip("ax")
    out = tmp_path_factory.mktemp("deploy") / "study"
    status = main(["tune", "custom", "--problem", "dose_finding:DoseFinding", "--users", "60", "--batches", "2",
                   "--replicates", "1", "--sobol", "3", "--trials", "3", "--max-violations", "adverse_event=0.5",
                   "--no-rerun", "--no-progress", "--out", str(out)])
    assert status == 0
    return out


def _run(args, capsys) -> tuple[int, str, str]:
    try:
        status = main(args)
    except SystemExit as exc:
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_deploy_serves_exactly_the_recommended_policy_and_records_where_it_came_from(study_dir, tmp_path, capsys):
    from bayes_safe.tuning import Study

    best = json.loads((study_dir / "best.json").read_text())
    assert best.get("parameters"), best.get("recommendation")
    state = tmp_path / "state"
    status, out, err = _run(["deploy", str(study_dir), str(state), "--trust-source"], capsys)
    assert status == 0, err
    assert f"trial {best['trial']} [best.json]" in out and "efficacy >= 0.8 x baseline (declared)" in out
    decider = Decider.load(state)
    policy = decider.policy
    # the study's own problem builds the same policy: its models and every constraint at the tuned bound
    study = Study.load(study_dir / "study.sqlite", trust_source=True)
    expected = study.ab_test.problem.policy_constraints(best["parameters"])
    assert [(c.metric, c.bound, c.at_most, c.versus_baseline, c.declared_bound) for c in policy.constraints] == \
           [(c.metric, c.bound, c.at_most, c.versus_baseline, c.declared_bound) for c in expected]
    assert type(policy).__name__ == "TSASC" and policy.reward_model.noise_prior is not None  # DoseFinding's NIG
    assert policy.constraint_models[0].likelihood == "logistic"
    p = decider.provenance
    assert (p["study"], p["trial"], p["chosen_by"]) == ("dose-finding", best["trial"], "best.json")
    assert p["parameters"] == best["parameters"] and p["p_feasible"] == pytest.approx(best["p_feasible"])
    assert p["problem"] == "dose_finding:DoseFinding" and p["policy"] == "ts-asc"
    assert [b["policy_bound"] for b in p["policy_bounds"]] == pytest.approx([c.bound for c in expected])
    # it decides on the problem's own units
    from dose_finding import DoseFinding

    units = DoseFinding().draw(1, torch.Generator().manual_seed(0))
    d = decider.decide(units.features[0].numpy(), baseline=int(units.baseline[0]))
    assert 0 <= d.action < 7
    # study show prints the provenance of a state, and a study's recommendation
    status, out, _ = _run(["study", "show", str(state)], capsys)
    assert status == 0 and "deployed from study 'dose-finding'" in out and "tolerance_efficacy=" in out
    status, out, _ = _run(["study", "show", str(study_dir)], capsys)
    assert status == 0 and f"bayes-safe deploy {study_dir} STATE_DIR" in out


def test_an_existing_state_is_kept_unless_overwrite(study_dir, tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / "keep.txt").write_text("mine")
    status, _out, err = _run(["deploy", str(study_dir), str(state), "--trust-source"], capsys)
    assert status == 2 and "state_dir" in err and "exists" in err and "Traceback" not in err
    assert (state / "keep.txt").read_text() == "mine"
    status, _, err = _run(["deploy", str(study_dir), str(state), "--trust-source", "--overwrite"], capsys)
    assert status == 0, err
    assert (state / "decider.json").is_file() and not (state / "keep.txt").exists()


def test_a_study_that_keeps_the_baseline_is_refused_unless_a_trial_is_named(study_dir, tmp_path, capsys):
    copy = tmp_path / "study"
    shutil.copytree(study_dir, copy)
    best = json.loads((copy / "best.json").read_text())
    kept = {"trial": None, "confident": False, "confidence": 0.9, "recommendation": "keep the baseline",
            "closest_infeasible": [{"trial": 1}]}
    (copy / "best.json").write_text(json.dumps(kept))
    status, _, err = _run(["deploy", str(copy), str(tmp_path / "s1"), "--trust-source"], capsys)
    assert status == 2 and "recommends: keep the baseline" in err and "--trial N" in err and "trial 1" in err
    assert not (tmp_path / "s1").exists()
    status, _out, err = _run(["deploy", str(copy), str(tmp_path / "s2"), "--trust-source", "--trial", "1"], capsys)
    assert status == 0, err
    p = Decider.load(tmp_path / "s2").provenance
    assert p["trial"] == 1 and p["chosen_by"] == "trial (chosen by hand)" and p["recommendation"] == "keep the baseline"
    status, _, err = _run(["deploy", str(copy), str(tmp_path / "s3"), "--trust-source", "--trial", "99"], capsys)
    assert status == 2 and "trial: 99 is not a completed trial" in err
    del best


def test_a_study_of_the_users_class_needs_consent(study_dir, tmp_path):
    """In a fresh process (here the module is already imported): the stored ``module:Class`` is not
    imported without --trust-source, and nothing is written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]))
    result = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "deploy", str(study_dir), str(tmp_path / "s")],
                            check=False, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "DoseFinding" in result.stderr and "deploy with --trust-source" in result.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.slow  # 7 s (a real serve): in the slow job
def test_health_and_posterior_show_the_provenance(study_dir, tmp_path, capsys):
    pytest.importorskip("fastapi")
    import os
    import subprocess
    import sys
    from pathlib import Path

    from serving import ServeProcess

    state = tmp_path / "state"
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]))
    deployed = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "deploy", str(study_dir), str(state),
                               "--trust-source"], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert deployed.returncode == 0, deployed.stderr
    server = ServeProcess(state, "--log", tmp_path / "log.sqlite", stderr=tmp_path / "serve.err")
    try:
        health = server.client.get("/health").json()
        posterior = server.client.get("/posterior").json()
    finally:
        server.kill()
    assert health["provenance"]["study"] == "dose-finding" and health["provenance"]["parameters"]
    assert posterior["provenance"] == health["provenance"]


@pytest.mark.parametrize("declared", [Constraint.absolute("m", at_most=0.02), Constraint.absolute("m", at_least=3.0),
                                      Constraint.relative("m", at_most=1.05), Constraint.relative("m", at_least=0.95)],
                         ids=["abs-cap", "abs-floor", "rel-cap", "rel-floor"])
def test_a_tolerance_is_the_slack_around_the_declared_limit_in_every_form(declared):
    """``t = 0`` is the declared limit, positive ``t`` looser, by ``t`` in the limit's own units (issue 41:
    a relative tolerance was the factor's distance from 1, so ``t = 0`` served 1.00 x the baseline)."""
    assert policy_constraint(declared, 0.0).bound == pytest.approx(declared.bound)
    looser = policy_constraint(declared, 0.01).bound
    assert looser == pytest.approx(declared.bound + (0.01 if declared.at_most else -0.01))
    r = default_range(declared)
    assert r["low"] < 0 < r["high"]  # the declared limit lies inside the default search range


def test_a_study_stored_under_the_old_meaning_is_refused():
    from bayes_safe.tuning.study import _check_tolerance_meaning

    problem = types.SimpleNamespace(declared=(Constraint.relative("revenue", at_least=0.95),
                                              Constraint.absolute("hide", at_most=0.02)))
    ab = types.SimpleNamespace(problem=problem)
    experiment = types.SimpleNamespace(search_space=types.SimpleNamespace(
        parameters={"tolerance_revenue": None, "tolerance_hide": None}))
    with pytest.raises(ValueError, match="tolerance_revenue.*migration note"):
        _check_tolerance_meaning({}, ab, experiment, "old")
    _check_tolerance_meaning({"tolerance_meaning": TOLERANCE_MEANING}, ab, experiment, "new")  # a new study
    only_absolute = types.SimpleNamespace(search_space=types.SimpleNamespace(parameters={"tolerance_hide": None}))
    _check_tolerance_meaning({}, ab, only_absolute, "old-absolute")  # absolute tolerances did not change
