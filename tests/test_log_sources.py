"""Tuning and off-policy evaluation from the log of any deployment (issue 41, item 3).

``bayes-safe tune decision-log`` and ``LoggedAlpha`` read a PostgreSQL log (a URL, never turned
into a path, never shown with its password), a state saved by a replica as well as by a
one-process service (read only: ``bayes_safe.online.replica.saved_policy``), and refuse a state
that did not write the log, in one line naming both (the checks ``Decider.load`` and
``ReplicaDecider.load`` make).
"""

from __future__ import annotations

import re

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.cli import main
from bayes_safe.online import Decider, DecisionLog, ReplicaDecider
from bayes_safe.online.replica import saved_policy
from bayes_safe.online.tuning import LoggedAlpha
from bayes_safe.state import StateError

F64 = torch.float64
D, K = 3, 4
SECRET = "hunter2-secret"
#: the log of the other Decider's replica (set by the fixture)
OTHER_URL: list[str] = []


def _policy():
    prior = dist.Normal(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)
    reward = BayesianLinear(prior, noise_std=0.5)
    constraint = BayesianLinear(prior, noise_prior=dist.InverseGamma(torch.tensor(2.0, dtype=F64),
                                                                     torch.tensor(1.0, dtype=F64)))
    return TSASC(reward, [constraint], alpha=0.2)


def _with_password(url: str) -> str:
    """The test server's URL with a password in it (its trust authentication ignores it)."""
    return url.replace("://bayes@", f"://bayes:{SECRET}@")


def _traffic(replicas, rng, n: int) -> None:
    for i in range(n):
        r = replicas[i % len(replicas)]
        d = r.decide(rng.normal(size=(K, D)), baseline=0)
        replicas[(i + 1) % len(replicas)].feedback(d.decision_id, float(rng.normal()), [float(1 + rng.normal())])


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, postgres_server):
    """Two replicas on one PostgreSQL log (its URL with a password), started from one state: ``(state,
    replica_state, url, other_state, other_replica_state)``; the last two belong to another Decider."""
    root = tmp_path_factory.mktemp("deployment")
    url = _with_password(postgres_server.url())
    state, replica_state = root / "state", root / "replica-state"
    Decider(_policy(), num_draws=50, seed=0).save(state)
    replicas = [ReplicaDecider.load(state, log=url) for _ in range(2)]
    _traffic(replicas, np.random.default_rng(0), 24)
    for r in replicas:
        r.sync()
    replicas[0].save(replica_state)
    _traffic(replicas, np.random.default_rng(1), 4)  # the log goes on past the snapshot
    for r in replicas:
        r.log.close()
    # another Decider: a one-process state, and a replica of it on another log
    other, other_replica = root / "other", root / "other-replica"
    Decider(_policy(), num_draws=50, seed=1).save(other)
    OTHER_URL[:] = [postgres_server.url()]
    theirs = ReplicaDecider.load(other, log=OTHER_URL[0])
    _traffic([theirs], np.random.default_rng(2), 3)
    theirs.sync()
    theirs.save(other_replica)
    theirs.log.close()
    return state, replica_state, url, other, other_replica


def test_a_replica_state_reads_its_policy_and_tunes_from_the_postgresql_log(deployment):
    state, replica_state, url, *_ = deployment
    assert saved_policy(replica_state) is not None  # read only: no log needed, nothing written
    with pytest.raises(StateError, match="load it with ReplicaDecider.load"):
        Decider.load(replica_state)  # a one-process Decider still refuses it (it would learn the rows again)
    problem = LoggedAlpha(url, replica_state, num_draws=20, n_boot=20)
    assert len(problem.data) == 28 and problem.log.kind == "postgresql" and problem.log.read_only
    estimate = problem.estimate({"alpha": 0.1}, seed=0)
    assert np.isfinite(estimate["reward"][0]) and "constraint0_ratio" in estimate
    # the one-process state the replicas started from is the log's too
    assert LoggedAlpha(url, state, num_draws=20, n_boot=20).metric_names() == problem.metric_names()
    # the URL is never shown nor stored with its password
    shown = [str(problem.log_path), problem.config()["log"], problem.describe(None), repr(problem.log)]
    assert all(SECRET not in text for text in shown)
    assert problem.config()["log"].startswith("postgresql://bayes@127.0.0.1:")


@pytest.mark.parametrize("which", ["other", "other_replica"])
def test_a_foreign_state_is_refused_in_one_line_naming_both(deployment, which):
    _state, replica_state, url, other, other_replica = deployment
    foreign = {"other": other, "other_replica": other_replica}[which]
    with pytest.raises(StateError) as info:
        LoggedAlpha(url, foreign, num_draws=20, n_boot=20)
    text = str(info.value)
    assert "\n" not in text and SECRET not in text
    assert text.startswith("log: postgresql://bayes@127.0.0.1:") and str(foreign) in text
    assert "another Decider" in text
    # the replica branch of the check, directly: a replica state against another Decider's log, and its own
    with pytest.raises(StateError, match=re.escape(f"not the decision log of the state {replica_state}: it is the log "
                                                   "of another Decider")):
        saved_policy(replica_state, log=DecisionLog(OTHER_URL[0], read_only=True))
    assert saved_policy(other_replica, log=OTHER_URL[0]) is not None


def test_tune_decision_log_cli_takes_the_url_and_refuses_a_foreign_state(deployment, tmp_path, capsys):
    _state, _replica_state, url, other, _ = deployment
    with pytest.raises(SystemExit) as info:
        main(["tune", "decision-log", "--log", url, "--state", str(other), "--trials", "1",
              "--out", str(tmp_path / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and SECRET not in err and "postgresql:/b" not in err
    assert re.search(r"error: --log: postgresql://bayes@127\.0\.0\.1:\d+/\w+: not the decision log of the state "
                     + re.escape(str(other)), err), err
    assert not (tmp_path / "out").exists()


def test_a_foreign_state_on_an_sqlite_log_is_refused_too(tmp_path):
    live = Decider(_policy(), num_draws=50, seed=0, log=tmp_path / "log.sqlite")
    rng = np.random.default_rng(0)
    for _ in range(4):
        d = live.decide(rng.normal(size=(K, D)), baseline=0)
        live.feedback(d.decision_id, 1.0, [1.0])
    live.save(tmp_path / "state")
    Decider(_policy(), num_draws=50, seed=0).save(tmp_path / "other")
    assert LoggedAlpha(tmp_path / "log.sqlite", tmp_path / "state", num_draws=10, n_boot=10).tune == "alpha"
    with pytest.raises(StateError, match=re.escape(f"log: {tmp_path / 'log.sqlite'}: not the decision log of the "
                                                   f"state {tmp_path / 'other'}: it is the log of another Decider")):
        LoggedAlpha(tmp_path / "log.sqlite", tmp_path / "other", num_draws=10, n_boot=10)


@pytest.mark.slow  # an Ax study (6 s)
def test_tune_decision_log_cli_runs_a_study_from_the_url_and_a_replica_state(deployment, tmp_path, capsys):
    _state, replica_state, url, *_ = deployment
    out = tmp_path / "out"
    assert main(["tune", "decision-log", "--log", url, "--state", str(replica_state), "--trials", "2", "--sobol", "2",
                 "--draws", "20", "--boot", "20", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert SECRET not in printed.out + printed.err
    texts = [p.read_text(errors="replace") for p in out.rglob("*.md")]
    assert texts and any("postgresql://bayes@127.0.0.1:" in t for t in texts)
    stored = [p.read_bytes() for p in out.rglob("*") if p.is_file()]  # the report, the study database ...
    assert stored and all(SECRET.encode() not in b for b in stored)
    # resume: the stored log is a database server's URL (without its password): confirmed like a file outside
    with pytest.raises(SystemExit):
        main(["tune", "resume", "--out", str(out), "--trials", "3"])
    err = capsys.readouterr().err
    assert "--trust-source: the stored study reads its decision log from postgresql://bayes@127.0.0.1:" in err, err
    assert "postgresql:/b" not in err and SECRET not in err
    assert main(["tune", "resume", "--out", str(out), "--trials", "3", "--trust-source"]) == 0
    assert SECRET not in capsys.readouterr().out
