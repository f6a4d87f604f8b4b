"""Issue 39 (items 1 and 6): ``/metrics`` exports the declared business limit of a guardrail, not the tuned bound
the policy enforces, exports that bound beside it, and never exports an interval of a rate outside [0, 1].

A policy served with a tuned tolerance (``policy_constraint(absolute("hide", at_most=0.02), 0.0032)``: the
policy keeps ``hide <= 0.0232``) used to export ``bayes_safe_guardrail_limit{metric="hide"} 0.0232``, so an
alert on the 2 % cap fired late; the served mean's normal interval and the baseline's delta-method one gave
``[0, 0]`` or a negative bound for a rate of 1 %.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pyro.distributions as dist
import pytest
import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.envs import Constraint
from bayes_safe.envs.tolerance import policy_constraint
from bayes_safe.online.metrics import GuardrailMonitor, _Sums, clopper_pearson, guardrails

F64 = torch.float64
CAP, TOLERANCE = 0.02, 0.0032


def _policy(tuned: bool = True):
    declared = Constraint.absolute("hide", at_most=CAP)
    constraint = policy_constraint(declared, TOLERANCE) if tuned else declared
    prior = dist.Normal(torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64)).to_event(1)
    reward = BayesianLinear(prior, noise_std=1.0)
    hide = BayesianLinear(dist.Normal(torch.tensor([0.01, 0.0], dtype=F64), 0.05).to_event(1), noise_std=0.1)
    return TSASC(reward, [hide], constraints=[constraint], metric_names=("click", "hide"))


def test_a_tuned_constraint_keeps_its_declared_limit_through_save_and_load(tmp_path):
    from bayes_safe.online import Decider

    Decider(_policy(), num_draws=16, seed=0).save(tmp_path / "state")
    c = Decider.load(tmp_path / "state").policy.constraints[0]
    assert c.bound == pytest.approx(CAP + TOLERANCE) and c.declared == pytest.approx(CAP) and c.tuned
    g, = guardrails(Decider.load(tmp_path / "state").policy)
    assert g["bound"] == pytest.approx(0.0232) and g["declared"] == pytest.approx(0.02)


class _Log:
    """A stand-in decision log: ``feedback_rows_after`` over rows given here (what GuardrailMonitor reads)."""

    def __init__(self, rows):
        self.rows = rows

    def feedback_rows_after(self, rowid):
        return [r for r in self.rows if r[0] > rowid][:1000]

    def outcome_rows_after(self, rowid):  # no outcome reported apart from its reward
        return []

    def __len__(self):  # the decisions logged
        return len(self.rows)


def test_the_limit_is_the_declared_one_and_the_policy_bound_is_exported_beside_it():
    rows = [(i + 1, 10.0, 0.5, "[0.0]", 9.0, 0, 0.5, 0) for i in range(50)]
    for tuned, bound in ((True, CAP + TOLERANCE), (False, CAP)):
        monitor = GuardrailMonitor(_Log(rows), _policy(tuned))
        monitor.update()
        limit, = monitor.limits()
        assert limit["limit"] == pytest.approx(CAP)            # the business cap, tuned or not
        assert limit["policy_bound"] == pytest.approx(bound)   # what the policy enforces


def _served_coverage(rate: float, n: int, logs: int, seed: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    covered, zero, outside = 0, 0, 0
    for _ in range(logs):
        s = _Sums()
        for v in (rng.random(n) < rate).astype(float):
            s.add(float(v), None)
        _, lo, hi = s.served()
        covered += lo <= rate <= hi
        zero += hi <= lo
        outside += lo < 0 or hi > 1
    return covered / logs, zero / logs, outside / logs


@pytest.mark.parametrize("rate,n", [(0.005, 400), (0.01, 300), (0.02, 200)])
def test_the_served_interval_of_a_rare_rate_covers_and_stays_in_0_1(rate, n):
    coverage, zero, outside = _served_coverage(rate, n, 300, seed=int(rate * 1000))
    assert coverage >= 0.93 and zero == 0 and outside == 0, (coverage, zero, outside)


def test_the_baseline_interval_of_a_rare_rate_covers_and_stays_in_0_1():
    """SNIPS of always-the-baseline over rows that played it with varying propensities (ESS of tens)."""
    rng = np.random.default_rng(7)
    rate, n, logs = 0.01, 2000, 300
    covered = widths = 0.0
    for _ in range(logs):
        s = _Sums()
        p = rng.uniform(0.03, 0.08, n)                   # the baseline's logging probability
        played = rng.random(n) < p
        harm = (rng.random(n) < rate).astype(float)
        for k in range(n):
            s.add(float(harm[k]), 1 / p[k] if played[k] else None)
        _, lo, hi = s.baseline()
        assert 0 <= lo < hi <= 1
        covered += lo <= rate <= hi
        widths += hi - lo
    assert covered / logs >= 0.93 and widths / logs < 0.2


def test_clopper_pearson_at_zero_and_all_successes():
    lo, hi = clopper_pearson(0, 100)
    assert lo == 0 and hi == pytest.approx(1 - 0.025 ** (1 / 100))
    lo, hi = clopper_pearson(100, 100)
    assert hi == 1 and lo == pytest.approx(0.025 ** (1 / 100))
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


def test_metrics_over_http_export_the_declared_limit_the_policy_bound_and_rate_intervals_in_0_1(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from serving import ServeProcess, metric_samples

    from bayes_safe.online import Decider

    state = tmp_path / "state"
    Decider(_policy(), num_draws=16, seed=0, update_every=1000).save(state)
    server = ServeProcess(state, "--log", tmp_path / "log.sqlite", stderr=tmp_path / "serve.err")
    rng = np.random.default_rng(0)
    try:
        for i in range(60):
            x = rng.normal(size=(3, 2))
            r = server.client.post("/decide", json={"features": x.tolist(), "baseline": 0})
            assert r.status_code == 200, r.text
            hide = 1.0 if i == 7 else 0.0  # one hidden item in 60: a rate near the cap
            r = server.client.post("/feedback", json={"decision_id": r.json()["decision_id"], "reward": 0.0,
                                                     "constraints": [hide]})
            assert r.status_code == 200, r.text
        text = server.client.get("/metrics").text
    finally:
        server.kill()
    samples = metric_samples(text)

    def one(name, **labels):
        found = [v for (n, lab), v in samples.items() if n == name and labels.items() <= dict(lab).items()]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    assert one("bayes_safe_guardrail_limit", metric="hide") == pytest.approx(CAP)
    assert one("bayes_safe_guardrail_policy_bound", metric="hide") == pytest.approx(CAP + TOLERANCE)
    low, high = one("bayes_safe_guardrail_served_low", metric="hide"), one("bayes_safe_guardrail_served_high", metric="hide")
    assert 0 <= low < 1 / 60 < high <= 1
    blow, bhigh = (one(f"bayes_safe_guardrail_baseline_{k}", metric="hide") for k in ("low", "high"))
    assert 0 <= blow < bhigh <= 1  # a rate's interval, even where the baseline saw no event
