"""Replicas on one PostgreSQL decision log (issue 29), in process: ``ReplicaDecider`` against a
real PostgreSQL server (``tests/postgres.py``), with a problem written here.

The reference for every posterior is one process: the state's policy updated once with every
feedback row the log holds, in the log's order (``_reference``).
"""

from __future__ import annotations

import json

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.online import Decider, DecisionLog, FeedbackRowsError, ReplicaDecider
from bayes_safe.state import StateError, load_state

F64 = torch.float64
D = 3


def _policy(logistic: bool = False):
    prior = dist.Normal(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)
    reward = BayesianLinear(prior, noise_std=0.5)
    constraint = (BayesianLinear(prior, likelihood="logistic") if logistic
                  else BayesianLinear(prior, noise_prior=dist.InverseGamma(torch.tensor(2.0, dtype=F64), torch.tensor(1.0, dtype=F64))))
    return TSASC(reward, [constraint], alpha=0.2)


def _candidates(rng) -> np.ndarray:
    return rng.normal(size=(4, D))


def _outcome(rng, logistic: bool = False) -> tuple[float, list[float]]:
    return float(rng.normal()), [float(rng.integers(0, 2)) if logistic else float(rng.normal())]


def _reference(state_dir, log: DecisionLog):
    """The state's policy updated with every logged feedback, in the log's order, one process."""
    policy = load_state(state_dir / "policy")
    for _, _, y, c, a, K, ctx in log.feedback_since(0, 1_000_000):
        x = torch.tensor(ctx, dtype=F64).reshape(K, -1)[a][None]
        policy.update(x, torch.tensor([y], dtype=F64), torch.tensor([c], dtype=F64), actions=torch.tensor([a]))
    return policy


def _moments(policy) -> list[np.ndarray]:
    out = []
    for m in policy.models().values():
        out += [m.posterior_mean.detach().numpy().ravel(), m.posterior_covariance.detach().numpy().ravel()]
    return out


def _close(a, b, tol: float = 1e-10) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(_moments(a), _moments(b)))


@pytest.fixture
def state(tmp_path):
    directory = tmp_path / "state"
    Decider(_policy(), seed=3).save(directory)
    return directory


def test_two_replicas_learn_every_feedback_in_the_log_order(state, postgres_server):
    url = postgres_server.url()
    a, b = ReplicaDecider.load(state, log=url), ReplicaDecider.load(state, log=url)
    rng = np.random.default_rng(0)
    ids = []
    for i in range(60):
        replica = (a, b)[rng.integers(0, 2)]
        ids.append(replica.decide(_candidates(rng), baseline=0).decision_id)
    assert len(set(ids)) == 60  # unique across replicas
    for i, decision_id in enumerate(ids):
        if i % 5:  # a fifth never get feedback
            receiver = (a, b)[rng.integers(0, 2)]
            assert receiver.feedback(decision_id, *_outcome(rng)) is True
            # a re-sent outcome at the other replica: acknowledged and ignored
            assert (b if receiver is a else a).feedback(decision_id, *_outcome(rng)) is False
    assert a.sync() == b.sync() == 48
    assert a.model_version == b.model_version == a.applied == 48 and a.log_seq == b.log_seq
    log = DecisionLog(url)
    reference = _reference(state, log)
    assert _close(a.policy, b.policy) == 0.0  # the same rows, the same order, the same numbers
    assert _close(a.policy, reference) < 1e-10
    # a decision records the posterior it was made under: the number of feedback rows it holds
    assert a.decide(_candidates(rng), baseline=0).model_version == 48
    assert a.sync() == 0


def test_an_id_no_replica_issued_is_refused_and_feedback_many_is_all_or_nothing(state, postgres_server):
    url = postgres_server.url()
    a, b = ReplicaDecider.load(state, log=url), ReplicaDecider.load(state, log=url)
    rng = np.random.default_rng(1)
    d0, d1 = a.decide(_candidates(rng), baseline=0), b.decide(_candidates(rng), baseline=0)
    forged = d0.decision_id.split("-")[0] + "-" + "0" * 32
    with pytest.raises(ValueError, match="decision_id: unknown decision"):
        b.feedback(forged, 1.0, [0.0])
    # a valid tag for a number no replica logged (the state's key made it, no decision): unknown too
    with pytest.raises(ValueError, match="decision_id: unknown decision"):
        a.feedback(a.public_id(10**6), 1.0, [0.0])
    with pytest.raises(FeedbackRowsError) as info:
        b.feedback_many([(d0.decision_id, 1.0, [0.0]), (forged, 1.0, [0.0]), (d1.decision_id, "x", [0.0])])
    assert [i for i, _, _ in info.value.problems] == [1, 2]
    assert a.sync() == 0  # nothing written
    assert b.feedback_many([(d0.decision_id, 1.0, [0.5]), (d1.decision_id, 2.0, [0.25]), (d0.decision_id, 3.0, [0.0])],
                           check_only=True) == [True, True, False]
    assert b.feedback_many([(d0.decision_id, 1.0, [0.5]), (d1.decision_id, 2.0, [0.25]),
                            (d0.decision_id, 3.0, [0.0])]) == [True, True, False]
    assert a.feedback(d1.decision_id, 9.0, [9.0]) is False
    assert a.sync() == 2 and b.sync() == 2
    assert _close(a.policy, _reference(state, DecisionLog(url))) < 1e-10


def test_a_replica_snapshot_restarts_without_learning_anything_twice(state, tmp_path, postgres_server):
    url = postgres_server.url()
    a, b = ReplicaDecider.load(state, log=url), ReplicaDecider.load(state, log=url)
    rng = np.random.default_rng(2)
    for _ in range(20):
        d = a.decide(_candidates(rng), baseline=0)
        b.feedback(d.decision_id, *_outcome(rng))
    a.sync()
    a.save(tmp_path / "snap")
    for _ in range(10):  # after the snapshot
        d = b.decide(_candidates(rng), baseline=0)
        a.feedback(d.decision_id, *_outcome(rng))
    meta = json.loads((tmp_path / "snap" / "decider.json").read_text())
    assert meta["replica"]["applied"] == 20
    again = ReplicaDecider.load(tmp_path / "snap", log=url)  # catches up: the 10 rows past its watermark
    assert again.applied == 30 and again.model_version == 30
    b.sync()
    assert _close(again.policy, b.policy) < 1e-10
    assert _close(again.policy, _reference(state, DecisionLog(url))) < 1e-10
    # a restarted replica's decisions take a new block: no id is issued twice
    seen = {again.decide(_candidates(rng), baseline=0).decision_id for _ in range(5)}
    assert not seen & {a.decide(_candidates(rng), baseline=0).decision_id for _ in range(5)}
    # a one-process Decider would learn the log's feedback a second time: refused, naming the way
    with pytest.raises(StateError, match="ReplicaDecider.load"):
        Decider.load(tmp_path / "snap", log=url)


def test_a_one_process_state_with_pending_decisions_becomes_replicas(tmp_path, postgres_server):
    """A state served by one process (PostgreSQL log, decisions pending, feedback queued) is taken
    over by two replicas started at different times: both end at the one-process posterior."""
    url = postgres_server.url()
    rng = np.random.default_rng(3)
    one = Decider(_policy(), log=url, update_every=4, seed=0)
    made = [one.decide(_candidates(rng), baseline=0) for _ in range(12)]
    for d in made[:6]:
        one.feedback(d.decision_id, *_outcome(rng))   # 4 applied, 2 queued
    one.save(tmp_path / "state")
    late = [one.decide(_candidates(rng), baseline=0) for _ in range(3)]  # after the snapshot (a crash loses them from it)
    one.feedback(made[6].decision_id, *_outcome(rng))   # logged after the snapshot
    one.log.close()
    a = ReplicaDecider.load(tmp_path / "state", log=url)
    assert a.applied == 7
    a.feedback(late[0].decision_id, *_outcome(rng))
    a.feedback(made[7].decision_id, *_outcome(rng))
    b = ReplicaDecider.load(tmp_path / "state", log=url)  # later: its watermark is further on
    b.feedback(made[8].decision_id, *_outcome(rng))
    assert a.sync() == 3 and b.sync() == 1
    reference = _reference_from(tmp_path / "state", url)
    assert _close(a.policy, b.policy) < 1e-10 and _close(a.policy, reference) < 1e-10
    assert a.applied == b.applied == 10


def _reference_from(state_dir, url):
    """The one-process answer for a state that began without replicas: a fresh policy (the same
    prior) updated with every logged feedback, in the log's order."""
    policy = _policy()
    for _, _, y, c, a, K, ctx in DecisionLog(url).feedback_since(0, 1_000_000):
        x = torch.tensor(ctx, dtype=F64).reshape(K, -1)[a][None]
        policy.update(x, torch.tensor([y], dtype=F64), torch.tensor([c], dtype=F64), actions=torch.tensor([a]))
    return policy


def test_replicas_of_a_gibbs_constraint_model_learn_the_same_data(tmp_path, postgres_server):
    """Non-conjugate engines: every replica conditions on the same rows in the same order (its
    samples are its own)."""
    url = postgres_server.url()
    Decider(_policy(logistic=True), seed=0).save(tmp_path / "state")
    a, b = ReplicaDecider.load(tmp_path / "state", log=url), ReplicaDecider.load(tmp_path / "state", log=url)
    rng = np.random.default_rng(4)
    for i in range(30):
        d = (a, b)[i % 2].decide(_candidates(rng), baseline=0)
        (b, a)[i % 3 % 2].feedback(d.decision_id, *_outcome(rng, logistic=True))
    assert a.sync() == b.sync() == 30
    ca, cb = a.policy.models()["constraint0"], b.policy.models()["constraint0"]
    assert int(ca.num_observations) == int(cb.num_observations) == 30
    ea, eb = ca.engine, cb.engine  # the Gibbs chains' data: the same rows in the same order
    assert ea.n == eb.n == 30
    assert torch.equal(ea._X[..., :30, :], eb._X[..., :30, :]) and torch.equal(ea._y[..., :30], eb._y[..., :30])
    assert _close_reward(a, b) < 1e-10


def _close_reward(a, b) -> float:
    ra, rb = a.policy.models()["reward"], b.policy.models()["reward"]
    return float((ra.posterior_mean - rb.posterior_mean).abs().max())


def test_replicas_need_a_postgresql_log(state, tmp_path):
    with pytest.raises(ValueError, match="log: replicas share a PostgreSQL decision log"):
        ReplicaDecider.load(state, log=tmp_path / "log.sqlite")
    with pytest.raises(ValueError, match="log: a ReplicaDecider needs"):
        ReplicaDecider.load(state)


@pytest.mark.slow  # moved to the slow job to keep the default run under 15 minutes (2026-11-28)
def test_the_command_line_refuses_a_replica_state_without_replica_in_one_line(state, tmp_path, postgres_server):
    """A state saved by a replica served by one process, or fed a table of outcomes directly,
    would learn its log's feedback a second time: refused, one line naming the way."""
    import subprocess
    import sys

    url = postgres_server.url()
    replica = ReplicaDecider.load(state, log=url)
    d = replica.decide(_candidates(np.random.default_rng(5)), baseline=0)
    replica.feedback(d.decision_id, 1.0, [0.0])
    replica.sync()
    replica.save(state)
    (tmp_path / "outcomes.csv").write_text(f"decision_id,reward,constraint0\n{d.decision_id},1.0,0.0\n")
    for args in (["serve", str(state), "--port", "0", "--log", url],
                 ["feedback", str(state), "--from", str(tmp_path / "outcomes.csv"), "--log", url],
                 ["serve", str(state), "--port", "0", "--replica"]):
        done = subprocess.run([sys.executable, "-m", "bayes_safe.cli", *args], check=False, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert ("ReplicaDecider.load" in done.stderr or "--replica: replicas share one PostgreSQL" in done.stderr), \
            done.stderr


def test_replicas_of_forgetting_models_forget_in_the_log_order(tmp_path, postgres_server):
    """Forgetting (issue 30) is defined on the log's order: every replica, and one process applying
    the logged rows in that order, hold the same discounted posterior."""
    url = postgres_server.url()
    prior = dist.Normal(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)

    def policy():
        return TSASC(BayesianLinear(prior, noise_std=0.5, forgetting=0.9),
                     [BayesianLinear(prior, noise_std=0.5, forgetting=0.9, forgetting_rule="exponential")], alpha=0.2)

    Decider(policy(), seed=0).save(tmp_path / "state")
    a, b = ReplicaDecider.load(tmp_path / "state", log=url), ReplicaDecider.load(tmp_path / "state", log=url)
    rng = np.random.default_rng(6)
    for i in range(25):
        d = (a, b)[i % 2].decide(_candidates(rng), baseline=0)
        (b, a)[i % 3 % 2].feedback(d.decision_id, *_outcome(rng))
    assert a.sync() == b.sync() == 25
    reference = policy()
    for _, _, y, c, act, K, ctx in DecisionLog(url).feedback_since(0, 1_000):
        x = torch.tensor(ctx, dtype=F64).reshape(K, -1)[act][None]
        reference.update(x, torch.tensor([y], dtype=F64), torch.tensor([c], dtype=F64), actions=torch.tensor([act]))
    assert _close(a.policy, b.policy) == 0.0 and _close(a.policy, reference) < 1e-10
