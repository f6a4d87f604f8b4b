"""Three ``bayes-safe serve --replica`` processes on one PostgreSQL log (issue 29): a real HTTP
client sends decisions and feedback to random replicas, one replica is SIGKILLed and restarted,
and every replica's posterior ends equal to the one-process posterior of the logged feedback.
"""

from __future__ import annotations

import json
import signal
import time

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from serving import ServeProcess

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.online import Decider, DecisionLog

F64 = torch.float64
D = 3


def _policy():
    prior = dist.Normal(torch.zeros(D, dtype=F64), torch.ones(D, dtype=F64)).to_event(1)
    return TSASC(BayesianLinear(prior, noise_std=0.5), [BayesianLinear(prior, noise_std=0.5)], alpha=0.2)


def _reference(url) -> dict:
    """Per model role, the posterior mean and sd of the prior updated once with every logged feedback in log order."""
    policy = _policy()
    for _, _, y, c, a, K, ctx in DecisionLog(url, read_only=True).feedback_since(0, 1_000_000):
        x = torch.tensor(ctx, dtype=F64).reshape(K, -1)[a][None]
        policy.update(x, torch.tensor([y], dtype=F64), torch.tensor([c], dtype=F64), actions=torch.tensor([a]))
    return {role: (m.posterior_mean.numpy(), m.posterior_covariance.diagonal().sqrt().numpy())
            for role, m in policy.models().items()}


def _wait_synced(replicas, high: int, timeout: float = 30.0) -> list[dict]:
    """Each replica's /posterior once its watermark has reached log row ``high``."""
    deadline = time.time() + timeout
    while True:
        answers = [r.client.get("/posterior").json() for r in replicas]
        if all(a["log_seq"] >= high for a in answers):
            return answers
        assert time.time() < deadline, f"replicas did not sync to row {high}: {[a['log_seq'] for a in answers]}"
        time.sleep(0.1)


@pytest.mark.slow
def test_three_replicas_with_one_killed_learn_exactly_the_logged_feedback(tmp_path, postgres_server):
    url, state = postgres_server.url(), tmp_path / "state"
    Decider(_policy(), num_draws=50, seed=1).save(state)
    rng = np.random.default_rng(7)
    args = ("--log", url, "--replica", "--sync-every", "0.2")
    started = []

    def start():
        started.append(ServeProcess(state, *args, stderr=tmp_path / f"replica{len(started)}.err", snapshot_every=0.5))
        return started[-1]

    try:
        replicas = [start(), start(), start()]
        assert "a replica:" in replicas[0].first_line
        writers = [r.client.get("/posterior").json()["writer"] for r in replicas]
        assert writers == [True, False, False]  # the first holds the state's lock: one snapshot writer
        acknowledged, decided = {}, []
        for i in range(150):
            if i == 70:  # the writer dies mid-traffic, without a shutdown snapshot
                code, _ = replicas[0].kill()
                assert code == -signal.SIGKILL
                replicas[0] = start()
            r = replicas[rng.integers(0, 3)]
            features = rng.normal(size=(4, D)).tolist()
            d = r.client.post("/decide", json={"features": features, "baseline": 0})
            assert d.status_code == 200, d.text
            d = d.json()
            decided.append(d["decision_id"])
            if rng.random() < 0.8:
                body = {"decision_id": d["decision_id"], "reward": float(rng.normal()),
                        "constraints": [float(rng.normal())]}
                answer = replicas[rng.integers(0, 3)].client.post("/feedback", json=body)
                assert answer.json() == {"accepted": True}, answer.text
                acknowledged[d["decision_id"]] = body
                if rng.random() < 0.2:  # re-sent to another replica: acknowledged, ignored
                    again = replicas[rng.integers(0, 3)].client.post("/feedback", json=body | {"reward": 99.0})
                    assert again.json() == {"accepted": False}
        assert len(set(decided)) == len(decided)  # ids unique across replicas, the restarted one's too
        # outcomes in bulk at one replica for decisions the others made
        rest = [k for k in decided if k not in acknowledged][:10]
        bulk = [{"decision_id": k, "reward": 0.5, "constraints": [0.25]} for k in rest]
        answer = replicas[1].client.post("/feedback", json=bulk).json()
        assert answer["applied"] == len(rest)
        acknowledged.update({b["decision_id"]: b for b in bulk})

        # the database goes down: clear 503s and a degraded /health; back up: the same replicas carry on
        postgres_server.stop()
        try:
            down = replicas[2].client.post("/decide", json={"features": np.eye(D).tolist(), "baseline": 0})
            assert down.status_code == 503 and "LogUnavailable" in down.json()["detail"]
            refused = replicas[1].client.post("/feedback", json={"decision_id": decided[-1], "reward": 0.0,
                                                                 "constraints": [0.0]})
            assert refused.status_code == 503
            deadline = time.time() + 10
            while replicas[0].client.get("/health").status_code != 503:  # its next sync fails
                assert time.time() < deadline, "/health stayed ok with the database down"
                time.sleep(0.1)
            assert any("the last sync failed" in p for p in replicas[0].client.get("/health").json()["problems"])
        finally:
            postgres_server.start()
        d = replicas[2].client.post("/decide", json={"features": np.eye(D).tolist(), "baseline": 0}).json()
        body = {"decision_id": d["decision_id"], "reward": 1.0, "constraints": [0.5]}
        assert replicas[0].client.post("/feedback", json=body).json() == {"accepted": True}
        acknowledged[d["decision_id"]] = body

        log = DecisionLog(url, read_only=True)
        assert log.feedback_count() == len(acknowledged)  # every acknowledged feedback, once
        logged = {k: (r, c) for _, k, r, c, *_ in log.feedback_since(0, 1_000_000)}
        assert {k: (b["reward"], b["constraints"]) for k, b in acknowledged.items()} == {
            ids: logged[ids.split("-")[0]] for ids in acknowledged}
        answers = _wait_synced(replicas, log.feedback_high())
        reference = _reference(url)
        deadline = time.time() + 10
        while any(r.client.get("/health").status_code != 200 for r in replicas):  # recovered, no restart
            assert time.time() < deadline, [r.client.get("/health").json() for r in replicas]
            time.sleep(0.1)
        for a in answers:
            assert a["model_version"] == len(acknowledged)
            for role, (mean, sd) in reference.items():
                assert np.max(np.abs(np.array(a["models"][role]["mean"]) - mean)) < 1e-10
                assert np.max(np.abs(np.array(a["models"][role]["sd"]) - sd)) < 1e-10
        # one of the survivors took over the snapshots when the writer died
        deadline = time.time() + 10
        while sum(r.client.get("/posterior").json()["writer"] for r in replicas) != 1:
            assert time.time() < deadline, "no replica took over the snapshots"
            time.sleep(0.2)
        for r in replicas:
            code, err = r.kill(signal.SIGTERM)
            assert code == 0, err
        meta = json.loads((state / "decider.json").read_text())["replica"]
        assert meta == {"log_seq": log.feedback_high(), "applied": len(acknowledged)}
    finally:
        for r in started:
            if r.proc.poll() is None:
                r.kill()
