"""The production loop (issue 19): propensities, the Decider, the decision log, restarts.

The problems here are written in this file: a three-arm click problem with one-hot features,
and a two-arm Gaussian posterior whose action probabilities are known in closed form.
"""

from __future__ import annotations

import json
import math
import re
import threading

import numpy as np
import pandas as pd
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.policies import Greedy
from bayes_safe.state import StateError

F64 = torch.float64


def _model(d=3, sd=1.0, noise=0.5):
    return BayesianLinear(dist.Normal(torch.zeros(d, dtype=F64), sd).to_event(1), noise_std=noise, batch_shape=[1])


# ---------------------------------------------------------------------------------- propensities
def test_two_arm_probabilities_match_the_closed_form():
    model = _model(2)
    g = torch.Generator().manual_seed(0)
    X = torch.eye(2, dtype=F64)[torch.randint(0, 2, (30,), generator=g)]
    y = X @ torch.tensor([0.3, 0.1], dtype=F64) + 0.5 * torch.randn(30, generator=g, dtype=F64)
    model.update(X[None], y[None])
    mean, cov = model.posterior_mean[0], model.posterior_covariance[0]
    z = (mean[0] - mean[1]) / (cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]).sqrt()
    exact = float(torch.special.ndtr(z))
    probs, se = ThompsonSampling(model).action_probabilities(np.eye(2), num_draws=20_000, seed=1)
    assert probs.shape == (1, 2) and math.isclose(float(probs.sum()), 1.0)
    assert abs(float(probs[0, 0]) - exact) < 4 * float(se[0, 0]) and 0.2 < exact < 0.98


def test_ts_asc_probabilities_agree_with_repeated_single_decisions():
    policy = TSASC(_model(), [_model()], alpha=0.1)
    feats = torch.tensor(np.random.default_rng(0).normal(size=(1, 4, 3)))
    probs, _ = policy.action_probabilities(feats, baseline=0, num_draws=8000, seed=2)
    g = torch.Generator().manual_seed(3)
    counts = np.bincount([int(policy.select(feats, torch.tensor([0]), generator=g)[0]) for _ in range(3000)], minlength=4)
    freq = counts / 3000
    assert np.all(np.abs(freq - probs[0].numpy()) < 4 * np.sqrt(probs[0].numpy() * (1 - probs[0].numpy()) / 3000) + 1e-3)


def test_a_deterministic_policy_has_propensity_one_and_bad_draw_counts_are_refused():
    probs, se = Greedy(_model()).action_probabilities(np.eye(3), num_draws=10)
    assert probs.sum() == 1 and probs.max() == 1 and se.max() == 0
    with pytest.raises(ValueError, match="num_draws"):
        ThompsonSampling(_model()).action_probabilities(np.eye(3), num_draws=0)


# ---------------------------------------------------------------------------------- the loop
RATES = np.array([0.30, 0.36, 0.33])


def _click(action, rng):
    return float(rng.random() < RATES[action])


def _served_clicks(log, decisions: int, *, update_every: int, num_draws: int, seed: int, clicks_seed: int) -> Decider:
    """TS served on the 3-arm click problem for ``decisions`` decisions, each with its feedback at once."""
    decider = Decider(ThompsonSampling(_model(3, sd=0.5)), update_every=update_every, num_draws=num_draws, seed=seed,
                      log=log)
    rng = np.random.default_rng(clicks_seed)
    for _ in range(decisions):
        d = decider.decide(np.eye(3))
        decider.feedback(d.decision_id, _click(d.action, rng))
    return decider


def test_ips_from_the_decision_log_recovers_a_target_policys_value(tmp_path):
    """Serve TS on a 3-arm click problem; the logged propensities make IPS of the uniform policy unbiased."""
    decider = _served_clicks(tmp_path / "log.sqlite", 2500, update_every=25, num_draws=400, seed=4, clicks_seed=5)
    logged = decider.log.to_logged_data()
    w = (1 / 3) / logged.propensities.numpy()
    r = logged.rewards.numpy().astype(np.float64)
    ips, se = float(np.mean(w * r)), float(np.std(w * r) / np.sqrt(len(r)))
    assert abs(ips - RATES.mean()) < 3 * se
    # obp's dictionary carries the same rows
    fb = decider.log.to_obp()
    assert fb["n_rounds"] == 2500 and np.allclose(fb["pscore"], logged.propensities.numpy())


def test_delayed_out_of_order_duplicate_and_unknown_feedback():
    decider = Decider(ThompsonSampling(_model(3)), update_every=4, seed=0)
    decisions = [decider.decide([[1, 0, 0], [0, 1, 0], [0, 0, 1]]) for _ in range(6)]
    # '<number>-<32 hex digits>': numbered in order, each signed (not guessable from another)
    assert [d.decision_id.split("-")[0] for d in decisions] == [str(i) for i in range(6)]
    assert all(re.fullmatch(r"\d+-[0-9a-f]{32}", d.decision_id) for d in decisions)
    assert decisions[0].decision_id == decider.public_id(0)
    for d in reversed(decisions[2:]):  # out of order, two never arrive
        assert decider.feedback(d.decision_id, 1.0) is True
    assert decider.model_version == 1 and sorted(decider.pending) == ["0", "1"]
    assert decider.feedback(decisions[3].decision_id, 0.0) is False  # duplicate: ignored
    # anything but an issued id is unknown, with one message that says nothing of what exists
    first = decisions[0].decision_id
    forged = [first.split("-")[0] + "-" + "0" * 32, "0" + decisions[5].decision_id, "6-" + first.split("-")[1],
              "0", "05", "nope", decisions[5].decision_id.upper(), 3]
    messages = set()
    for bad in forged:
        with pytest.raises(ValueError, match="decision_id: unknown decision") as err:
            decider.feedback(bad, 1.0)
        messages.add(str(err.value).split(":", 2)[2])
    assert len(messages) == 1 and "0 to" not in str(err.value) and "'5'" not in str(err.value)
    assert decider.feedback(decisions[0].decision_id, 1.0) is True and len(decider.queued) == 1


def test_every_everyday_input_gives_the_same_decision():
    X = np.random.default_rng(1).normal(size=(4, 3))
    names = ["age", "price", "hour"]
    inputs = [X, X.tolist(), torch.tensor(X, dtype=torch.float32).double(), pd.DataFrame(X, columns=names),
              pd.DataFrame(X, columns=names)[["hour", "age", "price"]],
              [dict(zip(names, row)) for row in X]]
    actions = []
    for x in inputs:
        decider = Decider(ThompsonSampling(_model()), feature_names=names, seed=3)
        actions.append(decider.decide(x).action)
    assert len(set(actions)) == 1


@pytest.mark.parametrize("features, match", [
    ({"age": 1.0, "price": 2.0}, r"missing feature\(s\) \['hour'\]"),
    ({"age": 1.0, "price": 2.0, "hour": 3.0, "zip": 1.0}, r"unexpected feature\(s\) \['zip'\]"),
    (np.array([[1.0, np.nan, 0.0]]), "NaN"),
    ("abc", "features"),
])
def test_bad_contexts_are_refused_by_name(features, match):
    from bayes_safe.models import PerArmLinear

    per_arm = PerArmLinear(dist.Normal(torch.zeros(3, dtype=F64), 1.0).to_event(1), num_arms=2, noise_std=0.5,
                           batch_shape=[1])
    decider = Decider(ThompsonSampling(per_arm), feature_names=["age", "price", "hour"])
    with pytest.raises((ValueError, TypeError), match=match):
        decider.decide(features)


def test_a_per_arm_policy_decides_from_one_named_context():
    from bayes_safe.models import PerArmLinear

    per_arm = PerArmLinear(dist.Normal(torch.zeros(2, dtype=F64), 1.0).to_event(1), num_arms=3, noise_std=0.5,
                           batch_shape=[1])
    decider = Decider(ThompsonSampling(per_arm), feature_names=["x", "y"], update_every=1)
    d = decider.decide(pd.Series({"y": 0.5, "x": 1.0}))
    assert 0 <= d.action < 3 and math.isclose(sum(d.probabilities), 1.0)
    decider.feedback(d.decision_id, 1.0)
    assert decider.model_version == 1


def test_restart_keeps_the_posterior_and_accepts_feedback_for_earlier_decisions(tmp_path):
    policy = TSASC(_model(), [_model()], alpha=0.05)
    decider = Decider(policy, update_every=3, seed=7, log=tmp_path / "log.sqlite")
    rng = np.random.default_rng(0)
    ds = [decider.decide(rng.normal(size=(4, 3)), baseline=0) for _ in range(8)]
    for d in ds[:5]:
        decider.feedback(d.decision_id, 1.0, [0.0])
    decider.save(tmp_path / "state")
    back = Decider.load(tmp_path / "state", log=decider.log)
    assert back.next_id == 8 and sorted(back.pending) == ["5", "6", "7"] and len(back.queued) == 2
    assert torch.equal(back.policy.reward_model.posterior_mean, policy.reward_model.posterior_mean)
    assert back.feedback(ds[6].decision_id, 0.0, [1.0]) is True    # decided before the restart
    assert back.feedback(ds[0].decision_id, 1.0, [0.0]) is False   # applied before the restart: the log knows
    x = rng.normal(size=(4, 3))
    assert decider.decide(x, baseline=0).action == Decider.load(tmp_path / "state").decide(x, baseline=0).action


def test_a_tampered_or_foreign_state_is_refused_without_running_anything(tmp_path):
    Decider(ThompsonSampling(_model())).save(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "decider.json").read_text())
    (tmp_path / "s" / "decider.json").write_text(json.dumps(meta | {"version": 99}))
    with pytest.raises(StateError, match="format version 99"):
        Decider.load(tmp_path / "s")
    (tmp_path / "s" / "decider.json").write_text(json.dumps(meta | {"pending": {"1": {"features": "x"}}}))
    with pytest.raises(StateError, match="malformed"):
        Decider.load(tmp_path / "s")
    (tmp_path / "s" / "decider.json").write_text("{not json")
    with pytest.raises(StateError, match="not JSON"):
        Decider.load(tmp_path / "s")


def test_concurrent_feedback_for_one_decision_counts_once(tmp_path):
    decider = Decider(ThompsonSampling(_model()), log=DecisionLog(tmp_path / "log.sqlite"), update_every=1)
    d = decider.decide(np.eye(3))
    results = []
    threads = [threading.Thread(target=lambda: results.append(decider.feedback(d.decision_id, 1.0))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert decider.model_version == 1
    assert len(decider.log.to_dataframe(with_feedback_only=True)) == 1


def test_decider_refuses_batched_models_and_bad_settings():
    with pytest.raises(ValueError, match="batch_shape=\\[1\\]"):
        Decider(ThompsonSampling(BayesianLinear(dist.Normal(torch.zeros(3, dtype=F64), 1.0).to_event(1),
                                                noise_std=0.5, batch_shape=[4])))
    with pytest.raises(ValueError, match="num_draws"):
        Decider(ThompsonSampling(_model()), num_draws=1)
    with pytest.raises(ValueError, match="update_every"):
        Decider(ThompsonSampling(_model()), update_every=0)


def _bcts():
    from bayes_safe.policies.bcts import BCTS

    policy = BCTS(0.5, 4, 3, batch_shape=[1])
    g = torch.Generator().manual_seed(0)

    def teacher(step, generator):  # arm 2 is never allowed
        x = torch.randn(1, 3, generator=g, dtype=F64)
        return x[:, None, :].expand(1, 4, 3), torch.tensor([[True, True, False, True]])

    policy.learn_constraints(teacher, 200, torch.Generator().manual_seed(1))
    return policy, {}


def _probit_ts_asc():
    from bayes_safe.models import ProbitGP, ScaledOutcome, SuccessProbability

    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 3, generator=g, dtype=F64)
    y = (0.3 * X[:, 0] + torch.randn(200, generator=g, dtype=F64) > 0).double()
    gp = ProbitGP(3, hidden=(8, 3), refit_every=None, nn_epochs=2, nn_min_steps=30, gp_epochs=1, seed=0)
    gp.update(X, y)
    gp.fit()
    return TSASC(ScaledOutcome(gp, [1.0, 1.02, 1.04, 1.06]), SuccessProbability(gp), alpha=0.2), {"baseline": 0}


@pytest.mark.parametrize("build", [_bcts, _probit_ts_asc], ids=["bcts", "probit-gp-ts-asc"])
def test_probabilities_of_other_thompson_policies_agree_with_their_decisions(build):
    policy, kw = build()
    feats = torch.tensor(np.random.default_rng(2).normal(size=(1, 4, 3)))
    probs, _ = policy.action_probabilities(feats, num_draws=4000, seed=3, **kw)
    assert math.isclose(float(probs.sum()), 1.0)
    g = torch.Generator().manual_seed(4)
    base = {"baseline": torch.tensor([kw["baseline"]])} if kw else {}
    counts = np.bincount([int(policy.select(feats, generator=g, **base)[0]) for _ in range(1500)], minlength=4)
    p = probs[0].numpy()
    assert np.all(np.abs(counts / 1500 - p) < 4 * np.sqrt(p * (1 - p) / 1500 + p * (1 - p) / 4000) + 2e-3)


def test_the_log_reads_back_when_only_some_feedback_has_constraints(tmp_path):
    log = DecisionLog(tmp_path / "log.sqlite")
    for i in range(3):
        log.write_decision(str(i), 0, 0.5, 0.01, 0, [1.0, 2.0], [0.5, 0.5])
    log.write_feedback("0", 1.0, [0.0])
    log.write_feedback("1", 0.0)
    frame = log.to_dataframe()
    assert frame["constraints"].tolist()[:2] == [[0.0], None] and frame["constraints"].iloc[2] is None


def test_the_decision_log_is_a_source_of_the_logged_data_tuning(tmp_path):
    from bayes_safe.tuning.logged import LoggedDataProblem

    decider = _served_clicks(tmp_path / "log.sqlite", 400, update_every=20, num_draws=200, seed=1, clicks_seed=2)
    decider.log.close()
    problem = LoggedDataProblem(source=str(tmp_path / "log.sqlite"), method="ips", benchmark=None, epochs=2, n_boot=20)
    metrics = problem.estimate({"lr": 1e-3}, seed=0)
    assert 0.0 <= metrics["reward"][0] <= 1.0 and metrics["reward"][1] > 0
    with pytest.raises(ValueError, match="options: a decision log"):
        LoggedDataProblem(source=str(tmp_path / "log.sqlite"), options={"context_columns": ["x"]}, method="ips",
                          benchmark=None)
    (tmp_path / "other.sqlite").write_bytes(b"not a database at all, just text")
    with pytest.raises(ValueError, match="not a decision log"):
        LoggedDataProblem(source=str(tmp_path / "other.sqlite"), method="ips", benchmark=None)
    assert (tmp_path / "other.sqlite").read_bytes() == b"not a database at all, just text"  # untouched


def test_another_alpha_is_evaluated_off_policy_from_the_log(tmp_path):
    """Serve TS-ASC(alpha = 0.3), then estimate TS-ASC(alpha = 0) on the learned posterior from the log."""
    from bayes_safe.offline import ips, snips

    mu_reward = np.array([0.30, 0.50, 0.45])
    mu_safe = np.array([0.80, 0.60, 0.78])  # arm 1 pays most but is less safe than the baseline arm 0
    logging = TSASC(_model(3, sd=0.5), [_model(3, sd=0.5)], alpha=0.3)
    decider = Decider(logging, update_every=50, num_draws=300, seed=6, log=tmp_path / "log.sqlite")
    rng = np.random.default_rng(7)
    for _ in range(1500):
        d = decider.decide(np.eye(3), baseline=0)
        decider.feedback(d.decision_id, float(rng.random() < mu_reward[d.action]),
                         [float(rng.random() < mu_safe[d.action])])
    data = decider.log.to_logged_data()
    target = TSASC(logging.reward_model, logging.constraint_models, alpha=0.0)  # the same posterior, stricter
    probs = decider.log.target_probabilities(target, num_draws=300, seed=1)
    assert probs.shape == (1500, 3) and torch.allclose(probs.sum(-1), torch.ones(1500, dtype=F64))
    truth = float(probs.mean(0) @ torch.tensor(mu_reward))  # fixed candidates: the value of the target's mix
    estimate = snips(probs, data)
    w = (probs[torch.arange(1500), data.actions] / data.propensities).numpy()
    se = float(np.std(w * data.rewards.numpy()) / np.sqrt(1500))
    assert abs(estimate - truth) < 3 * se + 0.01 and abs(ips(probs, data) - truth) < 3 * se + 0.01


# ---------------------------------------------------------------------------------- the log and the snapshot
def _logged_decider(path, n=6, feedback=3, seed=0):
    decider = Decider(TSASC(_model(), [_model()], alpha=0.2), update_every=1, num_draws=50, seed=seed, log=path)
    ds = [decider.decide(np.eye(3), baseline=0) for _ in range(n)]
    for d in ds[:feedback]:
        decider.feedback(d.decision_id, 1.0, [1.0])
    return decider


def _copy_log(src: DecisionLog, dst):
    """A consistent copy of a live log (SQLite's backup API), as a backup tool would make it."""
    import sqlite3

    with sqlite3.connect(dst) as out:
        src._db.backup(out)
    return dst


def _fingerprint(tmp_path, log_path):
    """What loading must not change: the log's rows and every file of the state directory."""
    import sqlite3

    with sqlite3.connect(log_path) as db:
        rows = (db.execute("SELECT * FROM decisions ORDER BY decision_id").fetchall(),
                db.execute("SELECT * FROM feedback ORDER BY decision_id").fetchall())
    files = {p: p.read_bytes() for p in sorted((tmp_path / "state").rglob("*")) if p.is_file()}
    return rows, files


def _refused(tmp_path, log_path, match):
    before = _fingerprint(tmp_path, log_path)
    with pytest.raises(StateError, match=match) as exc:
        Decider.load(tmp_path / "state", log=log_path)
    message = str(exc.value)
    assert message.startswith(f"{log_path}: not the decision log of the state {tmp_path / 'state' / 'decider.json'}")
    assert _fingerprint(tmp_path, log_path) == before  # nothing was applied, written or replayed
    return message


def test_a_log_of_another_decider_is_refused_naming_both(tmp_path):
    ours = _logged_decider(tmp_path / "ours.sqlite")
    ours.save(tmp_path / "state")
    theirs = _logged_decider(tmp_path / "theirs.sqlite", seed=1)  # same counters, another Decider
    theirs.log.close()
    message = _refused(tmp_path, tmp_path / "theirs.sqlite", "the log of another Decider")
    assert ours.decider_id in message and theirs.decider_id in message
    back = Decider.load(tmp_path / "state", log=tmp_path / "ours.sqlite")  # its own log loads
    assert back.replayed == {"decisions": 0, "feedback": 0} and sorted(back.pending) == ["3", "4", "5"]


def test_a_log_older_than_the_snapshot_is_refused(tmp_path):
    live = _logged_decider(tmp_path / "log.sqlite", n=4, feedback=2)
    _copy_log(live.log, tmp_path / "backup.sqlite")  # the log as it was at 4 decisions, 2 feedback
    live.decide(np.eye(3), baseline=0)
    live.save(tmp_path / "state")
    message = _refused(tmp_path, tmp_path / "backup.sqlite", "older than the snapshot")
    assert "ids up to 4 but the log's last is 3" in message
    # the same counters, but the snapshot applied feedback the older log has not got
    live.feedback(live.public_id(2), 0.5, [1.0])
    live.save(tmp_path / "state")
    _copy_log(live.log, tmp_path / "backup2.sqlite")
    live.feedback(live.public_id(3), 0.5, [1.0])
    live.save(tmp_path / "state")
    assert "applied feedback for decision(s) ['3']" in _refused(tmp_path, tmp_path / "backup2.sqlite", "older")


def test_log_ids_past_the_counter_that_a_crash_cannot_explain_are_refused(tmp_path):
    live = _logged_decider(tmp_path / "log.sqlite", n=4, feedback=0)
    live.save(tmp_path / "state")
    live.decide(np.eye(3), baseline=0)  # '4': after the snapshot, as before a crash: fine
    live.log.write_decision("9", 0, 0.5, 0.1, 0, np.eye(3).ravel(), [0.5, 0.25, 0.25], 0)  # '5' to '8' missing
    message = _refused(tmp_path, tmp_path / "log.sqlite", "past the state's counter 4")
    assert "2 decisions past the state's counter 4 with ids up to 9" in message


def test_foreign_ids_feedback_without_decisions_and_changed_actions_are_refused(tmp_path):
    live = _logged_decider(tmp_path / "log.sqlite", n=3, feedback=1)
    live.save(tmp_path / "state")
    log = live.log
    log.write_decision("user-7", 0, 0.5, 0.1, 0, np.eye(3).ravel(), [0.5, 0.25, 0.25], 0)
    _refused(tmp_path, tmp_path / "log.sqlite", "1 of its decision ids were not issued by a Decider")
    log._db.execute("DELETE FROM decisions WHERE decision_id = 'user-7'")
    log.write_feedback("7", 1.0, [1.0])
    _refused(tmp_path, tmp_path / "log.sqlite", r"feedback for decision\(s\) \['7'\] but not the decisions")
    log._db.execute("DELETE FROM feedback WHERE decision_id = '7'")
    pending_action = live.pending["2"]["action"]
    log._db.execute("UPDATE decisions SET action = ? WHERE decision_id = '2'", ((pending_action + 1) % 3,))
    _refused(tmp_path, tmp_path / "log.sqlite", f"decision '2' played action {pending_action} in the state")


def test_a_new_decider_refuses_a_log_that_already_has_decisions(tmp_path):
    _logged_decider(tmp_path / "log.sqlite").log.close()
    with pytest.raises(StateError, match="another Decider"):
        Decider(ThompsonSampling(_model()), log=tmp_path / "log.sqlite")
    legacy = DecisionLog(tmp_path / "legacy.sqlite")  # rows written without a Decider: no owner recorded
    legacy.write_decision("0", 0, 1.0, 0.0, 0, [1.0, 0.0], [1.0, 0.0])
    with pytest.raises(StateError, match="already holds 1 decisions; a new Decider starts at id '0'"):
        Decider(ThompsonSampling(_model()), log=legacy)


def test_a_state_saved_without_a_log_starts_a_new_one_at_its_counter(tmp_path):
    """A fresh log for a state that has decided before (log rotation): its feedback still counts."""
    decider = Decider(TSASC(_model(), [_model()], alpha=0.2), num_draws=50, seed=0)
    ds = [decider.decide(np.eye(3), baseline=0) for _ in range(3)]
    decider.save(tmp_path / "state")
    back = Decider.load(tmp_path / "state", log=tmp_path / "new.sqlite")
    assert back.log.identity() == {"decider_id": decider.decider_id, "first_id": 3}
    assert back.feedback(ds[0].decision_id, 1.0, [1.0]) and back.decide(np.eye(3), baseline=0).decision_id == back.public_id(3)
    back.save(tmp_path / "state")
    again = Decider.load(tmp_path / "state", log=tmp_path / "new.sqlite")  # feedback for '0' (before the log): fine
    assert again.replayed == {"decisions": 0, "feedback": 0} and sorted(again.pending) == ["1", "2", "3"]


def test_a_deterministic_policy_decides_with_propensity_one(tmp_path):
    decider = Decider(Greedy(_model()), log=tmp_path / "log.sqlite")
    d = decider.decide(np.eye(3))
    assert d.propensity == 1.0 and d.propensity_se == 0.0 and sorted(d.probabilities) == [0.0, 0.0, 1.0]
    assert decider.log.to_dataframe()["propensity"].tolist() == [1.0]


def test_replaying_the_same_snapshot_and_log_gives_the_same_next_decisions(tmp_path):
    """After a crash the random stream is reseeded from (seed, counter): recovery is reproducible,
    and does not repeat the draws of the decisions the snapshot did not hold."""
    live = _logged_decider(tmp_path / "log.sqlite", n=3, feedback=1)
    live.save(tmp_path / "state")
    lost = [live.decide(np.eye(3) * (i + 1), baseline=0).probabilities for i in range(4)]  # then a crash
    backs = [Decider.load(tmp_path / "state", log=_copy_log(live.log, tmp_path / f"copy{i}.sqlite")) for i in range(2)]
    assert backs[0].replayed == backs[1].replayed == {"decisions": 4, "feedback": 0}
    nexts = [[b.decide(np.eye(3) * (i + 1), baseline=0) for i in range(4)] for b in backs]
    assert [d.probabilities for d in nexts[0]] == [d.probabilities for d in nexts[1]]
    assert [d.decision_id for d in nexts[0]] == [backs[0].public_id(i) for i in (7, 8, 9, 10)]
    assert [d.probabilities for d in nexts[0]] != lost


def test_tuning_alpha_from_a_log_checks_its_inputs_first(tmp_path):
    from bayes_safe.online.tuning import LoggedAlpha

    with pytest.raises(FileNotFoundError, match="log: no such decision log"):
        LoggedAlpha(tmp_path / "missing.sqlite", tmp_path / "state")
    ts = Decider(ThompsonSampling(_model()), log=tmp_path / "ts.sqlite")
    d = ts.decide(np.eye(3))
    ts.feedback(d.decision_id, 1.0)
    ts.save(tmp_path / "ts-state")
    with pytest.raises(ValueError, match="holds a ThompsonSampling, not TS-ASC"):
        LoggedAlpha(tmp_path / "ts.sqlite", tmp_path / "ts-state")
    live = _logged_decider(tmp_path / "log.sqlite", n=4, feedback=4)
    live.save(tmp_path / "state")
    problem = LoggedAlpha(tmp_path / "log.sqlite", tmp_path / "state", num_draws=20, n_boot=10)
    assert problem.metric_names() == ("reward", "constraint0_ratio")
    assert problem.outcome_constraints == ("constraint0_ratio >= 0.9",)
    estimate = problem.estimate({"alpha": 0.1}, seed=0)
    assert estimate["reward"][0] == pytest.approx(1.0) and estimate["constraint0_ratio"][0] == pytest.approx(1.0)


def test_a_read_only_log_loads_for_inspection(tmp_path):
    live = _logged_decider(tmp_path / "log.sqlite", n=5, feedback=2)
    live.save(tmp_path / "state")
    live.feedback(live.public_id(2), 0.0, [1.0])  # after the snapshot
    back = Decider.load(tmp_path / "state", log=DecisionLog(tmp_path / "log.sqlite", read_only=True))
    assert back.replayed == {"decisions": 0, "feedback": 1} and back.model_version == live.model_version


def _status(args) -> int:
    """The exit status of ``bayes-safe ARGS`` run in this process (argparse errors exit)."""
    from bayes_safe.cli import main

    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


@pytest.mark.slow  # moved to the slow job to keep the default run under 15 minutes (2026-11-28)
def test_tune_decision_log_on_the_command_line_tunes_alpha_and_resumes(tmp_path, capsys):
    main = _status

    rng = np.random.default_rng(3)
    live = Decider(TSASC(_model(), [_model()], alpha=0.1), log=tmp_path / "log.sqlite", num_draws=50, seed=0)
    for _ in range(60):  # a served TS-ASC: candidates [3, 3], a baseline, delayed 0/1 feedback
        d = live.decide(np.eye(3), baseline=0)
        live.feedback(d.decision_id, float(rng.uniform() < RATES[d.action]), [float(rng.uniform() < 0.9)])
    live.save(tmp_path / "state")
    out = tmp_path / "study"
    args = ["tune", "decision-log", "--log", str(tmp_path / "log.sqlite"), "--state", str(tmp_path / "state"),
            "--trials", "3", "--sobol", "3", "--replicates", "1", "--draws", "20", "--boot", "20", "--no-progress",
            "--out", str(out)]
    assert main(args) == 0
    trials = (out / "trials.csv").read_text().splitlines()
    assert len(trials) == 1 + 3 and all(",COMPLETED," in t for t in trials[1:])
    best = json.loads((out / "best.json").read_text())
    assert set(best["parameters"]) == {"alpha"} and 0 <= best["parameters"]["alpha"] <= 0.5
    # the log and the state lie outside the study's directory: resume shows them and asks to confirm
    capsys.readouterr()
    assert main(["tune", "resume", "--out", str(out), "--trials", "4", "--no-progress"]) == 2
    assert "--trust-source: the stored study reads its decision log from" in capsys.readouterr().err
    assert main(["tune", "resume", "--out", str(out), "--trials", "4", "--trust-source", "--no-progress"]) == 0
    assert len((out / "trials.csv").read_text().splitlines()) == 1 + 4


def test_tune_decision_log_refuses_bad_input_in_one_line(tmp_path, capsys):
    main = _status

    live = _logged_decider(tmp_path / "log.sqlite", n=4, feedback=4)
    live.save(tmp_path / "state")
    common = ["--trials", "2", "--no-progress", "--out", str(tmp_path / "study")]
    cases = [
        (["--log", str(tmp_path / "missing.sqlite"), "--state", str(tmp_path / "state")], "--log: no such decision log"),
        (["--log", str(tmp_path / "log.sqlite"), "--state", str(tmp_path / "state"), "--alpha-max", "2"], "--alpha-max"),
        (["--log", str(tmp_path / "log.sqlite"), "--state", str(tmp_path / "nowhere")], "nowhere"),
    ]
    for extra, match in cases:
        assert main(["tune", "decision-log", *extra, *common]) == 2
        err = capsys.readouterr().err
        assert match in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
        assert not (tmp_path / "study").exists()


def test_the_saved_id_key_is_readable_by_its_owner_only(tmp_path):
    """``decider.json`` holds the key that signs decision ids: mode 0600 whatever the umask (issue 40;
    it was 0644 under umask 022)."""
    import os
    import stat

    prior = dist.Normal(torch.zeros(2, dtype=torch.float64), 1.0).to_event(1)
    old = os.umask(0o022)
    try:
        Decider(ThompsonSampling(BayesianLinear(prior, noise_std=1.0)), seed=0).save(tmp_path / "state")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "state" / "decider.json").stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert "id_key" in json.loads((tmp_path / "state" / "decider.json").read_text())
