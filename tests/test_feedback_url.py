"""``bayes-safe feedback --url`` posts the table, it does not load a state (issue 41, item 5).

A real ``bayes-safe serve`` subprocess on 127.0.0.1 (tests/serving.py), one with an SQLite log
and a replica on PostgreSQL: the table's shape is checked here, then it is sent in chunks that
the service applies all or nothing; the command prints what was applied and duplicated, and a
failed chunk (a bad row, a 4xx, an unreachable service) is one line naming the chunk and what
landed before it, with status 2.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pyro.distributions as dist
import pytest
import torch

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serving import ServeProcess

from bayes_safe import TSASC, BayesianLinear, Constraint
from bayes_safe.cli import main
from bayes_safe.online import Decider, DecisionLog, ReplicaDecider

F64 = torch.float64
D, K = 3, 3


def _policy():
    prior = dist.Normal(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)
    return TSASC(BayesianLinear(prior, noise_std=0.5), [BayesianLinear(prior, noise_std=0.5)],
                 constraints=[Constraint.relative("satisfaction", at_least=0.8)],
                 metric_names=["revenue", "satisfaction"])


def _decide(server, n: int) -> list[str]:
    return [server.client.post("/decide", json={"features": np.eye(K).tolist(), "baseline": 0}).json()["decision_id"]
            for _ in range(n)]


def _table(path, rows, columns=("decision_id", "reward", "constraint0")):
    path.write_text(",".join(columns) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(["feedback", *map(str, argv)])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _feedback_ids(log) -> set[str]:
    reader = DecisionLog(log, read_only=True)
    try:
        return set(reader.to_dataframe(with_feedback_only=True)["decision_id"])
    finally:
        reader.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A one-process service on an SQLite log, taking at most 3 feedback items per request."""
    root = tmp_path_factory.mktemp("served")
    state, log = root / "state", root / "log.sqlite"
    Decider(_policy(), num_draws=50, seed=0).save(state)
    server = ServeProcess(state, "--log", log, "--max-feedback-items", "3", stderr=root / "serve.err")
    yield server, state, log, root
    _code, err = server.kill()
    assert "Traceback" not in err


def test_the_rows_land_in_chunks_and_a_second_run_reports_them_duplicated(served, tmp_path, capsys):
    server, state, log, _ = served
    ids = _decide(server, 5)
    table = _table(tmp_path / "outcomes.csv", [(k, 1.0, 0.9) for k in ids])
    started = time.perf_counter()
    code, out, err = _run(capsys, "--from", table, "--url", server.url, "--chunk-rows", 2)  # no state
    seconds = time.perf_counter() - started
    assert code == 0, err
    assert f"5 rows, 5 applied, 0 already had feedback (ignored); sent to {server.url} in 3 request(s)" in out
    assert {k.split("-")[0] for k in ids} <= _feedback_ids(log)  # the log keys decisions by their number
    assert seconds < 5  # no state loaded (it took 5-7 s)
    again = _run(capsys, state, "--from", table, "--url", server.url, "--chunk-rows", 3)  # STATE given: read for its column names only
    assert again[0] == 0 and "5 rows, 0 applied, 5 already had feedback (ignored)" in again[1] and "in 2 request" in again[1]
    # the policy's metric names as columns, read from the state's policy.json
    ids = _decide(server, 2)
    named = _table(tmp_path / "named.csv", [(k, 2.0, 0.5) for k in ids], ("decision_id", "revenue", "satisfaction"))
    assert _run(capsys, state, "--from", named, "--url", server.url)[1].startswith(f"{named}: 2 rows, 2 applied")
    code, _, err = _run(capsys, "--from", named, "--url", server.url)  # without the state: the names are unknown
    assert code == 2 and "has no reward column" in err and err.count("\n") == 1


def test_a_bad_row_refuses_its_whole_chunk_naming_it_and_what_landed_before(served, tmp_path, capsys):
    server, _state, log, _ = served
    before = len(_feedback_ids(log))
    ids = _decide(server, 3)
    table = _table(tmp_path / "bad.csv", [(ids[0], 1.0, 0.9), (ids[1], 1.0, 0.9), (ids[2], 1.0, 0.9),
                                          ("77-00000000000000000000000000000000", 1.0, 0.9)])
    code, _, err = _run(capsys, "--from", table, "--url", server.url, "--chunk-rows", 2)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "chunk 2 of 2 (rows 3-4 of bad.csv)" in err and "nothing of the chunk applied" in err
    assert "row 4 (decision_id '77-00000000000000000000000000000000'): decision_id: unknown decision" in err
    assert "2 rows landed before it (chunks 1-1: 2 applied, 0 already had feedback)" in err
    assert len(_feedback_ids(log)) == before + 2  # chunk 1 only: row 3, a good one, went with its chunk
    # a row that is not a number: refused here, nothing sent
    _table(tmp_path / "nan.csv", [(ids[2], "abc", 0.9)])
    code, _, err = _run(capsys, "--from", tmp_path / "nan.csv", "--url", server.url)
    assert code == 2 and "--from: nan.csv: 1 bad row(s), nothing applied: row 1" in err and "expected a number" in err
    assert len(_feedback_ids(log)) == before + 2
    # a 4xx: more rows than the service takes in one request
    code, _out, err = _run(capsys, "--from", table, "--url", server.url, "--chunk-rows", 4)
    assert code == 2 and err.count("\n") == 1 and "--chunk-rows: the service at" in err and "chunk 1 of 1" in err
    assert "no row landed before it" in err


def test_an_unreachable_service_is_one_line_without_the_password(tmp_path, capsys):
    table = _table(tmp_path / "o.csv", [("0-00000000000000000000000000000000", 1.0, 0.9)])
    code, _out, err = _run(capsys, "--from", table, "--url", "http://alice:s3cret-pw@127.0.0.1:9")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and "s3cret-pw" not in err, err
    assert re.search(r"--url: cannot reach http://alice@127\.0\.0\.1:9 \(Connect\w+: .*\); chunk 1 of 1 \(rows 1-1 of "
                     r"o\.csv\): no answer; no row landed before it", err), err
    code, _, err = _run(capsys, "--from", table)  # without --url the state is required
    assert code == 2 and "STATE_DIR: required without --url" in err


@pytest.mark.slow  # a second service, a replica (5 s)
def test_a_replica_on_postgresql_takes_the_table(tmp_path, capsys, postgres_server):
    url = postgres_server.url()
    state, replica_state = tmp_path / "state", tmp_path / "replica-state"
    Decider(_policy(), num_draws=50, seed=0).save(state)
    replica = ReplicaDecider.load(state, log=url)
    replica.save(replica_state)  # a replica's state: `Decider.load` refuses it, --url never loads it
    replica.log.close()
    server = ServeProcess(replica_state, "--log", url, "--replica", "--sync-every", "0.2",
                          stderr=tmp_path / "replica.err")
    try:
        ids = _decide(server, 4)
        table = _table(tmp_path / "o.csv", [(k, 1.0, 0.9) for k in ids], ("decision_id", "revenue", "satisfaction"))
        code, out, err = _run(capsys, replica_state, "--from", table, "--url", server.url, "--chunk-rows", 3)
        assert code == 0 and "4 rows, 4 applied, 0 already had feedback" in out and "in 2 request(s)" in out, err
        assert DecisionLog(url, read_only=True).feedback_count() == 4
        code, out, _ = _run(capsys, replica_state, "--from", table, "--url", server.url)
        assert code == 0 and "4 rows, 0 applied, 4 already had feedback" in out
    finally:
        code, err = server.kill()
    assert "Traceback" not in err
