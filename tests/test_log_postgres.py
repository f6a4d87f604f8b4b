"""The decision log on PostgreSQL (issue 29, one replica): the same ``DecisionLog`` on SQLite and
on a real PostgreSQL server (``tests/postgres.py``), a Decider and ``bayes-safe serve`` on it.

The behaviour tests run on both backends (``target``: a SQLite file, or a fresh database of the
module's server) and the parity test writes the same rows to both and compares every answer.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import psycopg
import pyro.distributions as dist
import pytest
import torch
from serving import ServeProcess

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.online.log import SCHEMA_VERSION, LogError, LogUnavailable, LogURL

F64 = torch.float64
RATES = np.array([0.30, 0.45, 0.38])


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path):
    """Where a new log goes: a SQLite file, or the URL of a new PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "log.sqlite"
    return request.getfixturevalue("postgres_server").url()


def _raw(log: DecisionLog, sql: str, params=()) -> None:
    """Run ``sql`` on the log's own connection, outside the class (test set-up)."""
    if log.kind == "sqlite":
        log._db.execute(sql, params)
    else:
        log._db.execute(sql.replace("?", "%s"), params)


def _write_some(log: DecisionLog) -> None:
    """Decisions '0'..'5' and ids that are not a Decider's, and feedback (some twice, some orphans)."""
    for i in range(6):
        probs = [0.5, 0.3, 0.2]
        log.write_decision(str(i), i % 3, probs[i % 3], 0.01, i // 2, np.eye(3).ravel() * (i + 1), probs,
                           None if i == 4 else 0)
    for foreign in ("user-7", " 8", "12abc", "007", "x"):
        log.write_decision(foreign, 1, 0.5, 0.02, 0, np.arange(9.0), [0.2, 0.5, 0.3], 1)
    assert log.write_feedback("3", 0.7, [1.5]) is True
    assert log.write_feedback("3", 9.9, [9.9]) is False  # idempotent: the first one stays
    assert log.write_feedback("0", -0.2) is True
    assert log.write_feedback_many([("1", 0.1, [1.0]), ("9", 0.9, None), ("1", 5.0, None), ("3", 1.0, None),
                                    ("x", 0.3, [0.5])]) == [True, True, False, False, True]
    assert log.write_feedback("12", 0.4) is True  # an orphan past the decisions


def _answers(log: DecisionLog) -> dict:
    """Every reading method's answer (times left out: they are the clock's)."""
    frame = log.to_dataframe().drop(columns=["time", "feedback_time"])
    answered = log.to_dataframe(with_feedback_only=True).drop(columns=["time", "feedback_time"])
    obp = log.to_obp()
    data = log.to_logged_data()
    rows = log.feedback_rows_after(0)
    return {
        "len": len(log), "ids": log.id_summary(), "from2": log.decisions_from(2), "from0": log.decisions_from(0),
        "actions": log.actions_of(["0", "2", "5", "user-7", "nope"]), "unanswered": log.unanswered_below(6),
        "unanswered_from_7": log.unanswered_below(100, 7), "orphans": log.orphan_feedback(),
        "orphans10": log.orphan_feedback(10), "count0": log.count_from(0), "count3": log.count_from(3),
        "count8": log.count_from(8), "feedback_for": log.feedback_for(["9", "3", "1", "0", "x", "nope"]),
        "rows": [(r[2], r[3], r[5], r[6], r[7], r[4] is None) for r in rows],
        "rows_sorted": [r[0] for r in rows] == sorted(r[0] for r in rows),
        "rows_after_2": [r[2] for r in log.feedback_rows_after(rows[1][0])],
        "rows_limit": [r[2] for r in log.feedback_rows_after(0, limit=2)],
        "has": [log.has_decision("5"), log.has_decision("6"), log.has_feedback("3"), log.has_feedback("5")],
        "frame": frame, "answered": answered, "obp": obp,
        "data": (data.contexts, data.actions, data.rewards, data.propensities, data.logging_probs),
    }


def _same(a, b, where="") -> None:
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_dtype=True)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (tuple, list)) and any(isinstance(x, (np.ndarray, torch.Tensor, dict)) for x in a):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, where
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


# ---------------------------------------------------------------------------------- parity
def test_the_same_writes_read_the_same_on_sqlite_and_postgresql(tmp_path, postgres_server):
    lite, pg = DecisionLog(tmp_path / "log.sqlite"), DecisionLog(postgres_server.url())
    for log in (lite, pg):
        _write_some(log)
    a, b = _answers(lite), _answers(pg)
    _same(a, b)
    # what SQLite's CAST gives the foreign ids: ' 8' -> 8, '12abc' -> 12, '007' -> 7, 'x' and 'user-7' -> 0
    assert a["ids"] == {"count": 11, "low": 0, "high": 12, "foreign": 5}
    assert [k for k, *_ in a["from0"]] == ["0", "1", "2", "3", "4", "5"]
    assert a["unanswered"] == {"2", "4", "5", "user-7"} and a["unanswered_from_7"] == {"007", " 8", "12abc"}
    assert a["orphans"] == ["9", "12"] and a["orphans10"] == ["12"] and a["count8"] == 2
    assert a["feedback_for"] == [("3", 0.7, [1.5]), ("0", -0.2, None), ("1", 0.1, [1.0]), ("9", 0.9, None),
                                 ("x", 0.3, [0.5])]
    assert a["rows_after_2"] == [0.1, 0.9, 0.3, 0.4] and a["rows_limit"] == [0.7, -0.2] and a["rows_sorted"]
    assert a["has"] == [True, False, True, False]
    assert a["obp"]["n_rounds"] == 4 and len(a["frame"]) == 11
    # the frame's times are Unix seconds on both
    for log in (lite, pg):
        times = log.to_dataframe()["time"]
        assert times.dtype == np.float64 and abs(times.iloc[0] - time.time()) < 60
    # an empty log reads the same too
    _same(DecisionLog(tmp_path / "empty.sqlite").to_dataframe(), DecisionLog(postgres_server.url()).to_dataframe())
    assert repr(pg).startswith("DecisionLog('postgresql://bayes@127.0.0.1:") and "decisions=11" in repr(pg)


def test_decisions_and_feedback(target):
    log = DecisionLog(target)
    assert len(log) == 0 and log.id_summary() == {"count": 0, "low": None, "high": None, "foreign": 0}
    log.write_decision("0", 2, 0.5, 0.1, 0, [1.0, 0.0], [0.25, 0.25, 0.5], 1)
    with pytest.raises(Exception) as dup:  # a decision id is written once (SQLite's IntegrityError, a LogError)
        log.write_decision("0", 1, 0.5, 0.1, 0, [1.0, 0.0], [0.25, 0.25, 0.5], 1)
    assert isinstance(dup.value, (sqlite3.IntegrityError, LogError))
    assert log.write_feedback("0", 1.0, [0.5]) and not log.write_feedback("0", 2.0)
    assert log.feedback_for(["0"]) == [("0", 1.0, [0.5])] and len(log) == 1
    again = DecisionLog(target)  # opened again: the same log
    assert again.has_feedback("0") and again.actions_of(["0"]) == {"0": 2}
    again.close()
    log.close()


def test_feedback_many_is_all_or_nothing(target):
    log = DecisionLog(target)
    for i in range(4):
        log.write_decision(str(i), 0, 0.5, 0.1, 0, [1.0], [0.5, 0.5])
    # the database refuses the third row, after two were inserted in the transaction
    if log.kind == "sqlite":
        _raw(log, "CREATE TRIGGER refuse BEFORE INSERT ON feedback WHEN NEW.decision_id = '2' "
                  "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    else:
        _raw(log, "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.decision_id = '2' "
                  "THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$")
        _raw(log, "CREATE TRIGGER refuse BEFORE INSERT ON feedback FOR EACH ROW EXECUTE FUNCTION refuse()")
    with pytest.raises((sqlite3.Error, LogError), match="refused by the test"):
        log.write_feedback_many([("0", 1.0, None), ("1", 1.0, [2.0]), ("2", 1.0, None), ("3", 1.0, None)])
    assert log.feedback_for(["0", "1", "2", "3"]) == [] and log.feedback_rows_after(0) == []
    # the log is usable after the rollback
    assert log.write_feedback_many([("0", 1.0, None), ("1", 2.0, [2.0])]) == [True, True]
    assert [r[2] for r in log.feedback_rows_after(0)] == [1.0, 2.0]


def test_identity_and_bind(target):
    log = DecisionLog(target)
    assert log.identity() is None
    log.bind("abc", 7)
    log.bind("other", 9)  # an existing owner is kept
    assert log.identity() == {"decider_id": "abc", "first_id": 7}
    assert DecisionLog(target, read_only=True).identity() == {"decider_id": "abc", "first_id": 7}
    _raw(log, "UPDATE meta SET value = 'seven' WHERE key = 'first_id'")
    with pytest.raises(ValueError, match="malformed first_id 'seven'"):
        log.identity()


def test_read_only(target, postgres_server, tmp_path):
    log = DecisionLog(target)
    log.write_decision("0", 1, 0.5, 0.1, 0, [1.0], [0.5, 0.5])
    reader = DecisionLog(log.path, read_only=True)  # its path opens it (the service's metrics reader does)
    assert reader.read_only and len(reader) == 1 and reader.decisions_from(0)[0][:3] == ("0", 1, 2)
    with pytest.raises((sqlite3.OperationalError, LogError), match="read-?only"):
        reader.write_feedback("0", 1.0)
    with pytest.raises((sqlite3.OperationalError, LogError), match="read-?only"):
        reader.bind("x", 0)
    assert not log.has_feedback("0") and log.identity() is None
    # a database without the tables is refused, and left as it was
    empty = postgres_server.url() if log.kind == "postgresql" else tmp_path / "other.sqlite"
    if log.kind == "sqlite":
        sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(ValueError, match=r"^path: .* is not a decision log \(no 'decisions' and 'feedback' tables\)"):
        DecisionLog(empty, read_only=True)
    if log.kind == "postgresql":
        with psycopg.connect(empty) as conn:
            assert conn.execute("SELECT to_regclass('decisions')").fetchone()[0] is None


def test_the_schema_version(target, tmp_path):
    log = DecisionLog(target)
    assert log.schema_version() == SCHEMA_VERSION == 2
    _raw(log, "UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    for read_only in (False, True):
        with pytest.raises(ValueError) as refused:
            DecisionLog(target, read_only=read_only)
        message = str(refused.value)
        assert message.count("\n") == 0 and str(log.path) in message
        assert "schema version 3, newer than this bayes_safe's 2" in message
    _raw(log, "DELETE FROM meta WHERE key = 'schema_version'")  # as a log written before versions
    assert DecisionLog(target, read_only=True).schema_version() == 1
    assert DecisionLog(target).schema_version() == 2  # opened for writing: migrated (the table outcomes) and recorded
    assert dict(log._db.execute("SELECT key, value FROM meta").fetchall()) == {"schema_version": "2"}


def test_a_sqlite_log_from_before_versions_opens(tmp_path):
    """A log written by the code before (no meta table) reads as version 1 and gets the row when written."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript("CREATE TABLE decisions (decision_id TEXT PRIMARY KEY, time REAL NOT NULL, action INTEGER "
                         "NOT NULL, propensity REAL NOT NULL, propensity_se REAL NOT NULL, model_version INTEGER NOT "
                         "NULL, num_actions INTEGER NOT NULL, context TEXT NOT NULL, probabilities TEXT NOT NULL, "
                         "baseline INTEGER); CREATE TABLE feedback (decision_id TEXT PRIMARY KEY, time REAL NOT NULL, "
                         "reward REAL NOT NULL, constraints TEXT);")
        db.execute("INSERT INTO decisions VALUES ('0', 1.0, 1, 0.5, 0.1, 0, 2, '[1.0]', '[0.5, 0.5]', NULL)")
    db.close()
    reader = DecisionLog(path, read_only=True)
    assert reader.schema_version() == 1 and reader.identity() is None and len(reader) == 1
    assert "meta" not in {r[0] for r in reader._db.execute("SELECT name FROM sqlite_master")}  # nothing written
    assert DecisionLog(path).schema_version() == 2 and reader.schema_version() == 2  # migrated when opened to write
    assert len(DecisionLog(path, read_only=True).to_dataframe()) == 1


def test_urls_print_without_their_password(postgres_server):
    url = postgres_server.url()
    secret = url.replace("postgresql://bayes@", "postgresql://bayes:hunter2@") + "?application_name=t&password=x2"
    printed = LogURL(secret)
    assert "hunter2" not in printed and "x2" not in printed and printed.startswith("postgresql://bayes@127.0.0.1:")
    log = DecisionLog(secret)  # trust authentication: the password is not needed, but given
    assert "hunter2" not in str(log.path) and "hunter2" not in repr(log)
    reader = DecisionLog(log.path, read_only=True)  # the printed path still opens it
    assert len(reader) == 0
    missing = re.sub(r"/db\d+", "/nosuchdb", secret)
    with pytest.raises(LogUnavailable) as down:
        DecisionLog(missing)
    assert "hunter2" not in str(down.value) and "nosuchdb" in str(down.value)
    assert isinstance(down.value, ConnectionError) and isinstance(down.value, OSError)
    with pytest.raises(ValueError, match=r"^path: expected a file path or a postgresql:// URL, got mysql://"):
        DecisionLog("mysql://u:hunter2@h/db")
    assert DecisionLog(url.replace("postgresql://", "postgres://")).kind == "postgresql"


def test_a_lost_connection_raises_log_unavailable_and_the_next_call_reconnects(postgres_server):
    log = DecisionLog(postgres_server.url())
    reader = DecisionLog(log.path, read_only=True)
    log.write_decision("0", 1, 0.5, 0.1, 0, [1.0], [0.5, 0.5])
    assert reader.feedback_rows_after(0) == []  # the reader's connection open (then lost with the server)
    postgres_server.restart()
    # the connections the restart ended were idle: each is found gone before use and replaced, so the
    # first call after the restart succeeds (no 503 once the server is back)
    assert log.write_feedback("0", 1.0) is True
    assert len(reader.feedback_rows_after(0)) == 1
    # a connection that breaks under a statement raises LogUnavailable; the next call connects again
    with log._lock:
        pid = log._b.connection().info.backend_pid
        reader._db.execute("SELECT pg_terminate_backend(%s)", (pid,))  # ended under the call (another connection)
        with pytest.raises(LogUnavailable, match="the PostgreSQL server is unavailable"), log._b.guard():
            log._b.rows("SELECT 1")
    assert log.write_feedback("0", 1.0) is False  # connected again (a duplicate: written once)
    with pytest.raises((sqlite3.OperationalError, LogError), match="read-?only"):  # still read-only after reconnecting
        reader.write_feedback("1", 1.0)
    postgres_server.stop()
    try:
        with pytest.raises(LogUnavailable):
            len(log)
        with pytest.raises(LogUnavailable):  # down: every call says so, quickly
            log.write_feedback_many([("0", 1.0, None)])
    finally:
        postgres_server.start()
    assert len(log) == 1


def test_a_decision_whose_write_lost_its_answer_is_written_again(postgres_server):
    """A write that raised LogUnavailable may have been committed: the same id written next replaces it."""
    log = DecisionLog(postgres_server.url())
    log.write_decision("0", 1, 0.5, 0.1, 0, [1.0], [0.5, 0.5])
    log._uncertain = {"0"}  # as after a LogUnavailable raised once the server had committed the row
    log.write_decision("0", 0, 0.25, 0.1, 0, [2.0], [0.25, 0.75])
    assert log.actions_of(["0"]) == {"0": 0} and len(log) == 1 and not log._uncertain
    with pytest.raises(LogError, match="duplicate key"):  # otherwise an id is written once
        log.write_decision("0", 1, 0.5, 0.1, 0, [1.0], [0.5, 0.5])
    # feedback too: the value sent again (the one the Decider applies) replaces the one that may have landed
    assert log.write_feedback("0", 1.0)
    log._uncertain_feedback = {"0"}
    assert log.write_feedback("0", 2.0) is True and log.feedback_for(["0"]) == [("0", 2.0, None)]
    assert log.write_feedback("0", 3.0) is False and not log._uncertain_feedback
    log._uncertain_feedback = {"0"}
    assert log.write_feedback_many([("0", 4.0, [1.0]), ("0", 5.0, None)]) == [True, False]
    assert log.feedback_for(["0"]) == [("0", 4.0, [1.0])] and len(log.feedback_rows_after(0)) == 1
    # and a lost connection marks what was being written
    postgres_server.stop()
    try:
        with pytest.raises(LogUnavailable):
            log.write_feedback_many([("1", 1.0, None), ("2", 1.0, None)])
    finally:
        postgres_server.start()
    assert log._uncertain_feedback == {"1", "2"}


def test_serve_names_a_postgresql_log_it_cannot_open(tmp_path, postgres_server, capsys):
    from bayes_safe.cli import main

    state = tmp_path / "state"
    Decider(TSASC(_model(), [_model()], alpha=0.2), seed=1).save(state)
    url = re.sub(r"/db\d+$", "/nosuchdb", postgres_server.url()).replace("bayes@", "bayes:hunter2@")
    with pytest.raises(SystemExit) as exc:
        main(["serve", str(state), "--port", "0", "--log", url])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "hunter2" not in err
    assert err.startswith("bayes-safe serve: error: --log: postgresql://bayes@127.0.0.1:") and "nosuchdb" in err


def test_threads_share_one_log(target):
    log = DecisionLog(target)
    errors = []

    def work(base):
        try:
            for i in range(base, base + 25):
                log.write_decision(str(i), 0, 0.5, 0.1, 0, [1.0], [0.5, 0.5])
                assert log.write_feedback(str(i), float(i))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(b,)) for b in (0, 25, 50, 75)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(log) == 100 and log.id_summary()["high"] == 99 and len(log.feedback_rows_after(0)) == 100


# ---------------------------------------------------------------------------------- a Decider on PostgreSQL
def _model(d=3):
    return BayesianLinear(dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1), noise_std=0.5, batch_shape=[1])


def _run(state: Path, log) -> Decider:
    """Decide and send feedback, save half-way, go on; then ``Decider.load(state, log=log)``."""
    decider = Decider(TSASC(_model(), [_model()], alpha=0.2), log=log, update_every=2, num_draws=100, seed=3)
    rng = np.random.default_rng(0)
    ids = []
    for i in range(40):
        d = decider.decide(np.eye(3), baseline=0)
        ids.append((d.decision_id, d.action))
        if i == 20:
            decider.save(state)
        if i % 3 and i > 1:
            k, a = ids.pop(0)
            decider.feedback(k, float(RATES[a] + 0.5 * rng.normal()), [1.0 + 0.1 * rng.normal()])
    decider.feedback_many([(k, 0.5, [1.0]) for k, _ in ids[:3]])
    return Decider.load(state, log=log)


def test_a_decider_on_postgresql_replays_as_on_sqlite(tmp_path, postgres_server):
    url = postgres_server.url()
    on_pg, on_lite = _run(tmp_path / "pg", url), _run(tmp_path / "lite", tmp_path / "log.sqlite")
    assert on_pg.replayed == on_lite.replayed and on_pg.replayed["decisions"] == 19
    assert on_pg.next_id == on_lite.next_id == 40 and set(on_pg.pending) == set(on_lite.pending)
    assert on_pg.model_version == on_lite.model_version
    for a, b in ((on_pg.policy.reward_model, on_lite.policy.reward_model),
                 (on_pg.policy.constraint_models[0], on_lite.policy.constraint_models[0])):
        assert torch.equal(a.posterior_mean, b.posterior_mean)
        assert torch.equal(a.posterior_covariance, b.posterior_covariance)
    assert on_pg.log.kind == "postgresql" and on_pg.log.identity()["decider_id"] == on_pg.decider_id
    # the URL again names the log the Decider holds (compared without its password): no second connection
    assert on_pg.replay(url) == {"decisions": 0, "feedback": 0} and on_pg.log.path == LogURL(url)
    assert on_pg._log_arg(url) is on_pg.log
    _same(_frame(on_pg.log), _frame(on_lite.log))
    # tuning from the log (LoggedAlpha, `bayes-safe tune decision-log --log`) reads the URL as the file
    import pickle

    from bayes_safe.online.tuning import LoggedAlpha

    tuned = {}
    for name, log in (("pg", url), ("lite", tmp_path / "log.sqlite")):
        problem = LoggedAlpha(log, tmp_path / name, num_draws=20, n_boot=20)
        tuned[name] = problem.estimate({"alpha": 0.1}, seed=0)
        again = pickle.loads(pickle.dumps(problem))  # as a trial in a worker process: it opens the log again
        assert again.log.read_only and len(again.log) == len(problem.log)
    assert tuned["pg"] == tuned["lite"]
    assert problem.config()["log"] != url and LoggedAlpha(url, tmp_path / "pg").config()["log"] == url
    # the log of another Decider is refused, on PostgreSQL as on SQLite
    with pytest.raises(Exception, match="another Decider"):
        Decider(TSASC(_model(), [_model()], alpha=0.2), log=url)


def _frame(log):
    return log.to_dataframe(with_feedback_only=True).drop(columns=["time", "feedback_time"])


# ---------------------------------------------------------------------------------- the service on PostgreSQL
def _outcome(action, rng):
    return {"reward": float(RATES[action] + 0.5 * rng.normal()), "constraints": [float(1 + 0.5 * rng.normal())]}


@pytest.mark.slow  # moved to the slow job to keep the default run under 15 minutes (2026-11-28)
def test_serve_on_postgresql_survives_a_kill_and_a_database_restart(tmp_path, postgres_server):
    state, url = tmp_path / "state", postgres_server.url()
    Decider(TSASC(_model(), [_model()], alpha=0.2), num_draws=200, seed=1).save(state)
    rng = np.random.default_rng(2)
    acknowledged: dict[str, dict] = {}
    decided: list[tuple[str, int]] = []
    servers = []
    try:
        server = ServeProcess(state, "--log", url, stderr=tmp_path / f"serve{len(servers)}.err")
        servers.append(server)
        assert f"log {url}" in server.first_line
        for i in range(30):
            d = server.client.post("/decide", json={"features": np.eye(3).tolist(), "baseline": 0}).json()
            decided.append((d["decision_id"], d["action"]))
            if i % 4:
                body = {"decision_id": d["decision_id"], **_outcome(d["action"], rng)}
                assert server.client.post("/feedback", json=body).json() == {"accepted": True}
                acknowledged[d["decision_id"]] = body
        code, _ = server.kill()  # SIGKILL: no shutdown snapshot, the log is the record
        assert code == -signal.SIGKILL
        server = ServeProcess(state, "--log", url, stderr=tmp_path / f"serve{len(servers)}.err")
        servers.append(server)
        assert f"recovered 30 decisions and {len(acknowledged)} feedback" in server.first_line
        posterior = server.client.get("/posterior").json()
        assert posterior["decisions"] == 30 and posterior["model_version"] == len(acknowledged)
        # a re-sent feedback is a duplicate, not applied again
        first = next(iter(acknowledged.values()))
        assert server.client.post("/feedback", json=first).json() == {"accepted": False}

        # the database goes down under traffic: 503s (never 500), /health degraded, then recovery
        statuses: list[int] = []
        stop = threading.Event()

        def traffic():
            with httpx.Client(base_url=server.client.base_url, timeout=30) as c:
                while not stop.is_set():
                    r = c.post("/decide", json={"features": np.eye(3).tolist(), "baseline": 0})
                    statuses.append(r.status_code)
                    time.sleep(0.005)
                    if r.status_code == 200:
                        d = r.json()
                        body = {"decision_id": d["decision_id"], **_outcome(d["action"], np.random.default_rng(len(statuses)))}
                        f = c.post("/feedback", json=body)
                        statuses.append(f.status_code)
                        if f.status_code == 200 and f.json()["accepted"]:
                            acknowledged[d["decision_id"]] = body
                        elif f.status_code == 503:
                            decided.append((d["decision_id"], d["action"]))
                        else:
                            raise AssertionError(f.text)

        thread = threading.Thread(target=traffic)
        thread.start()
        time.sleep(0.5)
        postgres_server.stop()
        try:
            time.sleep(0.3)
            down = server.client.post("/decide", json={"features": np.eye(3).tolist(), "baseline": 0})
            assert down.status_code == 503 and "the decision log could not be written" in down.json()["detail"]
            assert "LogUnavailable" in down.json()["detail"]
            # the database's address stays in the server's log, not in a client's answer (issue 40)
            assert str(postgres_server.port) not in down.text and "postgresql://" not in down.text, down.text
            pending_id = decided[28][0]  # i = 28: no feedback sent
            refused = server.client.post("/feedback", json={"decision_id": pending_id, "reward": 0.1,
                                                            "constraints": [1.0]})
            assert refused.status_code == 503
            health = server.client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "degraded"
            assert any("decision log: the last write failed" in p for p in health.json()["problems"])
            assert server.client.get("/metrics").status_code == 503
            assert server.client.get("/posterior").status_code == 200  # what needs no log still answers
        finally:
            postgres_server.start()
        time.sleep(0.5)
        postgres_server.restart()  # and once more, quickly, under traffic
        time.sleep(0.5)
        stop.set()
        thread.join(timeout=60)
        assert 503 in statuses and 200 in statuses and set(statuses) <= {200, 503}
        assert server.client.post("/decide", json={"features": np.eye(3).tolist(), "baseline": 0}).status_code == 200
        assert server.client.get("/health").json()["status"] == "ok"  # recovered without a restart
        assert server.client.get("/metrics").status_code == 200
        for decision_id, action in decided[30:]:  # feedback refused with 503, sent again: applied once
            if decision_id not in acknowledged:
                body = {"decision_id": decision_id, **_outcome(action, rng)}
                r = server.client.post("/feedback", json=body)
                assert r.status_code == 200, r.text
                if r.json()["accepted"]:
                    acknowledged[decision_id] = body
        code, err = server.kill(signal.SIGTERM)
        assert code == 0 and "Traceback" not in err, err
    finally:
        for s in servers:
            s.kill()
    # every acknowledged feedback is in the log, once, with the client's values, and applied once
    decider = Decider.load(state, log=url)
    frame = decider.log.to_dataframe(with_feedback_only=True).set_index("decision_id")
    numbers = {k.split("-")[0]: v for k, v in acknowledged.items()}
    assert set(numbers) <= set(frame.index)
    assert all(frame.loc[k, "reward"] == v["reward"] for k, v in numbers.items())
    assert decider.model_version == len(frame) and not decider.replayed["feedback"]
    assert decider.next_id == len(decider.log)


def test_bulk_feedback_into_a_postgresql_log(tmp_path, postgres_server, capsys):
    from bayes_safe.cli import main

    state, url = tmp_path / "state", postgres_server.url()
    decider = Decider(TSASC(_model(), [_model()], alpha=0.2), log=url, num_draws=100, seed=1)
    ids = [decider.decide(np.eye(3), baseline=0).decision_id for _ in range(6)]
    decider.save(state)
    decider.log.close()
    pd.DataFrame({"decision_id": ids, "reward": np.linspace(0, 1, 6), "constraint0": 1.0}).to_csv(
        tmp_path / "outcomes.csv", index=False)
    args = ["feedback", str(state), "--from", str(tmp_path / "outcomes.csv"), "--log", url]
    assert main(args) == 0
    assert main(args) == 0  # again: every row a duplicate, nothing applied twice
    out = capsys.readouterr().out
    assert out.count(f"log {url})") == 2, out
    back = Decider.load(state, log=url)
    assert not back.pending and back.model_version == 6
    assert sorted(r for _, r, _ in back.log.feedback_for([str(i) for i in range(6)])) == list(np.linspace(0, 1, 6))


def test_a_closed_log_refuses_calls(target):
    log = DecisionLog(target)
    log.close()
    with pytest.raises((sqlite3.ProgrammingError, LogError), match="closed"):
        len(log)


def test_threads_calling_at_once_each_get_their_own_connection_and_at_most_the_pools(postgres_server):
    """The replicas' service writes from several threads: their round trips run at once, on at most
    PG_CONNECTIONS connections (a thread beyond them waits for one), and every row lands."""
    from bayes_safe.online.log import PG_CONNECTIONS

    log = DecisionLog(postgres_server.url())
    inside, most, gate = [], [0], threading.Lock()
    barrier = threading.Barrier(PG_CONNECTIONS)

    def work(i: int) -> None:
        with log._lock:  # one log call's session
            pid = log._b.connection().info.backend_pid
            with gate:
                assert pid not in inside  # a connection of its own
                inside.append(pid)
                most[0] = max(most[0], len(inside))
            if i < PG_CONNECTIONS:
                barrier.wait(timeout=10)  # the first PG_CONNECTIONS threads hold theirs at the same time
            log.write_decision(str(i), 0, 1.0, 0.0, 0, [float(i)], [1.0])  # nested: the same connection
            with gate:
                inside.remove(pid)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(PG_CONNECTIONS + 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert most[0] == PG_CONNECTIONS  # at once, and never more
    assert len(log) == PG_CONNECTIONS + 3
    backends = log._db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()").fetchone()[0]
    assert backends <= PG_CONNECTIONS + 1  # the pool's and the one outside sessions
    log.close()
