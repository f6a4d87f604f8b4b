"""Drift in the service (issue 43, item 4): a model's detected change (adaptive forgetting) is a
``Decider`` fact (``drift_alarms``), a log record (a WARNING of ``bayes_safe.online.decider``), a
``/metrics`` counter (``bayes_safe_drift_alarms_total``), in ``/health`` and ``/posterior``, and a
deterministic function of the decision log: replicas learning the same log rows in the log's
order restart at the same rows, and a one-process Decider restarted from a snapshot replays the
log into the same alarms.

The problem: a conjugate Gaussian reward model with ``forgetting="adaptive"`` and a 0/1
constraint model (``inference="laplace"``, logistic) with ``AdaptiveForgetting(...)``; the world
changes abruptly at ``CHANGE`` (the reward weights flip, the constraint's success rate falls from
0.9 to 0.1).
"""

from __future__ import annotations

import logging

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.models.change_detection import AdaptiveForgetting
from bayes_safe.online import Decider, DecisionLog, ReplicaDecider

F64 = torch.float64
D = 3
CHANGE = 80
LOGGER = "bayes_safe.online.decider"
BEFORE, AFTER = np.array([1.0, 0.5, -0.5]), np.array([-2.0, -0.5, 0.5])


def _policy():
    prior = dist.Normal(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)
    reward = BayesianLinear(prior, noise_std=0.5, forgetting="adaptive")
    constraint = BayesianLinear(prior, likelihood="logistic", inference="laplace",
                                forgetting=AdaptiveForgetting(warmup=10, odds_ratio=4.0))
    return TSASC(reward, [constraint], alpha=0.2)


def _candidates(rng) -> np.ndarray:
    return np.c_[np.ones(4), rng.normal(size=(4, D - 1))]


def _outcome(rng, x, after: bool) -> tuple[float, list[float]]:
    w, p = (AFTER, 0.1) if after else (BEFORE, 0.9)
    return float(x @ w + 0.5 * rng.normal()), [float(rng.random() < p)]


def _stream(decider, rng, steps: range) -> None:
    """``decide`` then ``feedback`` for each step, the world changed from ``CHANGE`` on."""
    for i in steps:
        X = _candidates(rng)
        d = decider.decide(X, baseline=0)
        decider.feedback(d.decision_id, *_outcome(rng, X[d.action], i >= CHANGE))


def _alarm_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and getattr(r, "event", None) == "drift_alarm"]


def _means(policy) -> list[np.ndarray]:
    return [m.posterior_mean.detach().numpy().ravel() for m in policy.models().values()]


def _points(policy) -> dict[str, list[int]]:
    return {role: m.change_points.reshape(-1).tolist() for role, m in policy.models().items()}


def test_an_alarm_is_a_decider_fact_and_a_log_record(caplog):
    decider = Decider(_policy(), num_draws=20, seed=0)
    assert decider.drift_alarms == {"reward": 0, "constraint0": 0}
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _stream(decider, rng, range(CHANGE))
        assert decider.drift_alarms == {"reward": 0, "constraint0": 0} and not _alarm_records(caplog)
        _stream(decider, rng, range(CHANGE, 2 * CHANGE))
    alarms = decider.drift_alarms
    assert alarms["reward"] >= 1 and alarms["constraint0"] >= 1
    assert alarms == {"reward": int(_points(decider.policy)["reward"][0]),
                      "constraint0": int(_points(decider.policy)["constraint0"][0])}
    records = _alarm_records(caplog)
    assert {r.metric for r in records} == {"reward", "constraint0"}
    for metric in ("reward", "constraint0"):
        mine = [r for r in records if r.metric == metric]
        assert [r.alarms for r in mine] == list(range(1, alarms[metric] + 1))  # one record per alarm, in order
        assert all(r.levelno == logging.WARNING and int(r.decision_id) >= CHANGE for r in mine)
        assert metric in mine[0].getMessage() and f"decision {mine[0].decision_id}" in mine[0].getMessage()
    # the restarted models learned only the new world since their alarm
    since = decider.drift_observations
    assert 0 < since["reward"][0] <= CHANGE and 0 < since["constraint0"][0] <= CHANGE


def test_a_decider_restarted_from_its_snapshot_replays_the_same_alarms(tmp_path):
    """One process on an SQLite log: the state saved before the change, the process lost after it;
    ``Decider.load`` replays the log's feedback in its order into the same alarms and posterior."""
    log = tmp_path / "log.sqlite"
    live = Decider(_policy(), num_draws=20, seed=1, log=log, update_every=3)
    rng = np.random.default_rng(1)
    _stream(live, rng, range(CHANGE - 10))
    live.save(tmp_path / "state")
    _stream(live, rng, range(CHANGE - 10, 2 * CHANGE))
    live.refresh()
    again = Decider.load(tmp_path / "state", log=DecisionLog(log))
    again.refresh()
    assert live.drift_alarms["reward"] >= 1 and again.drift_alarms == live.drift_alarms
    assert _points(again.policy) == _points(live.policy)
    assert all(np.array_equal(a, b) for a, b in zip(_means(again.policy), _means(live.policy)))


def test_the_service_exports_the_alarms(tmp_path):
    """A real ``bayes-safe serve`` on 127.0.0.1: the alarms of the saved state, then one raised by
    feedback it received, on ``/metrics``, ``/health``, ``/posterior`` and its stderr."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from serving import ServeProcess, metric_samples

    state, log = tmp_path / "state", tmp_path / "log.sqlite"
    decider = Decider(_policy(), num_draws=20, seed=2, log=log)
    rng = np.random.default_rng(2)
    _stream(decider, rng, range(2 * CHANGE))
    saved = decider.drift_alarms
    assert saved["reward"] >= 1
    decider.save(state)
    decider.log.close()
    server = ServeProcess(state, "--log", log, stderr=tmp_path / "serve.err")
    try:
        samples = metric_samples(server.client.get("/metrics").text)
        for metric, n in saved.items():
            assert samples[("bayes_safe_drift_alarms_total", (("metric", metric),))] == n
            assert ("bayes_safe_drift_observations_since_change", (("arm", ""), ("metric", metric))) in samples
        for _ in range(20):  # the world changes back: the reward model's next alarm, raised in the server
            X = _candidates(rng)
            r = server.client.post("/decide", json={"features": X.tolist(), "baseline": 0})
            assert r.status_code == 200, r.text
            answer = r.json()
            reward, constraints = _outcome(rng, X[answer["action"]], after=False)
            r = server.client.post("/feedback", json={"decision_id": answer["decision_id"], "reward": reward,
                                                      "constraints": constraints})
            assert r.status_code == 200, r.text
        samples = metric_samples(server.client.get("/metrics").text)
        health = server.client.get("/health").json()
        posterior = server.client.get("/posterior").json()
    finally:
        _, stderr = server.kill()
    exported = {m: samples[("bayes_safe_drift_alarms_total", (("metric", m),))] for m in saved}
    assert exported["reward"] > saved["reward"] and exported["constraint0"] >= saved["constraint0"]
    assert health["drift_alarms"] == exported
    assert sum(posterior["models"]["reward"]["change_points"]) == exported["reward"]
    assert posterior["models"]["reward"]["observations_since_change"][0] < 20
    assert "drift alarm: the reward model detected a change" in stderr


def test_replicas_restart_at_the_same_log_rows(tmp_path, postgres_server, caplog):
    """Two replicas on one log, decisions and feedback alternating between them and each syncing on
    its own schedule: the same alarms, at the same decisions, and the same posterior as one process
    learning the log's rows in the log's order. (Replicas share a PostgreSQL log: an SQLite log
    serves one process, ``test_a_decider_restarted_from_its_snapshot_replays_the_same_alarms``.)"""
    url = postgres_server.url()
    Decider(_policy(), num_draws=20, seed=3).save(tmp_path / "state")
    a, b = ReplicaDecider.load(tmp_path / "state", log=url), ReplicaDecider.load(tmp_path / "state", log=url)
    rng = np.random.default_rng(3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for i in range(2 * CHANGE):
            X = _candidates(rng)
            d = (a, b)[i % 2].decide(X, baseline=0)
            (b, a)[i % 3 % 2].feedback(d.decision_id, *_outcome(rng, X[d.action], i >= CHANGE))
            if i % 3 == 2:
                a.sync()
            if i % 7 == 6:
                b.sync()
        a.sync(), b.sync()
    assert a.log_seq == b.log_seq and a.applied == b.applied == 2 * CHANGE
    assert a.drift_alarms == b.drift_alarms and a.drift_alarms["reward"] >= 1 and a.drift_alarms["constraint0"] >= 1
    assert _points(a.policy) == _points(b.policy)
    assert all(np.array_equal(x, y) for x, y in zip(_means(a.policy), _means(b.policy)))
    # the reference: one process, the log's rows in the log's order
    reference = _policy()
    for _, _, y, c, act, K, ctx in DecisionLog(url).feedback_since(0, 1_000_000):
        x = torch.tensor(ctx, dtype=F64).reshape(K, -1)[act][None]
        reference.update(x, torch.tensor([y], dtype=F64), torch.tensor([c], dtype=F64), actions=torch.tensor([act]))
    assert _points(reference) == _points(a.policy)
    assert all(np.abs(x - y).max() < 1e-10 for x, y in zip(_means(reference), _means(a.policy)))
    # each replica logged each alarm once, at the same decision
    records = _alarm_records(caplog)
    assert len(records) == 2 * sum(a.drift_alarms.values())
    seen = sorted((r.metric, r.alarms, r.decision_id) for r in records)
    assert seen[::2] == seen[1::2]


@pytest.mark.parametrize("engine", ["gibbs", "langevin", "nuts", "svi"])
def test_replicas_refuse_a_sampled_model_that_detects_changes_by_name(engine, tmp_path, postgres_server):
    """A sampled engine's change test reads the replica's own draws, so two replicas could restart it
    at different rows: ``ReplicaDecider`` refuses it by name, new or loaded, before it serves."""
    prior = dist.Laplace(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)
    reward = BayesianLinear(prior, noise_std=0.5, inference=engine, forgetting="adaptive")
    policy = TSASC(reward, [BayesianLinear(prior, likelihood="logistic", inference="laplace")], alpha=0.2)
    match = f"policy: the reward model \\(the {engine} engine\\) detects changes"
    with pytest.raises(ValueError, match=match):
        ReplicaDecider(policy, log=postgres_server.url())
    Decider(policy, num_draws=20, seed=0).save(tmp_path / "state")
    with pytest.raises(ValueError, match=match):
        ReplicaDecider.load(tmp_path / "state", log=postgres_server.url())


@pytest.mark.parametrize("engine, options", [
    ("gibbs", {}), ("langevin", {"predict_steps": 20, "burn_in": 10}),
    pytest.param("nuts", {"num_samples": 40, "warmup_steps": 40}, marks=pytest.mark.long),
    pytest.param("svi", {"svi_steps": 500, "num_samples": 50}, marks=pytest.mark.long),
])
def test_one_process_serves_a_sampled_model_that_detects_changes(engine, options, caplog):
    """One process (a ``Decider``) serves a sampled model with adaptive forgetting: the reward's
    change is an alarm, a log record and a ``drift_alarms`` count, and the restarted model has
    learned only the new world since (the flipped weights, read from the model's own summary)."""
    prior = dist.Laplace(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)
    reward = BayesianLinear(prior, noise_std=0.5, inference=engine, forgetting="adaptive", inference_options=options)
    constraint = BayesianLinear(prior, likelihood="logistic", inference="laplace")
    decider = Decider(TSASC(reward, [constraint], alpha=0.2), num_draws=20, seed=0)
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _stream(decider, rng, range(2 * CHANGE + 40))
    assert decider.drift_alarms["reward"] >= 1
    assert any(r.metric == "reward" and int(r.decision_id) >= CHANGE for r in _alarm_records(caplog))
    since = decider.drift_observations["reward"][0]
    assert 0 < since <= CHANGE + 40
    mean, _ = decider.policy.models()["reward"].predict(torch.eye(D, dtype=F64))
    assert float(np.abs(mean.numpy() - AFTER).max()) < 0.5  # the new world's weights, not a mix
