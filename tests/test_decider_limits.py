"""The Decider's own guards (issue 28): unguessable ids, declared limits on every number, a mask
that allows nothing, tampered saved states. Each finding of the audit is reproduced here on a
problem written in this file (two offers, a conversion reward, a binary unsubscribe metric
learned by a logistic model), first in process and then through a real ``bayes-safe serve``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.state import StateError

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]
OFFERS = np.array([[1.0, 0.0, 0.2], [0.0, 1.0, 0.5], [0.5, 0.5, 0.9]])  # three emails, 3 features each


def _email_policy():
    """Reward: conversions (Gaussian); guardrail: unsubscribes (0/1, a logistic model)."""
    prior = dist.Normal(torch.zeros(3, dtype=F64), 1.0).to_event(1)
    return TSASC(BayesianLinear(prior, noise_std=0.5), [BayesianLinear(prior, likelihood="logistic")], alpha=0.3)


def _posterior(decider):
    return {role: m.posterior_mean.clone() for role, m in decider.policy.models().items()}


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------- ids
def test_ids_are_signed_numbers_and_nothing_else_is_known(tmp_path):
    decider = Decider(_email_policy(), num_draws=20, seed=0, log=tmp_path / "log.sqlite")
    ds = [decider.decide(OFFERS, baseline=0) for _ in range(6)]
    ids = [d.decision_id for d in ds]
    assert all(re.fullmatch(r"[0-9]+-[0-9a-f]{32}", k) for k in ids) and len({k.split("-")[1] for k in ids}) == 6
    # another Decider (another key) issues other tags for the same numbers
    assert Decider(_email_policy(), num_draws=20, seed=0).public_id(0) != ids[0]
    before = _posterior(decider)
    # a stranger's guesses: the numbers alone, a leading zero, a tag from another decision, a
    # number not issued yet with a valid-looking tag; refused alike, the log untouched
    guesses = ["0", "05", "5", f"1-{ids[0].split('-')[1]}", f"6-{ids[5].split('-')[1]}", ids[0].upper(), " " + ids[0]]
    for guess in guesses:
        with pytest.raises(ValueError) as err:
            decider.feedback(guess, 1.0, [0.0])
        assert str(err.value).startswith("decision_id: unknown decision") and "issued ids" not in str(err.value)
    assert decider.log.to_dataframe()["reward"].isna().all() and _same(before, _posterior(decider))
    # the owner's real feedback is then accepted, once
    assert decider.feedback(ids[5], 1.0, [0.0]) is True and decider.feedback(ids[5], 1.0, [0.0]) is False
    # the log keys decisions by number: the part of the id before the dash
    assert decider.log.to_dataframe(with_feedback_only=True)["decision_id"].tolist() == ["5"]


def test_a_state_saved_before_ids_were_signed_keeps_its_plain_ids(tmp_path):
    decider = Decider(_email_policy(), num_draws=20, seed=0)
    ds = [decider.decide(OFFERS, baseline=0) for _ in range(3)]
    decider.feedback(ds[0].decision_id, 1.0, [0.0])
    decider.save(tmp_path / "state")
    meta = json.loads((tmp_path / "state" / "decider.json").read_text())
    for key in ("id_key", "legacy_below"):
        del meta[key]  # as an older bayes_safe wrote it, when ids were '0', '1', ...
    (tmp_path / "state" / "decider.json").write_text(json.dumps(meta))
    old = Decider.load(tmp_path / "state")
    assert old.feedback("1", 1.0, [0.0]) is True and old.feedback("0", 1.0, [0.0]) is False  # issued before
    new = old.decide(OFFERS, baseline=0)
    assert re.fullmatch(r"3-[0-9a-f]{32}", new.decision_id)
    with pytest.raises(ValueError, match="decision_id: unknown decision"):
        old.feedback("3", 1.0, [0.0])  # issued after: signed only
    assert old.feedback(new.decision_id, 1.0, [0.0]) is True


# ---------------------------------------------------------------------------------- limits
@pytest.mark.parametrize("field, value, message", [
    ("reward", 1e300, r"reward: expected \|value\| <= 1e\+06 \(the Decider's outcome_limit"),
    ("reward", 10**400, "reward: expected a finite number, got an integer of 401 digits"),
    ("reward", -2e6, r"reward: expected \|value\| <= 1e\+06"),
    ("constraint", 0.5, "constraints\\[0\\]: expected 0 or 1 \\(its model learns binary outcomes\\), got 0.5"),
    ("constraint", 2.0, "constraints\\[0\\]: expected 0 or 1"),
])
def test_an_outcome_over_its_limit_never_reaches_the_posterior_or_the_log(tmp_path, field, value, message):
    decider = Decider(_email_policy(), num_draws=20, seed=0, log=tmp_path / "log.sqlite")
    d = decider.decide(OFFERS, baseline=0)
    before = _posterior(decider)
    reward, constraints = (value, [0.0]) if field == "reward" else (1.0, [value])
    with pytest.raises(ValueError, match=message):
        decider.feedback(d.decision_id, reward, constraints)
    with pytest.raises(ValueError, match=message):
        decider.feedback_many([(d.decision_id, reward, constraints)])
    assert decider.log.to_dataframe()["reward"].isna().all() and _same(before, _posterior(decider))
    assert decider.feedback(d.decision_id, 1.0, [1.0]) is True  # the decision is still pending


@pytest.mark.parametrize("features, message", [
    (OFFERS * np.array([1.0, 1.0, 1e200]), r"features: expected \|value\| <= 1e\+06 \(the Decider's feature_limit"),
    (OFFERS.tolist()[:2] + [[0.5, 10**400, 0.9]], "features: expected finite numbers, got an integer too large"),
    ((OFFERS * 2e6).astype(np.float32), r"features: expected \|value\| <= 1e\+06"),
])
def test_features_over_the_limit_are_refused_before_anything_is_logged(tmp_path, features, message):
    decider = Decider(_email_policy(), num_draws=20, seed=0, log=tmp_path / "log.sqlite")
    with pytest.raises(ValueError, match=message):
        decider.decide(features, baseline=0)
    assert len(decider.log) == 0 and decider.next_id == 0


def test_limits_are_declared_per_state_and_kept_by_save(tmp_path):
    decider = Decider(_email_policy(), num_draws=20, seed=0, feature_limit=1e9, outcome_limit=50.0)
    d = decider.decide(OFFERS * 1e8, baseline=0)  # within the declared feature scale
    with pytest.raises(ValueError, match=r"reward: expected \|value\| <= 50"):
        decider.feedback(d.decision_id, 60.0, [0.0])
    decider.save(tmp_path / "state")
    back = Decider.load(tmp_path / "state")
    assert (back.feature_limit, back.outcome_limit) == (1e9, 50.0)
    with pytest.raises(ValueError, match=r"reward: expected \|value\| <= 50"):
        back.feedback(d.decision_id, 60.0, [0.0])
    for bad in ({"feature_limit": 0}, {"outcome_limit": float("inf")}, {"feature_limit": "big"}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}: expected a positive finite number"):
            Decider(_email_policy(), **bad)


def test_a_mask_that_allows_nothing_is_refused():
    decider = Decider(_email_policy(), num_draws=20, seed=0)
    with pytest.raises(ValueError, match="valid: every action is masked out"):
        decider.decide(OFFERS, baseline=0, valid=[False, False, False])
    assert decider.next_id == 0
    assert decider.decide(OFFERS, baseline=0, valid=[True, False, True]).action in (0, 2)


# ---------------------------------------------------------------------------------- tampered states
def _tampered(tmp_path, change) -> Path:
    decider = Decider(_email_policy(), num_draws=20, seed=0)
    decider.decide(OFFERS, baseline=0)
    decider.save(tmp_path / "state")
    path = tmp_path / "state" / "decider.json"
    meta = json.loads(path.read_text())
    text = change(meta)
    path.write_text(text if isinstance(text, str) else json.dumps(meta))
    return tmp_path / "state"


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(next_id=-5), "next_id=-5"),
    (lambda m: m["pending"]["0"].update(features=[1.0]), "decision '0' holds 1 features; the policy's models take"),
    (lambda m: m.update(pending={"7": {"features": [1.0, 0.0, 0.2], "action": 0}}), "decision '7' is not one of"),
    (lambda m: m.update(pending={"00": {"features": [1.0, 0.0, 0.2], "action": 0}}), "decision '00' is not one of"),
    (lambda m: m.update(num_draws=10**12), r"num_draws: expected an int in \[2, 100000\]"),
    (lambda m: m.update(id_key=base64.b64encode(b"short").decode()), "id_key of 5 bytes"),
    (lambda m: "[" * 100_000 + "]" * 100_000, "nested too deep"),
])
def test_a_tampered_state_is_refused_by_name(tmp_path, change, message):
    state = _tampered(tmp_path, change)
    with pytest.raises(StateError, match=message):
        Decider.load(state)


# ---------------------------------------------------------------------------------- the service
@pytest.fixture
def served(tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    Decider(_email_policy(), num_draws=20, seed=0).save(tmp_path / "state")
    proc = subprocess.Popen([sys.executable, "-m", "bayes_safe.cli", "serve", str(tmp_path / "state"), "--port", "0",
                             "--log", str(tmp_path / "log.sqlite")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
    client = httpx.Client(base_url=match.group(1), timeout=30, headers={"content-type": "application/json"})
    yield client
    client.close()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_the_service_refuses_huge_numbers_and_forged_ids_by_name(served, tmp_path):
    d = served.post("/decide", json={"features": OFFERS.tolist(), "baseline": 0}).json()
    before = served.get("/posterior").json()
    r = served.post("/feedback", json={"decision_id": d["decision_id"], "reward": 1e300, "constraints": [0.0]})
    assert r.status_code == 422 and r.json()["detail"].startswith("reward: expected |value| <= 1e+06"), r.text
    r = served.post("/feedback", content=b'{"decision_id": "%s", "reward": 1%s, "constraints": [0]}'
                    % (d["decision_id"].encode(), b"0" * 400))
    assert r.status_code == 422 and r.json()["detail"].startswith("reward: ") and "401 digits" in r.text, r.text
    r = served.post("/decide", json={"features": (OFFERS * np.array([1, 1, 1e200])).tolist(), "baseline": 0})
    assert r.status_code == 422 and "feature_limit" in r.json()["detail"], r.text
    for guess in ("0", "05", d["decision_id"].split("-")[0] + "-" + "f" * 32):
        r = served.post("/feedback", json={"decision_id": guess, "reward": 1.0, "constraints": [0.0]})
        assert r.status_code == 404 and "issued ids" not in r.text and "'0' to" not in r.text, r.text
    assert served.get("/posterior").json() == before  # nothing reached the posterior
    r = served.post("/feedback", json={"decision_id": d["decision_id"], "reward": 1.0, "constraints": [1.0]})
    assert r.status_code == 200 and r.json() == {"accepted": True}
    log = DecisionLog(tmp_path / "log.sqlite", read_only=True)
    try:
        assert log.to_dataframe(with_feedback_only=True)["reward"].tolist() == [1.0]
    finally:
        log.close()
