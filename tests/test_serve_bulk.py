"""Bulk feedback, ``GET /metrics`` and the OpenAPI schemas of ``bayes-safe serve`` (issue 27, items 4-6).

A real ``bayes-safe serve`` subprocess on 127.0.0.1 and a real httpx client (``Server`` of
tests/test_serve.py); tables of outcomes written here with pandas and applied with the
``bayes-safe feedback`` command in a subprocess. The policy: TS-ASC over three one-hot offers
with named metrics (``revenue``, ``satisfaction``) and a declared relative constraint on
satisfaction, so the table's constraint column is named by the policy's metric.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
parser = pytest.importorskip("prometheus_client.parser")

import test_serve
from test_serve import ROOT, _model

from bayes_safe import TSASC, Constraint
from bayes_safe.cli import main
from bayes_safe.online import Decider, DecisionLog

OFFERS = np.eye(3).tolist()
REVENUE = np.array([1.0, 1.3, 1.1])
started = test_serve.started  # test_serve's fixture: every server it started is killed after the test


def _policy():
    return TSASC(_model(), [_model()], constraints=[Constraint.relative("satisfaction", at_least=0.8)],
                 metric_names=["revenue", "satisfaction"])


def _state(path: Path) -> Path:
    Decider(_policy(), num_draws=200, seed=0).save(path)
    return path


def _decide(server, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        r = server.client.post("/decide", json={"features": OFFERS, "baseline": 0})
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def _outcomes(decisions, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"decision_id": d["decision_id"], "reward": float(REVENUE[d["action"]] + 0.5 * rng.normal()),
             "constraints": [float(1.0 + 0.5 * rng.normal())]} for d in decisions]


def _feedback_rows(log_path: Path) -> list[tuple]:
    with sqlite3.connect(log_path) as db:
        return db.execute("SELECT decision_id, reward, constraints FROM feedback ORDER BY rowid").fetchall()


# ---------------------------------------------------------------------------------- POST /feedback with a list
def test_a_list_of_feedback_is_applied_once_and_a_resent_list_changes_nothing(tmp_path, started):
    server = started(_state(tmp_path / "state"), tmp_path / "log.sqlite")
    decisions = _decide(server, 12)
    body = _outcomes(decisions[:8])
    r = server.client.post("/feedback", json=body)
    assert r.status_code == 200 and r.json() == {"accepted": [True] * 8, "applied": 8, "duplicates": 0}, r.text
    posterior = server.client.get("/posterior").json()
    assert (posterior["model_version"], posterior["pending"]) == (8, 4)  # update_every=1: one version per outcome
    r = server.client.post("/feedback", json=body)  # re-sent unchanged: acknowledged, ignored
    assert r.status_code == 200 and r.json() == {"accepted": [False] * 8, "applied": 0, "duplicates": 8}
    assert server.client.get("/posterior").json() == posterior
    # the single-object form answers as before
    one = _outcomes(decisions[8:9], seed=1)[0]
    assert server.client.post("/feedback", json=one).json() == {"accepted": True}
    assert server.client.post("/feedback", json=one).json() == {"accepted": False}
    # a list with bad items: every one named (by its index and decision id), nothing applied
    before = server.client.get("/posterior").json()
    bad = [_outcomes(decisions[9:10])[0],                                         # good, but not applied
           {"decision_id": "12345", "reward": 1.0, "constraints": [1.0]},          # unknown
           {"decision_id": decisions[10]["decision_id"], "reward": "1.0", "constraints": [1.0]},
           {"decision_id": decisions[11]["decision_id"], "reward": 1.0, "constraints": [1.0, 2.0]},
           {"reward": 1.0}]
    r = server.client.post("/feedback", json=bad)
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert [e["index"] for e in errors] == [1, 2, 3, 4]
    assert errors[0]["decision_id"] == "12345" and errors[0]["detail"].startswith("decision_id: unknown decision")
    assert errors[1]["detail"].startswith("reward: expected a number")
    assert errors[2]["detail"].startswith("constraints: expected 1 value(s)")
    assert errors[3] == {"index": 4, "decision_id": None, "detail": "decision_id: required"}
    assert r.json()["detail"].startswith("4 bad feedback item(s), nothing applied: [1] decision_id '12345'")
    assert server.client.get("/posterior").json() == before
    assert server.client.post("/feedback", json=[]).status_code == 422
    code, _, err = server.stop()
    assert code == 0 and "Traceback" not in err
    assert len(_feedback_rows(tmp_path / "log.sqlite")) == 9  # 8 + 1: nothing of the refused list


def test_an_acknowledged_list_survives_a_kill(tmp_path, started):
    """The list is committed to the log before the reply: SIGKILL right after it, and the restart
    applies every item, once (no snapshot was written in between)."""
    state, log = _state(tmp_path / "state"), tmp_path / "log.sqlite"
    server = started(state, log)
    body = _outcomes(_decide(server, 10))
    assert server.client.post("/feedback", json=body).json()["applied"] == 10
    server.proc.send_signal(signal.SIGKILL)
    server.proc.communicate(timeout=30)
    assert Decider.load(state).model_version == 0  # the snapshot never saw them
    server = started(state, log)
    assert "recovered 10 decisions and 10 feedback" in server.first_line
    assert server.client.get("/health").json()["model_version"] == 10
    assert server.client.post("/feedback", json=body).json()["duplicates"] == 10
    server.stop()


# ---------------------------------------------------------------------------------- GET /metrics
def _families(text: str) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def _value(families, name, **labels) -> float:
    """The value of the sample ``name`` (a counter's ``_total``, a histogram's ``_count`` ...) with ``labels``."""
    for family in families.values():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(f"{name} {labels}")


def test_metrics_parse_with_the_prometheus_parser_and_count_what_was_sent(tmp_path, started):
    server = started(_state(tmp_path / "state"), tmp_path / "log.sqlite")
    families = _families(server.client.get("/metrics").text)  # before anything: zeros, NaN estimates
    assert _value(families, "bayes_safe_decisions_total") == 0 and math.isnan(
        _value(families, "bayes_safe_guardrail_served", metric="satisfaction"))
    decisions = _decide(server, 40)
    sent = _outcomes(decisions[:25], seed=3)
    assert server.client.post("/feedback", json=sent[:20]).json()["applied"] == 20
    for o in sent[20:]:
        assert server.client.post("/feedback", json=o).json() == {"accepted": True}
    server.client.post("/feedback", json=sent[0])                           # a duplicate
    server.client.post("/feedback", json={"decision_id": "999", "reward": 1.0, "constraints": [1.0]})  # refused
    r = server.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = _families(r.text)
    assert families["bayes_safe_decisions"].type == "counter"
    assert _value(families, "bayes_safe_decisions_total") == 40
    assert _value(families, "bayes_safe_feedback_received_total") == 25
    assert _value(families, "bayes_safe_feedback_pending") == 15
    assert _value(families, "bayes_safe_feedback_duplicates_total") == 1
    assert _value(families, "bayes_safe_feedback_refused_total") == 1
    assert _value(families, "bayes_safe_model_version") == 25
    assert families["bayes_safe_feedback_delay_seconds"].type == "histogram"
    assert _value(families, "bayes_safe_feedback_delay_seconds_count") == 25
    assert 0 < _value(families, "bayes_safe_feedback_delay_seconds_sum") < 60
    # the guardrail estimates, by hand from what was sent
    actions = {d["decision_id"]: d for d in decisions}
    sat = np.array([o["constraints"][0] for o in sent])
    served = _value(families, "bayes_safe_guardrail_served", metric="satisfaction")
    assert served == pytest.approx(sat.mean())
    half = 1.959964 * sat.std(ddof=1) / math.sqrt(len(sat))
    assert _value(families, "bayes_safe_guardrail_served_low", metric="satisfaction") == pytest.approx(served - half)
    assert _value(families, "bayes_safe_guardrail_served_high", metric="satisfaction") == pytest.approx(served + half)
    w = np.array([1 / actions[o["decision_id"]]["propensity"] if actions[o["decision_id"]]["action"] == 0 else 0.0
                  for o in sent])
    assert _value(families, "bayes_safe_guardrail_rows", metric="satisfaction", policy="baseline") == (w > 0).sum()
    if (w > 0).any():  # the baseline's mean, self-normalised IPS
        base = float((w * sat).sum() / w.sum())
        assert _value(families, "bayes_safe_guardrail_baseline", metric="satisfaction") == pytest.approx(base)
        assert _value(families, "bayes_safe_guardrail_limit", constraint="0", metric="satisfaction",
                      direction="at_least", form="relative") == pytest.approx(0.8 * base)
        low = _value(families, "bayes_safe_guardrail_baseline_low", metric="satisfaction")
        assert low <= base <= _value(families, "bayes_safe_guardrail_baseline_high", metric="satisfaction")
    revenue = np.array([o["reward"] for o in sent])
    assert _value(families, "bayes_safe_guardrail_served", metric="revenue") == pytest.approx(revenue.mean())
    # a scrape reads only the new log rows: a second one agrees
    assert _value(_families(server.client.get("/metrics").text), "bayes_safe_feedback_delay_seconds_count") == 25
    code, _, err = server.stop()
    assert code == 0 and "Traceback" not in err


# ---------------------------------------------------------------------------------- the OpenAPI document
def test_the_openapi_document_has_the_request_and_response_schemas(tmp_path, started):
    server = started(_state(tmp_path / "state"), tmp_path / "log.sqlite")
    doc = server.client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    decide = doc["paths"]["/decide"]["post"]
    assert decide["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/DecideRequest"}
    assert set(schemas["DecideRequest"]["properties"]) == {"features", "context", "baseline", "valid"}
    assert decide["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/Decision")
    assert decide["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    feedback = doc["paths"]["/feedback"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    one = {"$ref": "#/components/schemas/Feedback"}
    assert feedback["anyOf"][0] == one and feedback["anyOf"][1]["items"] == one
    assert set(schemas["Feedback"]["required"]) == {"decision_id"}  # outcomes may arrive metric by metric
    assert {"Health", "Posterior", "Error", "ItemError", "FeedbackListAccepted"} <= set(schemas)
    assert all(ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas
               for ref in _refs(doc))  # every reference resolves
    assert "/metrics" in doc["paths"]
    assert server.client.get("/docs").status_code == 200
    # the error behaviour is the hand parser's: a 422 whose detail names the field
    r = server.client.post("/decide", json={"features": [[1.0, "x", 0.0]], "baseline": 0})
    assert r.status_code == 422 and r.json() == {"detail": 'features[0][1]: expected a number, got "x"'}
    server.stop()


def _refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


# ---------------------------------------------------------------------------------- bayes-safe feedback
def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bayes_safe.cli", "feedback", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300, check=False)


def _served_decisions(tmp_path: Path, started, n: int = 30) -> tuple[Path, Path, list[dict]]:
    """A state and its log holding ``n`` decisions without feedback, made by a real server, stopped."""
    state, log = _state(tmp_path / "state"), tmp_path / "log.sqlite"
    server = started(state, log)
    decisions = _decide(server, n)
    code, _, err = server.stop()
    assert code == 0, err
    return state, log, decisions


def _posterior(state: Path):
    policy = Decider.load(state).policy
    return policy.reward_model.posterior_mean.clone(), policy.constraint_models[0].posterior_mean.clone()


@pytest.mark.slow  # (the slow job: the default run's 15-minute budget)
def test_a_csv_of_outcomes_applied_twice_changes_nothing_the_second_time(tmp_path, started):
    state, log, decisions = _served_decisions(tmp_path, started)
    outcomes = _outcomes(decisions[:20], seed=5)
    table = pd.DataFrame({"decision_id": [o["decision_id"] for o in outcomes],
                          "reward": [o["reward"] for o in outcomes],
                          "satisfaction": [o["constraints"][0] for o in outcomes],
                          "region": "north"})  # a warehouse column, ignored
    table.to_csv(tmp_path / "outcomes.csv", index=False)
    first = _cli(state, "--from", tmp_path / "outcomes.csv", "--log", log)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    assert "20 rows, 20 applied, 0 already had feedback" in first.stdout and "model_version 20, pending 10" in first.stdout
    rows, posterior = _feedback_rows(log), _posterior(state)
    assert [r[0] for r in rows] == [k.split("-")[0] for k in table["decision_id"]]  # the log keys ids by number
    # the posterior is the conjugate one of the 20 outcomes, as if each had been sent by HTTP
    X = torch.tensor([OFFERS[next(d["action"] for d in decisions if d["decision_id"] == o["decision_id"])]
                      for o in outcomes], dtype=torch.float64)
    expected = _model()
    expected.update(X[None], torch.tensor(table["reward"].to_numpy(), dtype=torch.float64)[None])
    torch.testing.assert_close(posterior[0], expected.posterior_mean)
    state_files = {p.name: p.read_bytes() for p in state.rglob("*") if p.is_file()}

    second = _cli(state, "--from", tmp_path / "outcomes.csv", "--log", log)
    assert second.returncode == 0, second.stderr
    assert "20 rows, 0 applied, 20 already had feedback (ignored)" in second.stdout
    assert _feedback_rows(log) == rows
    again = _posterior(state)
    assert torch.equal(again[0], posterior[0]) and torch.equal(again[1], posterior[1])
    assert {p.name: p.read_bytes() for p in state.rglob("*") if p.is_file()} == state_files  # not even re-saved

    # the next table overlaps this one (two re-sent rows) and names its constraint by the JSON list column
    more = _outcomes(decisions[18:24], seed=6)
    pd.DataFrame({"decision_id": [o["decision_id"] for o in more], "revenue": [o["reward"] for o in more],
                  "constraints": [json.dumps(o["constraints"]) for o in more]}).to_parquet(tmp_path / "more.parquet")
    third = _cli(state, "--from", tmp_path / "more.parquet", "--log", log)
    assert third.returncode == 0, third.stderr
    assert "6 rows, 4 applied, 2 already had feedback" in third.stdout
    assert len(_feedback_rows(log)) == 24

    # a running service holds the state: the command refuses to write it, and sends with --url instead
    server = started(state, log)
    last = _outcomes(decisions[24:27], seed=7)
    pd.DataFrame({"decision_id": [o["decision_id"] for o in last], "reward": [o["reward"] for o in last],
                  "satisfaction": [o["constraints"][0] for o in last]}).to_csv(tmp_path / "last.csv", index=False)
    with pytest.raises(SystemExit) as exc:  # nor can a second service start on it
        main(["serve", str(state), "--port", "0", "--log", str(log)])
    assert exc.value.code == 2
    refused = _cli(state, "--from", tmp_path / "last.csv", "--log", log)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "is being served by pid" in refused.stderr
    sent = _cli(state, "--from", tmp_path / "last.csv", "--url", server.url)
    assert sent.returncode == 0 and "3 rows, 3 applied" in sent.stdout, sent.stderr
    assert "3 rows, 0 applied, 3 already had feedback" in _cli(state, "--from", tmp_path / "last.csv", "--url",
                                                                server.url).stdout
    assert server.client.get("/health").json()["model_version"] == 27
    code, _, err = server.stop()
    assert code == 0 and "Traceback" not in err


def test_a_table_with_bad_rows_is_refused_whole_naming_every_bad_row(tmp_path, started):
    state, log, decisions = _served_decisions(tmp_path, started, 6)
    ids = [d["decision_id"] for d in decisions]
    (tmp_path / "bad.csv").write_text(
        "decision_id,reward,satisfaction\n"
        f"{ids[0]},1.0,0.9\n"          # row 1: good
        f"{ids[1]},abc,0.9\n"          # row 2: not a number
        "77,1.0,0.9\n"                 # row 3: unknown decision
        f"{ids[2]},1.0,\n"             # row 4: satisfaction not known yet (issue 45): not a bad row
        f",1.0,1.0\n"                  # row 5: no id
        f"{ids[3]},nan,1.0\n"          # row 6: not finite
        f"{ids[4]},2.0,1.1\n"          # row 7: good
        f"{ids[5]},1_000,0.9\n")       # row 8: Python's float() reads 1_000 as 1000; a table does not
    before = (log.read_bytes(), (state / "decider.json").read_bytes())
    r = _cli(state, "--from", tmp_path / "bad.csv", "--log", log)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    err = r.stderr
    assert err.startswith("bayes-safe feedback: error: --from: bad.csv: 5 bad row(s), nothing applied: ")
    assert f"row 2 (decision_id '{ids[1]}'): reward: expected a number, got 'abc'" in err
    assert "row 3 (decision_id '77'): decision_id: unknown decision '77'" in err
    assert "row 4 " not in err  # an empty cell is a metric not known yet
    assert "row 5: decision_id: missing" in err
    assert f"row 6 (decision_id '{ids[3]}'): reward: expected a finite number" in err
    assert f"row 8 (decision_id '{ids[5]}'): reward: expected a number, got '1_000'" in err
    assert "row 1 " not in err and "row 7" not in err
    assert _feedback_rows(log) == [] and (state / "decider.json").read_bytes() == before[1]
    # columns the policy needs, missing: one line naming them
    pd.DataFrame({"decision_id": ids[:2], "reward": [1.0, 2.0]}).to_csv(tmp_path / "short.csv", index=False)
    r = _cli(state, "--from", tmp_path / "short.csv", "--log", log)
    assert r.returncode == 2 and "['satisfaction']" in r.stderr and r.stderr.count("\n") == 1


def test_parquet_without_pyarrow_names_the_extra(tmp_path, capsys, monkeypatch):
    state = _state(tmp_path / "state")
    (tmp_path / "outcomes.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if the serve extra were not installed
    with pytest.raises(SystemExit) as exc:
        main(["feedback", str(state), "--from", str(tmp_path / "outcomes.parquet")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "pip install 'bayes-safe[serve]'" in err and err.count("\n") == 1


def test_a_crash_after_the_log_commit_loses_nothing(tmp_path, monkeypatch):
    """The rows are in the log before the state is saved: a failed save (as a kill would leave it)
    is made good by the next load, which replays them, exactly once."""
    from bayes_safe.online.bulk import apply_outcomes

    log = DecisionLog(tmp_path / "log.sqlite")
    live = Decider(_policy(), num_draws=50, seed=0, log=log)
    decisions = [live.decide(OFFERS, baseline=0) for _ in range(5)]
    live.save(tmp_path / "state")
    log.close()
    pd.DataFrame({"decision_id": [d.decision_id for d in decisions], "reward": 1.0,
                  "satisfaction": 1.0}).to_csv(tmp_path / "o.csv", index=False)

    def killed(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Decider, "save", killed)
    with pytest.raises(OSError):
        apply_outcomes(tmp_path / "state", tmp_path / "o.csv", log=tmp_path / "log.sqlite")
    monkeypatch.undo()
    assert Decider.load(tmp_path / "state").model_version == 0  # the snapshot never got them
    out = apply_outcomes(tmp_path / "state", tmp_path / "o.csv", log=tmp_path / "log.sqlite")
    assert out["recovered"] == {"decisions": 0, "feedback": 5} and out["applied"] == 0 and out["duplicates"] == 5
    assert Decider.load(tmp_path / "state").model_version == 5
