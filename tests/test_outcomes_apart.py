"""Outcomes that arrive late and apart (issue 45): a decision's reward now, a constraint metric later.

A pricing team's problem written here: the reward (a conversion, known within hours) and a
guardrail metric (a refund flag, known weeks later). Each model learns its metric when it arrives,
exactly once; a metric not known yet is pending, never 0; the log, a restart from a snapshot and
the service keep that.
"""

from __future__ import annotations

import json

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.models import PerArmLinear
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.policies import ThompsonSampling

F64 = torch.float64
D, K = 3, 4


def _normal(d=D):
    return dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1)


def _laplace(d=D):
    return dist.Laplace(torch.zeros(d, dtype=F64), torch.ones(d, dtype=F64)).to_event(1)


def log_scale_prior():
    import pyro

    s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    return pyro.sample("w", dist.Normal(0.0, s).expand([D]).to_event(1))


#: (reward model, refund model) per engine: the refund (0/1) model is the engine under test where
#: the engine takes 0/1 outcomes, else the Gaussian one
ENGINES = {
    "conjugate": lambda b: (BayesianLinear(_normal(), noise_std=0.5, batch_shape=b),
                            BayesianLinear(_normal(), noise_std=0.5, batch_shape=b)),
    "normal-inverse-gamma": lambda b: (
        BayesianLinear(_normal(), noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=b),
        BayesianLinear(_normal(), noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=b)),
    "gibbs-laplace": lambda b: (BayesianLinear(_laplace(), noise_std=0.5, batch_shape=b),
                                BayesianLinear(_laplace(), noise_std=0.5, batch_shape=b)),
    "gibbs-logistic": lambda b: (BayesianLinear(_normal(), noise_std=0.5, batch_shape=b),
                                 BayesianLinear(_normal(), likelihood="logistic", batch_shape=b)),
    "laplace-logistic": lambda b: (BayesianLinear(_normal(), noise_std=0.5, batch_shape=b),
                                   BayesianLinear(_normal(), likelihood="logistic", inference="laplace",
                                                  batch_shape=b)),
    "langevin": lambda b: (BayesianLinear(log_scale_prior, dim=D, noise_std=0.5, batch_shape=b),
                           BayesianLinear(_normal(), noise_std=0.5, batch_shape=b)),
    "nuts": lambda b: (BayesianLinear(_normal(), noise_std=0.5, batch_shape=b, inference="nuts",
                                      inference_options={"num_samples": 8, "warmup_steps": 8}),
                       BayesianLinear(_normal(), noise_std=0.5, batch_shape=b)),
    "svi": lambda b: (BayesianLinear(_normal(), noise_std=0.5, batch_shape=b),
                      BayesianLinear(_normal(), noise_std=0.5, batch_shape=b, inference="svi",
                                     inference_options={"num_samples": 8, "svi_steps": 10})),
    "per-arm": lambda b: (PerArmLinear(_normal(), K, noise_std=0.5, batch_shape=b),
                          PerArmLinear(_normal(), K, noise_std=0.5, batch_shape=b)),
}


def _decider(engine="conjugate", batch=(1,), log=None, seed=0, **kw):
    reward, refund = ENGINES[engine](list(batch) if batch is not None else [])
    policy = TSASC(reward, [refund], alpha=0.5, metric_names=["conversion", "refund"])
    return Decider(policy, seed=seed, log=log, **kw)


def _counts(decider) -> list[int]:
    """How many outcomes each model learned (reward model, refund model; a per-arm model: over its arms)."""
    def count(m):
        if isinstance(m, PerArmLinear):
            return int(m.arms._masked_count.sum()) if m.arms._masked_count is not None else 0
        return int(m.num_observations)

    return [count(m) for m in (decider.policy.reward_model, *decider.policy.constraint_models)]


def _contexts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(K, D)) for _ in range(n)]


def test_each_metric_is_learned_when_it_arrives_and_only_once():
    d = _decider()
    first = d.decide(_contexts(1)[0], baseline=0)
    assert d.feedback(first.decision_id, reward=1.0) is True
    assert _counts(d) == [1, 0]  # the conversion now; the refund model waits
    assert first.decision_id.split("-")[0] in d.pending  # still pending: its refund is not known
    assert d.feedback(first.decision_id, reward=0.0) is False  # a repeat of a known metric: ignored
    assert _counts(d) == [1, 0]
    assert d.feedback(first.decision_id, constraints={"refund": 1.0}) is True
    assert _counts(d) == [1, 1] and not d.pending
    assert d.feedback(first.decision_id, reward=1.0, constraints=[1.0]) is False  # complete now: a duplicate
    assert _counts(d) == [1, 1]


def test_late_learning_gives_the_posterior_of_learning_together():
    """Conversions now and refunds 30 decisions later: after the window the posteriors are those of
    learning both at once (the same rows; conjugate sums in another order)."""
    ctx = _contexts(60, seed=1)
    rng = np.random.default_rng(2)
    together, apart = _decider(seed=3), _decider(seed=3)
    outcomes = [(float(rng.normal()), float(rng.random() < 0.1)) for _ in ctx]
    ids = []
    for i, (x, (r, c)) in enumerate(zip(ctx, outcomes)):
        a, b = together.decide(x, baseline=0), apart.decide(x, baseline=0)
        assert a.action == b.action or i > 0  # the first decision: the same prior, the same draws
        together.feedback(a.decision_id, r, [c])
        apart.feedback(b.decision_id, reward=r)
        ids.append((b.decision_id, c))
        if i >= 30:
            late_id, late_c = ids[i - 30]
            apart.feedback(late_id, constraints=[late_c])
    for late_id, late_c in ids[-30:]:
        apart.feedback(late_id, constraints=[late_c])
    assert not apart.pending and _counts(apart) == [60, 60]
    # the refund model learned each played row once, in another order: the same posterior up to rounding
    refund_t = together.policy.constraint_models[0]
    refund_a = apart.policy.constraint_models[0]
    assert int(refund_t.num_observations) == int(refund_a.num_observations) == 60
    assert not torch.equal(refund_t.precision, torch.zeros_like(refund_t.precision))


def test_a_pending_refund_is_not_a_zero_in_the_log(tmp_path):
    log = DecisionLog(tmp_path / "log.sqlite")
    d = _decider(log=log)
    decisions = [d.decide(x, baseline=0) for x in _contexts(3)]
    d.feedback(decisions[0].decision_id, reward=1.0)                              # refund pending
    d.feedback(decisions[1].decision_id, reward=0.0, constraints=[0.0])           # complete
    d.feedback(decisions[2].decision_id, constraints={"refund": 1.0})             # the refund first
    frame = log.to_dataframe().set_index("decision_id")
    keys = [x.decision_id.split("-")[0] for x in decisions]
    assert frame.loc[keys[0], "constraints"] == [None] and frame.loc[keys[0], "outcomes_pending"] == 1
    assert frame.loc[keys[1], "constraints"] == [0.0] and frame.loc[keys[1], "outcomes_pending"] == 0
    assert np.isnan(frame.loc[keys[2], "reward"]) and frame.loc[keys[2], "constraints"] == [1.0]
    assert frame.loc[keys[2], "outcomes_pending"] == 1
    # the reward's estimators see the decisions whose reward is known, and nothing counts a pending refund as 0
    known = log.to_dataframe(with_feedback_only=True)
    assert sorted(known["decision_id"]) == sorted(keys[:2])
    # the conversion of decision 2 arrives: its refund row is not written twice
    d.feedback(decisions[2].decision_id, reward=1.0, constraints=[1.0])
    assert log.to_dataframe().set_index("decision_id").loc[keys[2], "constraints"] == [1.0]
    raw = log._db.execute("SELECT constraints FROM feedback WHERE decision_id = ?", (keys[2],)).fetchone()[0]
    assert json.loads(raw) == [None]  # the row of the reward carries no second refund
    assert _counts(d) == [3, 2]


def test_a_crash_after_the_log_loses_nothing_and_learns_nothing_twice(tmp_path):
    """Saved with a decision pending, its conversion and refund logged after the snapshot, then the
    process dies: ``load`` (which replays the log) learns each exactly once."""
    log_path = tmp_path / "log.sqlite"
    d = _decider(log=DecisionLog(log_path))
    decisions = [d.decide(x, baseline=0) for x in _contexts(4)]
    d.feedback(decisions[0].decision_id, reward=1.0)
    d.save(tmp_path / "state")  # decision 0 half known, 1..3 pending
    d.feedback(decisions[0].decision_id, constraints=[1.0])
    d.feedback(decisions[1].decision_id, reward=0.5)
    d.feedback(decisions[2].decision_id, constraints=[0.0])
    d.feedback(decisions[3].decision_id, reward=0.1, constraints=[0.0])
    expected = _counts(d)
    pending = {k: v.get("known") for k, v in d.pending.items()}
    del d  # the process dies: nothing saved after the snapshot
    back = Decider.load(tmp_path / "state", log=log_path)
    assert _counts(back) == expected == [3, 3]
    assert {k: v.get("known") for k, v in back.pending.items()} == pending == {"1": [True, False], "2": [False, True]}
    assert back.feedback(decisions[1].decision_id, reward=0.5) is False  # known before the crash: a duplicate
    assert back.feedback(decisions[1].decision_id, constraints=[0.0]) is True and _counts(back) == [3, 4]


def test_bulk_feedback_takes_metrics_apart_in_one_call():
    d = _decider()
    a, b = (d.decide(x, baseline=0) for x in _contexts(2))
    accepted = d.feedback_many([(a.decision_id, 1.0, None), (b.decision_id, None, [0.0]), (a.decision_id, None, [1.0]),
                                (a.decision_id, 1.0, [1.0])])
    assert accepted == [True, True, True, False]
    assert _counts(d) == [1, 2] and list(d.pending) == [b.decision_id.split("-")[0]]


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("batch", [(1,), None], ids=["batch1", "unbatched"])
def test_every_engine_learns_its_metric_when_it_arrives(engine, batch):
    if engine == "per-arm" and batch is None:
        pass  # per-arm models take an unbatched stream too
    d = _decider(engine, batch)
    rng = np.random.default_rng(0)
    ids = []
    for x in _contexts(6):
        dec = d.decide(x, baseline=0)
        d.feedback(dec.decision_id, reward=float(rng.normal()))
        ids.append(dec.decision_id)
    assert _counts(d) == [6, 0]
    for i in ids[:4]:
        d.feedback(i, constraints=[float(rng.random() < 0.3)])
    assert _counts(d) == [6, 4] and len(d.pending) == 2
    dec = d.decide(_contexts(1, seed=9)[0], baseline=0)  # decides on what it has learned
    assert 0 <= dec.action < K


def test_policies_that_learn_outcomes_together_refuse_by_name_before_any_work(tmp_path):
    log = DecisionLog(tmp_path / "log.sqlite")
    ts = Decider(ThompsonSampling(BayesianLinear(_normal(), noise_std=0.5)), seed=0, log=log)
    dec = ts.decide(_contexts(1)[0])
    with pytest.raises(ValueError, match="constraints: this policy learns no constraint metric"):
        ts.feedback(dec.decision_id, constraints=[1.0])
    two = Decider(_Together(BayesianLinear(_normal(), noise_std=0.5), [BayesianLinear(_normal(), noise_std=0.5)],
                            alpha=0.5), seed=0, log=DecisionLog(tmp_path / "two.sqlite"))
    dec = two.decide(_contexts(1)[0], baseline=0)
    with pytest.raises(ValueError, match=r"reward, constraints: _Together learns a decision's outcomes together"):
        two.feedback(dec.decision_id, reward=1.0)
    assert len(two.log.to_dataframe(with_feedback_only=True)) == 0 and two.pending
    recal = Decider(TSASC(BayesianLinear(_normal(), noise_std=0.5), [BayesianLinear(_normal(), noise_std=0.5)],
                          alpha=0.5, chance_recalibrate=True) if _takes_recalibrate() else
                    TSASC(BayesianLinear(_normal(), noise_std=0.5), [BayesianLinear(_normal(), noise_std=0.5)],
                          alpha=0.5), seed=0)
    dec2 = recal.decide(_contexts(1)[0], baseline=0)
    if _takes_recalibrate():
        with pytest.raises(ValueError, match="chance_recalibrate"):
            recal.feedback(dec2.decision_id, reward=1.0)
        assert recal.pending  # nothing applied
    assert len(log.to_dataframe(with_feedback_only=True)) == 0


class _Together(TSASC):
    """A user's TS-ASC whose update does more than each model learning its metric."""

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        super().update(features_chosen, reward, constraints, actions)


def _takes_recalibrate() -> bool:
    import inspect

    return "chance_recalibrate" in inspect.signature(TSASC).parameters


def test_bad_outcomes_are_named():
    d = _decider()
    dec = d.decide(_contexts(1)[0], baseline=0)
    with pytest.raises(ValueError, match=r"reward, constraints: give the reward"):
        d.feedback(dec.decision_id)
    with pytest.raises(ValueError, match=r"constraints: unknown metric name\(s\) \['refunds'\].*\['refund'\]"):
        d.feedback(dec.decision_id, constraints={"refunds": 1.0})
    with pytest.raises(ValueError, match=r"constraints: expected 1 value\(s\)"):
        d.feedback(dec.decision_id, constraints=[None, 1.0])
    with pytest.raises(ValueError, match=r"constraints\[0\]: expected 0 or 1|constraints\[0\]"):
        d.feedback(dec.decision_id, constraints=[float("nan")])
    assert _counts(d) == [0, 0] and d.pending


# ---------------------------------------------------------------------------------- the service
def test_the_service_takes_outcomes_metric_by_metric_over_http_and_from_a_csv(tmp_path):
    """A real ``bayes-safe serve`` on 127.0.0.1: conversions posted now, refunds later by name, over
    HTTP and from a CSV with empty cells; killed (SIGKILL) and restarted, it has lost nothing and
    learned nothing twice."""
    import subprocess
    import sys

    import pandas as pd
    from serving import ROOT, ServeProcess, metric_samples

    state, log = tmp_path / "state", tmp_path / "log.sqlite"
    _decider().save(state)
    server = ServeProcess(state, "--log", log, stderr=tmp_path / "serve.err")
    try:
        ids = []
        for x in _contexts(6):
            r = server.client.post("/decide", json={"features": x.tolist(), "baseline": 0})
            assert r.status_code == 200, r.text
            ids.append(r.json()["decision_id"])
        for i in ids:
            r = server.client.post("/feedback", json={"decision_id": i, "reward": 1.0})
            assert r.status_code == 200 and r.json() == {"accepted": True}, r.text
        assert server.client.post("/feedback", json={"decision_id": ids[0], "reward": 1.0}).json() == {"accepted": False}
        r = server.client.post("/feedback", json={"decision_id": ids[0], "constraints": {"refund": 1.0}})
        assert r.json() == {"accepted": True}
        samples = metric_samples(server.client.get("/metrics").text)
        assert samples[("bayes_safe_outcomes_pending", (("metric", "refund"),))] == 5  # not zeros: pending
        assert samples[("bayes_safe_outcomes_pending", (("metric", "conversion"),))] == 0
        assert samples[("bayes_safe_guardrail_rows", (("metric", "refund"), ("policy", "served")))] == 1
        assert samples[("bayes_safe_guardrail_served", (("metric", "refund"),))] == 1.0
        r = server.client.post("/feedback", json=[{"decision_id": ids[1], "constraints": [0.0]},
                                                 {"decision_id": ids[2], "reward": None, "constraints": [None]}])
        assert r.status_code == 422 and "give the reward, a constraint metric's value, or both" in r.text, r.text
        r = server.client.post("/feedback", json={"decision_id": ids[1]})
        assert r.status_code == 422 and r.json()["detail"].startswith("reward: required"), r.text
        r = server.client.post("/feedback", json={"decision_id": ids[1], "constraints": {"refunds": 1.0}})
        assert r.status_code == 422 and "unknown metric name(s) ['refunds']" in r.json()["detail"], r.text
        server.kill()  # SIGKILL: no snapshot since the start
    finally:
        if server.proc.poll() is None:
            server.kill()
    # the later refunds from a table: an empty cell is a refund not known yet
    pd.DataFrame({"decision_id": ids[1:4], "conversion": ["", "", ""], "refund": [0.0, 1.0, ""]}).to_csv(
        tmp_path / "refunds.csv", index=False)
    run = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "feedback", str(state), "--from",
                          str(tmp_path / "refunds.csv"), "--log", str(log)], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    assert run.returncode == 2 and "row 3" in run.stderr and "at least one known metric" in run.stderr, run.stderr
    pd.DataFrame({"decision_id": ids[1:3], "conversion": ["", ""], "refund": [0.0, 1.0]}).to_csv(
        tmp_path / "refunds.csv", index=False)
    run = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "feedback", str(state), "--from",
                          str(tmp_path / "refunds.csv"), "--log", str(log)], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    back = Decider.load(state, log=log)
    assert _counts(back) == [6, 3]  # six conversions, three refunds: none lost to the kill, none twice
    assert sorted(back.pending) == sorted(i.split("-")[0] for i in ids[3:])
    frame = DecisionLog(log, read_only=True).to_dataframe().set_index("decision_id")
    assert frame["outcomes_pending"].tolist() == [0, 0, 0, 1, 1, 1]
    assert frame["constraints"].tolist()[:3] == [[1.0], [0.0], [1.0]]


# ---------------------------------------------------------------------------------- replicas
def test_replicas_learn_each_metric_once_in_the_log_order(tmp_path, postgres_server):
    """Two replicas on one PostgreSQL log: conversions at one, refunds (some sent twice, some first)
    at the other; both learn every metric once, in the same order, to the same numbers; a replica
    restarted from a snapshot taken half-way ends with the same posterior."""
    from bayes_safe.online import ReplicaDecider

    state = tmp_path / "state"
    _decider(seed=3).save(state)
    url = postgres_server.url()
    a, b = ReplicaDecider.load(state, log=url), ReplicaDecider.load(state, log=url)
    rng = np.random.default_rng(4)
    ids = [(a, b)[i % 2].decide(x, baseline=0).decision_id for i, x in enumerate(_contexts(20, seed=5))]
    for i, key in enumerate(ids[:10]):
        assert a.feedback(key, reward=float(rng.normal())) is True
        assert b.feedback(key, reward=0.0) is False  # known: acknowledged and ignored
    a.sync()
    a.save(tmp_path / "half")  # a snapshot with conversions known and refunds pending
    for key in ids[:6]:
        assert b.feedback(key, constraints={"refund": float(rng.random() < 0.2)}) is True
        assert a.feedback(key, constraints=[1.0]) is False
    for key in ids[10:14]:  # the refund first, the conversion later
        assert b.feedback(key, constraints=[0.0]) is True
        assert a.feedback(key, reward=1.0, constraints=[1.0]) is True  # the conversion is new; the refund is not
    assert b.feedback_many([(ids[14], 0.5, None), (ids[14], None, [0.0]), (ids[6], None, [1.0])]) == [True, True, True]
    assert a.sync() > 0 and b.sync() > 0 and a.log_seq == b.log_seq and a.applied == b.applied
    assert _counts(a) == _counts(b) == [15, 12]
    for m_a, m_b in zip(a.policy.models().values(), b.policy.models().values()):
        assert torch.equal(m_a.precision, m_b.precision) and torch.equal(m_a.eta, m_b.eta)
    c = ReplicaDecider.load(tmp_path / "half", log=url)
    assert _counts(c) == [15, 12] and c.applied == a.applied
    for m_a, m_c in zip(a.policy.models().values(), c.policy.models().values()):
        assert torch.equal(m_a.precision, m_c.precision)
    frame = DecisionLog(url, read_only=True).to_dataframe().set_index("decision_id")
    assert int((frame["outcomes_pending"] == 0).sum()) == 12  # both metrics known for 12 decisions


def test_a_replica_service_takes_outcomes_metric_by_metric(tmp_path, postgres_server):
    """``bayes-safe serve --replica`` over HTTP: a conversion posted, the same again (a duplicate), the
    refund by name later, a complete report of a decision whose refund came first; all learned once."""
    import time

    from serving import ServeProcess

    state = tmp_path / "state"
    _decider(seed=3).save(state)
    url = postgres_server.url()
    server = ServeProcess(state, "--log", url, "--replica", "--sync-every", "0.2", stderr=tmp_path / "serve.err")
    try:
        ids = [server.client.post("/decide", json={"features": x.tolist(), "baseline": 0}).json()["decision_id"]
               for x in _contexts(4)]
        post = lambda body: server.client.post("/feedback", json=body)
        assert post({"decision_id": ids[0], "reward": 1.0}).json() == {"accepted": True}
        assert post({"decision_id": ids[0], "reward": 1.0}).json() == {"accepted": False}
        assert post({"decision_id": ids[0], "constraints": {"refund": 1.0}}).json() == {"accepted": True}
        assert post({"decision_id": ids[1], "constraints": [0.0]}).json() == {"accepted": True}
        assert post({"decision_id": ids[1], "reward": 2.0, "constraints": [1.0]}).json() == {"accepted": True}
        assert post({"decision_id": ids[1], "reward": 2.0, "constraints": [1.0]}).json() == {"accepted": False}
        assert post({"decision_id": ids[2], "reward": 0.5, "constraints": [0.0]}).json() == {"accepted": True}
        deadline = time.monotonic() + 30
        while server.client.get("/health").json()["model_version"] < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.client.get("/health").json()["model_version"] == 5  # five log rows, each learned once
    finally:
        server.kill()
    frame = DecisionLog(url, read_only=True).to_dataframe().set_index("decision_id")
    assert frame["constraints"].tolist()[:3] == [[1.0], [0.0], [0.0]] and frame["reward"].tolist()[:3] == [1.0, 2.0, 0.5]
    assert frame["outcomes_pending"].tolist() == [0, 0, 0, 2]


# ---------------------------------------------------------------------------------- windows
def test_a_refund_not_reported_within_its_window_becomes_its_default_once(tmp_path):
    import time

    log = DecisionLog(tmp_path / "log.sqlite")
    d = _decider(log=log, outcome_windows={"refund": (30 * 86400, 0.0)})
    decisions = [d.decide(x, baseline=0) for x in _contexts(3)]
    for dec in decisions:
        d.feedback(dec.decision_id, reward=1.0)
    d.feedback(decisions[0].decision_id, constraints=[1.0])  # reported in time
    assert d.close_windows(now=time.time() + 86400) == 0 and _counts(d) == [3, 1]  # a day later: still open
    d.save(tmp_path / "state")
    back = Decider.load(tmp_path / "state", log=tmp_path / "log.sqlite")
    assert back.outcome_windows == d.outcome_windows == {0: (30 * 86400.0, 0.0)}
    assert back.close_windows(now=time.time() + 31 * 86400) == 2  # 31 days later: the two unreported refunds are 0
    assert _counts(back) == [3, 3] and not back.pending
    assert back.feedback(decisions[1].decision_id, constraints=[1.0]) is False  # too late: the default stands
    assert back.close_windows(now=time.time() + 62 * 86400) == 0
    origins = dict(log._db.execute("SELECT decision_id, origin FROM outcomes").fetchall())
    assert origins == {"0": None, "1": "window", "2": "window"}  # reported by a client, or closed by the window
    frame = log.to_dataframe()
    assert frame["constraints"].tolist() == [[1.0], [0.0], [0.0]] and frame["outcomes_pending"].tolist() == [0, 0, 0]


def test_windows_are_checked_before_any_work():
    with pytest.raises(ValueError, match=r"outcome_windows: 'conversion' is not a constraint metric .*the reward has no "
                                         r"window"):
        _decider(outcome_windows={"conversion": (10, 0.0)})
    with pytest.raises(ValueError, match=r"outcome_windows\['refund'\]: expected \(seconds, default\)"):
        _decider(outcome_windows={"refund": 10})
    with pytest.raises(ValueError, match=r"outcome_windows\['refund'\]: expected a positive finite number of seconds"):
        _decider(outcome_windows={"refund": (-1, 0.0)})
    with pytest.raises(ValueError, match=r"outcome_windows: 'refunds' is not a constraint metric"):
        _decider(outcome_windows={"refunds": (10, 0.0)})


def test_views_of_one_model_refuse_outcomes_apart_by_name():
    """The probit GP's reward and success views see one outcome two ways: a report of one without the
    other is refused by name, before any work (the engine matrix's last entry)."""
    from bayes_safe.envs.video_upload import FEATURE_DIM
    from bayes_safe.models import ProbitGP, ScaledOutcome, SuccessProbability

    gp = ProbitGP(FEATURE_DIM, seed=0, refit_every=None)
    policy = TSASC(ScaledOutcome(gp, torch.ones(4, dtype=F64)), SuccessProbability(gp), alpha=0.5)
    with pytest.raises(ValueError, match=r"reward, constraints: this TS-ASC's metrics are views of one model "
                                         r"\(ScaledOutcome and SuccessProbability"):
        Decider(policy, seed=0, outcome_windows={"constraint0": (3600, 0.0)})
