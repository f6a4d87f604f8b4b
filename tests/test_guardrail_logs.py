"""Issue 26, "From logs": every logged metric estimated off-policy, and ``tune decision-log`` tuning the
served TS-ASC's own declared constraints.

Inputs the library did not make:

* a pandas frame of logged dose decisions built here (the dose-finding problem of
  tests/dose_finding.py: covariates, a logging policy spread around the standard dose, a 0/1
  adverse event drawn from the true risk), where the target policy's true AE rate is known;
* a decision log written by a ``Decider`` serving TS-ASC on ``DoseFinding`` with the problem's
  declared constraints (``adverse_event <= 0.05``, absolute, lower is better; ``efficacy >= 0.8 x
  the standard dose's``, a guardrail on the reward). The served AE model is a conjugate Gaussian
  one (the logistic Gibbs model cannot serve in a Decider yet: issue 27). The log's posterior was
  updated once, at its end: the decisions come from the prior, so they cover the doses a riskier
  or a safer setting would give (see ``unsupported`` in bayes_safe/online/tuning.py for a log
  that does not).
"""

from __future__ import annotations

import sqlite3
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyro.distributions as dist
import pytest
import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from dose_finding import AE_CAP, BETA_AE, BETA_EFFICACY, LEVELS, DoseFinding, dose_features

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.offline import LoggedData, estimate_metrics, estimate_ratio

F64 = torch.float64
RISKY = {"tolerance_efficacy": 0.4, "tolerance_adverse_event": 0.3}    # the policy's cap loosened to 0.35
SERVED = {"tolerance_efficacy": 0.2, "tolerance_adverse_event": 0.0}   # the declared bounds themselves
STRICT = {"tolerance_efficacy": 0.4, "tolerance_adverse_event": -0.05}  # cap 0: low doses, low efficacy


# ---------------------------------------------------------------------------------- a logged frame
def _logged_frame(n: int, seed: int):
    """Patients, a logging policy around the standard dose, efficacy and a 0/1 AE; the true tables."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 3, generator=g, dtype=F64)
    x = dose_features(z)                                           # [n, 7, 6]
    risk = torch.sigmoid(x @ BETA_AE)                              # [n, 7] the true AE probability
    efficacy = x @ BETA_EFFICACY
    standard = (3 + torch.round(0.5 * z[:, 0])).clamp(0, LEVELS - 1).long()
    levels = torch.arange(LEVELS)
    pi0 = torch.softmax(-0.6 * (levels - standard[:, None]).abs().to(F64), -1)
    a = torch.multinomial(pi0, 1, generator=g)[:, 0]
    rows = torch.arange(n)
    ae = (torch.rand(n, generator=g, dtype=F64) < risk[rows, a]).double()
    eff = efficacy[rows, a] + 0.5 * torch.randn(n, generator=g, dtype=F64)
    df = pd.DataFrame({"weight": z[:, 0].numpy(), "z2": z[:, 1].numpy(), "z3": z[:, 2].numpy(), "dose": a.numpy(),
                       "efficacy": eff.numpy(), "adverse_event": ae.numpy(), "p": pi0[rows, a].numpy(), "site": "all",
                       **{f"pi0_{k}": pi0[:, k].numpy() for k in range(LEVELS)}},
                      index=[f"patient{i}" for i in range(n)])
    return df, risk, efficacy, standard


def _frame_data(df):
    return LoggedData.from_dataframe(df, context_columns=["weight", "z2", "z3"], action_column="dose",
                                     reward_column="efficacy", propensity_column="p", domain_column="site",
                                     logging_prob_columns=[f"pi0_{k}" for k in range(LEVELS)])


def test_off_policy_ae_rate_of_a_target_policy_matches_the_truth_within_its_interval():
    df, risk, efficacy, standard = _logged_frame(20_000, seed=0)
    data = _frame_data(df)
    # the target: one level above the standard dose most of the time (a riskier setting)
    n = len(df)
    target = torch.full((n, LEVELS), 0.1 / (LEVELS - 1), dtype=F64)
    target[torch.arange(n), (standard + 1).clamp(max=LEVELS - 1)] += 0.9 - 0.1 / (LEVELS - 1)
    true_ae = float((target * risk).sum(1).mean())
    true_eff = float((target * efficacy).sum(1).mean())
    est = estimate_metrics(target, data, df[["adverse_event"]], ("ips", "snips", "dr"), reward="efficacy",
                           n_boot=400, seed=1)
    assert list(est) == ["efficacy", "adverse_event"]
    logged_rate = float(df["adverse_event"].mean())
    for name in ("ips", "snips", "dr"):
        e = est["adverse_event"][name]
        assert e.low <= true_ae <= e.high, (name, e, true_ae)
        assert est["efficacy"][name].low <= true_eff <= est["efficacy"][name].high
        # the estimate is the target's, not the log's own rate (the AE is 0/1: a betting interval, whose se is
        # its larger half-width over 1.96; the log's rate lies outside the interval)
        assert not e.low <= logged_rate <= e.high and abs(e.value - true_ae) < 3 * e.se
    # the frame's column serves a split of the data too (aligned by the frame's index)
    test = data.split((0.5, 0.5), seed=0)["test"]
    rows = torch.as_tensor([int(str(label)[len("patient"):]) for label in test.row_labels])
    part = estimate_metrics(target[rows], test, {"ae": df["adverse_event"]}, "snips", reward=None, n_boot=50)
    assert part["ae"]["snips"].value == pytest.approx(
        estimate_metrics(target[rows], test, {"ae": df["adverse_event"].to_numpy()[rows.numpy()]}, "snips", reward=None,
                         n_boot=50)["ae"]["snips"].value)
    # the relative form: the target's AE over always playing the standard dose
    ratio = estimate_ratio(target, standard, data, df["adverse_event"], "snips", n_boot=400, seed=2)
    true_ratio = true_ae / float(risk[torch.arange(n), standard].mean())
    assert ratio.low <= true_ratio <= ratio.high and ratio.value > 1.5


def test_a_metric_the_log_does_not_carry_is_refused_in_one_line():
    df, *_ = _logged_frame(200, seed=1)
    data = _frame_data(df)
    probs = torch.full((len(df), LEVELS), 1 / LEVELS, dtype=F64)
    gaps = df["adverse_event"].copy()
    gaps.iloc[[3, 7]] = np.nan
    with pytest.raises(ValueError, match=r"metrics\['adverse_event'\]: missing or non-finite values in 2 logged rows, "
                                         r"e\.g\. \['patient3', 'patient7'\]") as info:
        estimate_metrics(probs, data, {"adverse_event": gaps})
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="metrics\\['ae'\\]: a Series of 5 values"):
        estimate_metrics(probs, data, {"ae": df["adverse_event"].iloc[:5].reset_index(drop=True)})


# ---------------------------------------------------------------------------------- a served TS-ASC
def _serve(directory: Path, n: int = 1000, seed: int = 0, pending_from: int | None = None) -> Path:
    """A Decider serving TS-ASC on DoseFinding with the problem's declared constraints; log + state.
    ``pending_from``: the decisions from this one on have their efficacy and no adverse-event outcome yet
    (issue 45: it arrives weeks later)."""
    problem = DoseFinding()
    efficacy = problem.models(1)[0]  # the problem's NIG efficacy model
    ae_prior = dist.Normal(torch.tensor([AE_CAP, 0, 0, 0, 0, 0], dtype=F64), 0.2).to_event(1)
    ae = BayesianLinear(ae_prior, noise_std=0.2, batch_shape=[1])
    policy = TSASC(efficacy, [ae], constraints=problem.constraints, metric_names=problem.metric_names,
                   fallback=problem.fallback)
    from bayes_safe.online import Decider

    decider = Decider(policy, update_every=n, num_draws=100, seed=seed, log=directory / "log.sqlite")
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        units = problem.draw(1, g)
        d = decider.decide(units.features[0].numpy(), baseline=int(units.baseline[0]))
        out = problem.outcomes(units, torch.tensor([d.action]))[0]
        if pending_from is not None and decider.next_id > pending_from:
            decider.feedback(d.decision_id, reward=float(out[0]))  # the adverse event: not known yet
        else:
            decider.feedback(d.decision_id, float(out[0]), [float(out[1])])
    decider.refresh()
    decider.save(directory / "state")
    return directory


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # STRICT's true efficacy ratio depends on the posterior the log left (its cap of 0 plays the dose
    # the AE posterior's draw finds safest): 0.86, 0.83 and 0.78 for seeds 0 to 2. The test needs a
    # log under which it misses the 0.8 guard; its premise is asserted (true_ratio < 0.8) below.
    return _serve(tmp_path_factory.mktemp("served"), seed=2)


def _truth(directory: Path, policy, parameters):
    """The true AE rate and efficacy ratio (vs the logged standard dose) of the trial's TS-ASC on the logged patients."""
    from bayes_safe.online import DecisionLog
    from bayes_safe.tuning.own_problem import policy_constraint

    cons = [policy_constraint(c, parameters[f"tolerance_{c.metric}"]) for c in policy.constraints]
    target = TSASC(policy.reward_model, policy.constraint_models, constraints=cons, metric_names=policy.metric_names)
    log = DecisionLog(directory / "log.sqlite", read_only=True)
    try:
        probs = log.target_probabilities(target, num_draws=100, seed=0)
        frame = log.to_dataframe(with_feedback_only=True)
    finally:
        log.close()
    x = torch.tensor(np.array(frame["context"].tolist()), dtype=F64).reshape(len(frame), LEVELS, -1)
    rows, base = torch.arange(len(frame)), torch.tensor(frame["baseline"].to_numpy(np.int64))
    eff = x @ BETA_EFFICACY
    return float((probs * torch.sigmoid(x @ BETA_AE)).sum(1).mean()), float((probs * eff).sum(1).mean() / eff[rows, base].mean())


def test_a_decision_log_study_checks_every_declared_constraint_in_its_direction(served):
    from bayes_safe.online.tuning import LoggedAlpha
    from bayes_safe.tuning import ABTest, Range, Study

    problem = LoggedAlpha(served / "log.sqlite", served / "state", num_draws=100, n_boot=200)
    assert problem.tune == "constraints"
    assert [p["name"] for p in problem.parameters] == ["tolerance_efficacy", "tolerance_adverse_event"]
    # the cap keeps its direction (<=: lower is better) and the reward's guard is checked too
    assert problem.outcome_constraints == ("efficacy_ratio >= 0.8", "adverse_event <= 0.05", "unsupported <= 0.05")
    ab = ABTest(problem, replicates=1)
    study = Study(ab, parameters=[Range("tolerance_efficacy", 0.0, 0.4), Range("tolerance_adverse_event", -0.05, 0.3)],
                  seed=0)
    trials = {name: ab.evaluate(p, seed=0) for name, p in (("risky", RISKY), ("served", SERVED), ("strict", STRICT))}
    for m in trials.values():
        assert m["unsupported"][0] <= 0.05  # the log covers every trial here
    risky, ok, strict = trials["risky"], trials["served"], trials["strict"]
    # off-policy AE above the cap: infeasible (its efficacy guard is met, so the cap alone decides)
    assert risky["adverse_event"][0] > AE_CAP and risky["efficacy_ratio"][0] >= 0.8
    assert not study.is_feasible(risky)
    # below the cap and above the efficacy guard: feasible
    assert ok["adverse_event"][0] < AE_CAP and ok["efficacy_ratio"][0] >= 0.8 and study.is_feasible(ok)
    # below the cap but under the efficacy guard: infeasible (the guardrail on the reward is checked)
    assert strict["adverse_event"][0] < AE_CAP and strict["efficacy_ratio"][0] < 0.8 and not study.is_feasible(strict)
    # the estimates are those of the trial policies: their true AE rate and efficacy ratio on the logged patients
    true_ae, _ = _truth(served, problem.policy, RISKY)
    assert true_ae > AE_CAP and abs(risky["adverse_event"][0] - true_ae) < 3 * risky["adverse_event"][1]
    _, true_ratio = _truth(served, problem.policy, STRICT)
    assert true_ratio < 0.8 and abs(strict["efficacy_ratio"][0] - true_ratio) < 3 * strict["efficacy_ratio"][1]
    assert ok["baseline_adverse_event"][0] == pytest.approx(risky["baseline_adverse_event"][0])  # one logged baseline


def _status(args) -> int:
    from bayes_safe.cli import main

    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


def test_tune_decision_log_on_the_command_line_tunes_the_declared_constraints(served, tmp_path, capsys):
    import json

    out = tmp_path / "study"
    args = ["tune", "decision-log", "--log", str(served / "log.sqlite"), "--state", str(served / "state"),
            "--trials", "2", "--sobol", "2", "--replicates", "1", "--draws", "30", "--boot", "30", "--no-progress",
            "--parameter", "tolerance_efficacy=0:0.4", "--parameter", "tolerance_adverse_event=-0.03:0.3", "--no-rerun",
            "--out", str(out)]
    assert _status(args) == 0
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 2 and (trials["status"] == "COMPLETED").all()
    best = json.loads((out / "best.json").read_text())
    # the AE rate's interval is the betting one (issue 39): on 1,000 decisions with a few heavy weights it is
    # too wide to confirm a trial feasible at P >= 0.9, and the study then ranks the trials, safest first
    if best["trial"] is None:
        best = {"trial": best["closest_infeasible"][0]["trial"],
                "parameters": best["closest_infeasible"][0]["parameters_tried"]}
    assert set(best["parameters"]) == {"tolerance_efficacy", "tolerance_adverse_event"}
    # one Sobol point loosens the cap and its off-policy AE rate is above it: the chosen point is the other one
    chosen = trials.set_index("trial").loc[best["trial"]]
    assert (trials["adverse_event"] > AE_CAP).any()
    assert chosen["adverse_event"] <= AE_CAP and chosen["efficacy_ratio"] >= 0.8 and chosen["unsupported"] <= 0.05
    report = (out / "report.md").read_text()
    assert "adverse_event <= 0.05" in report and "efficacy_ratio >= 0.8" in report


def test_a_decision_log_without_the_guarded_metric_is_refused_in_one_line(served, tmp_path, capsys):
    from bayes_safe.online.tuning import LoggedAlpha

    log = tmp_path / "no_ae.sqlite"
    with sqlite3.connect(served / "log.sqlite") as src, sqlite3.connect(log) as dst:
        src.backup(dst)  # the whole log, its WAL included (a copy of the file alone can miss the last rows)
    with sqlite3.connect(log) as db:  # an export whose feedback lost the adverse events
        db.execute("UPDATE feedback SET constraints = NULL")
    with pytest.raises(ValueError, match="no value of 'adverse_event'") as info:
        LoggedAlpha(log, served / "state", num_draws=10)
    assert "`adverse_event <= 0.05` cannot be estimated off-policy" in str(info.value) and "\n" not in str(info.value)
    capsys.readouterr()
    code = _status(["tune", "decision-log", "--log", str(log), "--state", str(served / "state"), "--trials", "2",
                    "--no-progress", "--out", str(tmp_path / "study")])
    err = capsys.readouterr().err
    assert code == 2 and "adverse_event" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "study").exists()


def test_the_alpha_study_of_old_settings_still_runs_and_warns_on_declared_constraints(served, tmp_path, capsys):
    from bayes_safe.online.tuning import LegacyAlphaWarning, LoggedAlpha
    from bayes_safe.tuning.ab_test import make_problem

    # a study stored before issue 26 holds alpha_max and min_ratio: it resumes as the alpha study it was
    stored = {"name": "decision-log", "log": str(served / "log.sqlite"), "state": str(served / "state"),
              "alpha_max": 0.5, "min_ratio": 0.9, "num_draws": 10, "n_boot": 10}
    with pytest.warns(LegacyAlphaWarning, match="this alpha study replaces them by alpha"):
        old = make_problem(stored)
    assert old.tune == "alpha" and old.metric_names() == ("reward", "constraint0_ratio")
    assert old.outcome_constraints == ("constraint0_ratio >= 0.9",) and old.config() == stored
    # a new one built from its own config has the declared form
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = LoggedAlpha(served / "log.sqlite", served / "state", num_draws=10, n_boot=10)
        again = make_problem(new.config())
    assert again.tune == "constraints" and again.outcome_constraints == new.outcome_constraints
    # on the command line --min-ratio on a policy that declares constraints is a mistake, said in one line
    capsys.readouterr()
    code = _status(["tune", "decision-log", "--log", str(served / "log.sqlite"), "--state", str(served / "state"),
                    "--min-ratio", "0.9", "--trials", "2", "--no-progress", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "error: --min-ratio: applies to a TS-ASC built with alpha" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_logged_data_study_reports_the_off_policy_mean_of_a_logged_metric(tmp_path):
    from bayes_safe.tuning import LoggedDataProblem

    df, *_ = _logged_frame(3000, seed=2)
    df.to_csv(tmp_path / "doses.csv")
    columns = {"context_columns": ["weight", "z2", "z3"], "action_column": "dose", "reward_column": "efficacy",
               "propensity_column": "p", "domain_column": "site", "metric_columns": ["adverse_event"]}
    problem = LoggedDataProblem(source=str(tmp_path / "doses.csv"), options=columns, method="ips", benchmark=None,
                                epochs=1, n_boot=50)
    assert {"adverse_event", "baseline_adverse_event"} <= set(problem.metric_names())
    m = problem.estimate({"lr": 1e-3}, seed=0)
    assert 0 <= m["adverse_event"][0] <= 1 and m["adverse_event"][1] > 0
    # the logging policy's own rate on the held-out rows, near the frame's overall rate
    assert abs(m["baseline_adverse_event"][0] - df["adverse_event"].mean()) < 4 * m["baseline_adverse_event"][1]
    bad = {**columns, "metric_columns": ["nowhere"]}
    with pytest.raises(ValueError, match=r"no column\(s\) \['nowhere'\]"):
        LoggedDataProblem(source=str(tmp_path / "doses.csv"), options=bad, method="ips", benchmark=None)



def test_a_served_policy_whose_propensities_cannot_be_computed_is_refused_in_one_line(served, tmp_path):
    from bayes_safe.online import Decider
    from bayes_safe.online.tuning import LoggedAlpha

    # the problem's own models: a logistic (Gibbs) AE model, whose chain cannot yet draw one batch of
    # propensity draws after another (issue 27); a state holding it cannot score the logged decisions
    problem = DoseFinding()
    policy = TSASC(*problem.models(1)[:1], problem.models(1)[1:], constraints=problem.constraints,
                   metric_names=problem.metric_names)
    gibbs = Decider.load(served / "state")  # the served Decider (the log is its), with the Gibbs policy
    gibbs.policy = policy
    gibbs.save(tmp_path / "gibbs-state")
    x = torch.as_tensor(dose_features(torch.zeros(1, 3, dtype=F64)))
    try:
        for seed in range(2):
            policy.action_probabilities(x, torch.tensor([3]), num_draws=8, seed=seed)
    except ValueError:
        with pytest.raises(ValueError, match="cannot give the propensities of its decisions") as info:
            LoggedAlpha(served / "log.sqlite", tmp_path / "gibbs-state", num_draws=10)
        assert str(info.value).startswith("state: ") and "\n" not in str(info.value)
    else:  # issue 27 fixed: the state scores the log
        assert LoggedAlpha(served / "log.sqlite", tmp_path / "gibbs-state", num_draws=10).tune == "constraints"


def test_numpy_and_pandas_target_probabilities_give_the_tensor_estimate():
    df, *_ = _logged_frame(500, seed=3)
    data = _frame_data(df)
    probs = np.full((len(df), LEVELS), 1 / LEVELS)
    want = estimate_metrics(torch.as_tensor(probs), data, df[["adverse_event"]], "snips", reward=None, n_boot=20)
    for given in (probs, pd.DataFrame(probs, index=df.index)):
        got = estimate_metrics(given, data, df[["adverse_event"]], "snips", reward=None, n_boot=20)
        assert got["adverse_event"]["snips"].value == want["adverse_event"]["snips"].value
    with pytest.raises(ValueError, match=r"probs: expected shape \[500, 7\]"):
        estimate_metrics(probs[:, :3], data, df[["adverse_event"]], "snips", reward=None)


def test_a_study_estimates_a_pending_guardrail_from_the_rows_where_it_is_known(served, tmp_path):
    """Issue 45: the last 300 of 1,000 logged doses have their efficacy and no adverse-event outcome yet. The
    study keeps the guarded metric (a metric with pending rows used to be dropped from it), says how many
    rows are pending, and estimates the cap from the 700 known rows: within 3 standard errors of the
    estimate from the whole log, where counting the pending as 0 would be 30 % low."""
    from bayes_safe.online.tuning import LoggedAlpha
    from bayes_safe.tuning import ABTest

    late = _serve(tmp_path, seed=2, pending_from=700)
    full = LoggedAlpha(served / "log.sqlite", served / "state", num_draws=100, n_boot=200)
    part = LoggedAlpha(late / "log.sqlite", late / "state", num_draws=100, n_boot=200)
    assert part.outcome_constraints == full.outcome_constraints  # the guarded metric is still in the study
    assert part.pending["adverse_event"] == 300 and full.pending["adverse_event"] == 0
    a, b = ABTest(full, replicates=1).evaluate(RISKY, seed=0), ABTest(part, replicates=1).evaluate(RISKY, seed=0)
    ae_full, ae_part = a["adverse_event"], b["adverse_event"]
    assert abs(ae_part[0] - ae_full[0]) < 3 * ae_part[1], (ae_part, ae_full)
    assert ae_part[0] > 0.85 * ae_full[0]  # not the 0.7x of 300 zeros
    assert ae_part[1] > ae_full[1]  # fewer rows: a wider interval, not a false precision
