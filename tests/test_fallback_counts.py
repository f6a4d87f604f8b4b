"""Fallbacks are counted (issue 39, item 7): in the ``Trace``, ``violation_breakdown``, ``summary``,
``bayes-safe simulate``'s summary.json and printout, the A/B tuner's trial results, the Decider and
``/metrics`` over HTTP.

``Guarded`` (below) is a problem whose guard cannot be met in a known set of rows, whatever the
posterior: one feature ``x`` per action, every model linear in ``x`` without an intercept. The
guard caps ``risk <= 0.5``; the risk model's prior centres its weight at 1 (sd 0.1) and the truth
is ``risk = x``. Action 0 has ``x = 0`` (risk exactly 0 under every draw: allowed) except in the
*impossible* rows, where every action has ``x = 10`` (a draw ``10 w <= 0.5`` needs ``w`` 9.5 prior
sds below its mean; the data only sharpen it around 1). So exactly the impossible rows fall back,
by the cap alone (a second guard, ``risk <= 1e9``, never binds), and every fallback play breaks
the cap in truth (risk 10). In *trap* rows (possible ones), action 0's true risk is 1 although
its model says 0: an allowed play that breaks the cap. Hence, exactly: fallbacks = impossible
rows, violations in fallback plays = impossible rows, violations in allowed plays = trap rows.

Engines: the risk model is conjugate Gaussian, Normal-Inverse-Gamma, Gibbs (Laplace prior),
Langevin (a callable prior), per-arm, NUTS and SVI (slow), with single-draw and chance (``confidence``)
guards; unbatched models through the Decider (a Decider serves one stream; ``simulate`` needs
``batch_shape [R]``). The probit GP is not covered: its success probability is a link of learned
network features, not linear in ``x``, so no row is impossible whatever its posterior.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import Constraint, Problem, Units
from bayes_safe.metrics import fallback_breakdown, summary, violation_breakdown
from bayes_safe.models import PerArmLinear
from bayes_safe.trace import Trace

F64 = torch.float64
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCALE, CAP, K = 10.0, 0.5, 3


def impossible(step: int, rows: torch.Tensor) -> torch.Tensor:
    return (step + rows) % 3 == 0


def trap(step: int, rows: torch.Tensor) -> torch.Tensor:
    return ((step + rows) % 5 == 1) & ~impossible(step, rows)


def risk_prior():
    return dist.Normal(torch.ones(1, dtype=F64), torch.full((1,), 0.1, dtype=F64)).to_event(1)


def risk_prior_callable():
    """A callable prior: the Langevin engine samples it."""
    s = pyro.sample("s", dist.LogNormal(-2.3, 0.01))
    return pyro.sample("w", dist.Normal(torch.ones(1, dtype=F64), s).to_event(1))


def _risk_model(engine: str, shape):
    if engine == "conjugate":
        return BayesianLinear(risk_prior(), noise_std=1.0, batch_shape=shape)
    if engine == "normal-inverse-gamma":
        return BayesianLinear(risk_prior(), noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=shape)
    if engine == "gibbs":
        prior = dist.Laplace(torch.ones(1, dtype=F64), torch.full((1,), 0.07, dtype=F64)).to_event(1)
        return BayesianLinear(prior, noise_std=1.0, batch_shape=shape)
    if engine == "langevin":
        return BayesianLinear(risk_prior_callable, dim=1, noise_std=1.0, batch_shape=shape)
    if engine == "per-arm":
        return PerArmLinear(risk_prior(), K, noise_std=1.0, batch_shape=shape)
    if engine in ("nuts", "svi"):
        options = {"num_samples": 16, "warmup_steps": 16} if engine == "nuts" else {"num_samples": 16, "svi_steps": 30}
        return BayesianLinear(risk_prior(), noise_std=1.0, batch_shape=shape, inference=engine,
                              inference_options=options)
    raise ValueError(engine)


class Guarded(Problem):
    """Three actions, one feature; ``risk <= 0.5`` cannot be met in the impossible rows (module docstring)."""

    name = "guarded"
    metric_names = ("reward", "risk")
    noise_std = (1.0, 1.0)

    def __init__(self, replications: int = 3, confidence: float | None = None, fallback: str = "safest",
                 engine: str = "conjugate"):
        self.replications = replications
        self.fallback = fallback
        self.engine = engine
        self.constraints = (Constraint.absolute("risk", at_most=CAP, confidence=confidence),
                            Constraint.absolute("risk", at_most=1e9))

    def draw(self, n, generator, step=0):
        rows = torch.arange(n)
        x = torch.tensor([0.0, SCALE, SCALE], dtype=F64).repeat(n, 1)
        x[impossible(step, rows), 0] = SCALE
        noise = torch.randn(n, 2, generator=generator, dtype=F64)
        return Units(x[..., None], torch.ones(n, dtype=torch.long), context=(trap(step, rows), noise))

    def expected_all(self, units):
        x = units.features[..., 0]
        risk = x.clone()
        risk[units.context[0], 0] = 1.0
        return torch.stack([0.01 * x, risk], -1)

    def outcomes(self, units, actions):
        means = self.expected_all(units)[torch.arange(len(units)), actions]
        return means + units.context[1]

    def models(self, replications):
        shape = () if replications is None else (replications,)
        reward = BayesianLinear(dist.Normal(torch.zeros(1, dtype=F64), torch.ones(1, dtype=F64)).to_event(1),
                                noise_std=1.0, batch_shape=shape)
        return [reward, _risk_model(self.engine, shape)]


def _policy(problem: Guarded, replications=None):
    models = problem.models(problem.replications if replications is None else replications)
    return TSASC(models[0], models[1:], constraints=problem.constraints, metric_names=problem.metric_names,
                 fallback=problem.fallback)


def _known(T: int, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(impossible [T, R], trap [T, R])``."""
    rows = torch.arange(R)
    return (torch.stack([impossible(t, rows) for t in range(T)]), torch.stack([trap(t, rows) for t in range(T)]))


ENGINES = ["conjugate", "normal-inverse-gamma", "gibbs", "langevin", "per-arm",
           pytest.param("nuts", marks=pytest.mark.slow), pytest.param("svi", marks=pytest.mark.slow)]


def _check_trace(trace: Trace, T: int, R: int, fallback: str, shared: bool = True) -> None:
    imp, tr = _known(T, R)
    assert trace.fallback.dtype == torch.bool and torch.equal(trace.fallback, imp)
    assert trace.fallback_by.shape == (T, R, 2)
    assert torch.equal(trace.fallback_by[..., 0], imp) and not trace.fallback_by[..., 1].any()
    assert trace.fallback_labels() == [c.describe() for c in trace.constraints()]  # the problem's, declared to the policy
    assert trace.fallback_labels()[1] == "risk <= 1e+09"
    played = trace.actions
    assert bool((played[~imp] == 0).all())  # the one allowed action
    if shared or fallback == "baseline":  # one weight: equal shortfalls, the lowest index; or b_t
        assert bool((played[imp] == (0 if fallback == "safest" else 1)).all())
    cap = violation_breakdown(trace)[0]
    n_imp, n_trap = int(imp.sum()), int(tr.sum())
    assert cap["fallbacks"] == n_imp and cap["fallback_rate"] == pytest.approx(n_imp / (T * R))
    assert cap["violations"] == n_imp + n_trap
    assert cap["violations_fallback"] == n_imp and cap["violations_allowed"] == n_trap
    assert cap["fallback_violation_share"] == pytest.approx(n_imp / (n_imp + n_trap))
    assert cap["violation_rate_when_fallback"] == 1.0
    assert cap["violation_rate_when_allowed"] == pytest.approx(n_trap / (T * R - n_imp))
    loose = violation_breakdown(trace)[1]
    assert loose["fallbacks"] == 0 and loose["violations"] == 0 and loose["violations_fallback"] == 0
    late = imp[T - T // 4:]
    info = fallback_breakdown(trace)
    assert info["fallbacks"] == n_imp and info["fallback_rate"] == pytest.approx(n_imp / (T * R))
    assert info["fallback_rate_late"] == pytest.approx(float(late.double().mean()))
    assert [g["fallbacks"] for g in info["guards"]] == [n_imp, 0]
    assert info["guards"][0]["fallback_rate_late"] == pytest.approx(float(late.double().mean()))
    assert summary(trace)["fallback"] == info


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("confidence", [None, 0.95], ids=["single-draw", "chance"])
def test_the_trace_counts_every_fallback_and_the_guard_that_bound(engine, confidence):
    T, R = 12, 3
    problem = Guarded(R, confidence=confidence, engine=engine)
    trace = simulate(_policy(problem), problem, T, seed=0, progress=False)
    _check_trace(trace, T, R, "safest", shared=engine != "per-arm")


def test_the_baseline_fallback_and_a_subset_record(tmp_path):
    T, R = 20, 3
    problem = Guarded(R, fallback="baseline")
    trace = simulate(_policy(problem), problem, T, seed=1, progress=False)
    _check_trace(trace, T, R, "baseline")
    # recorded whatever record= asks (a policy that can fall back), sliced and saved with the trace
    part = simulate(_policy(problem), problem, T, seed=1, progress=False, record=("actions",))
    assert torch.equal(part.fallback, trace.fallback) and torch.equal(part.fallback_by, trace.fallback_by)
    one = trace.replication(2)
    assert torch.equal(one.fallback, trace.fallback[:, 2:3]) and one.fallback_by.shape == (T, 1, 2)
    trace.to_netcdf(tmp_path / "t.nc")
    back = Trace.from_netcdf(tmp_path / "t.nc")
    assert torch.equal(back.fallback, trace.fallback) and torch.equal(back.fallback_by, trace.fallback_by)
    assert back.fallback_labels() == trace.fallback_labels()
    assert violation_breakdown(back) == violation_breakdown(trace)
    frame = trace.to_dataframe()
    assert int(frame["fallback"].sum()) == int(trace.fallback.sum())
    assert int(frame["fallback_risk_le_0.5"].sum()) == int(trace.fallback.sum())


def test_a_policy_that_cannot_fall_back_records_none(tmp_path):
    problem = Guarded(2)
    ts = simulate(ThompsonSampling(problem.models(2)[0]), problem, 5, seed=0, progress=False)
    assert ts.fallback is None and ts.fallback_by is None and summary(ts)["fallback"] is None
    assert all(e["fallbacks"] is None and e["violations_fallback"] is None for e in violation_breakdown(ts))
    # the paper's path (relative single-draw constraints, one per model) keeps the baseline allowed
    models = problem.models(2)
    paper = TSASC(models[0], models[1:], alpha=0.1)
    assert paper.fallback_constraints is None
    trace = simulate(paper, problem, 5, seed=0, progress=False)
    assert trace.fallback is None and paper.last_fallback is None
    ts.to_netcdf(tmp_path / "ts.nc")
    assert Trace.from_netcdf(tmp_path / "ts.nc").fallback is None


# ---------------------------------------------------------------------- the command line
def test_simulate_writes_and_prints_the_fallback_share(tmp_path):
    T, R = 16, 3
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    result = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "simulate", "--problem",
                             "test_fallback_counts:Guarded", "--policy", "ts-asc", "--replications", str(R),
                             "--horizon", str(T), "--no-progress", "--out", "run"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    imp, tr = _known(T, R)
    n_imp, late = int(imp.sum()), float(imp[T - T // 4:].double().mean())
    info = json.loads((tmp_path / "run" / "summary.json").read_text())
    fb = info["fallback"]
    assert fb["fallbacks"] == n_imp and fb["fallback_rate"] == pytest.approx(n_imp / (T * R))
    assert fb["fallback_rate_late"] == pytest.approx(late)
    assert [(g["constraint"], g["fallbacks"]) for g in fb["guards"]] == [("risk <= 0.5", n_imp), ("risk <= 1e+09", 0)]
    cap = info["constraints"][0]
    assert (cap["fallbacks"], cap["violations_fallback"], cap["violations_allowed"]) == (n_imp, n_imp, int(tr.sum()))
    out = result.stdout
    assert f"fallback played in {100 * n_imp / (T * R):.1f} % of plays ({n_imp}; last quarter {100 * late:.1f} %)" in out
    assert f"  bound by risk <= 0.5: {100 * n_imp / (T * R):.1f} % of plays" in out
    assert "  bound by risk <= 1e+09: 0.0 % of plays" in out
    assert f"violations of risk <= 0.5: {100 * (n_imp + int(tr.sum())) / (T * R):.1f} % of plays " \
           f"({n_imp} of {n_imp + int(tr.sum())} fallback plays)" in out
    import pandas as pd

    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert np.allclose(steps["fallback_rate"], imp.double().mean(1).numpy())
    back = Trace.from_netcdf(tmp_path / "run" / "trace.nc")
    assert torch.equal(back.fallback, imp)


# ---------------------------------------------------------------------- the A/B tuner
def test_the_ab_tuners_trial_reports_fallback_rates():
    from bayes_safe.tuning import ABTest

    n, batches = 60, 3
    ab = ABTest(problem=Guarded(), n_users=n, batches=batches, compare=("ts",), replicates=1)
    result = ab.evaluate_once({}, seed=0)
    rows = torch.arange(n // batches)
    # batch b is drawn at step b (issue 41: the tuner passes a draw that takes a step its batch's index)
    imp = torch.cat([impossible(b, rows) for b in range(batches)])
    tr = torch.cat([trap(b, rows) for b in range(batches)])
    share = 100 * float(imp.double().mean())
    assert result["fallback_rate"][0] == pytest.approx(share)
    assert result["fallback_rate_risk"][0] == pytest.approx(share) and result["fallback_rate_risk_2"][0] == 0.0
    assert result["risk_violations_fallback"][0] == pytest.approx(share)  # every fallback breaks the cap
    assert result["risk_violations"][0] == pytest.approx(100 * float((imp | tr).double().mean()))
    assert result["risk_violations_2_fallback"][0] == 0.0
    assert not any(k.startswith("ts_fallback") for k in result)  # plain TS cannot fall back
    combined = ab.evaluate({}, seed=0)
    assert combined["fallback_rate"][0] == pytest.approx(share)


# ---------------------------------------------------------------------- the Decider and /metrics
def _contexts(count: int) -> list[np.ndarray]:
    out = []
    for i in range(count):
        x = np.array([[0.0], [SCALE], [SCALE]])
        if bool(impossible(i, torch.zeros(1, dtype=torch.long))):
            x[0] = SCALE
        out.append(x)
    return out


@pytest.mark.parametrize("engine", ["conjugate", "gibbs", "per-arm"])
@pytest.mark.parametrize("confidence", [None, 0.95], ids=["single-draw", "chance"])
def test_the_decider_counts_the_fallbacks_it_serves_with_unbatched_models(engine, confidence):
    from bayes_safe.online import Decider

    problem = Guarded(1, confidence=confidence, engine=engine)
    decider = Decider(_policy(problem, replications=None), num_draws=16, seed=0)
    assert decider.fallback_guards == [c.describe() for c in problem.constraints] and decider.fallbacks == 0
    rng = np.random.default_rng(0)
    contexts = _contexts(12)
    for x in contexts:
        d = decider.decide(x, baseline=1)
        decider.feedback(d.decision_id, reward=float(rng.normal()), constraints=[float(x[d.action, 0])])  # risk = x
    expected = sum(bool(impossible(i, torch.zeros(1, dtype=torch.long))) for i in range(12))
    assert decider.fallbacks == expected and decider.fallbacks_by == [expected, 0]


def test_metrics_export_the_fallback_counters_over_http(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from serving import ServeProcess, metric_samples

    from bayes_safe.online import Decider

    state = tmp_path / "state"
    Decider(_policy(Guarded(1), replications=None), num_draws=16, seed=0).save(state)
    server = ServeProcess(state, "--log", tmp_path / "log.sqlite", stderr=tmp_path / "serve.err")
    try:
        for x in _contexts(9):
            r = server.client.post("/decide", json={"features": x.tolist(), "baseline": 1})
            assert r.status_code == 200, r.text
        text = server.client.get("/metrics").text
    finally:
        server.kill()
    samples = metric_samples(text)
    assert samples[("bayes_safe_fallback_decisions_total", ())] == 3  # decisions 0, 3 and 6
    by = {dict(k[1])["guard"]: v for k, v in samples.items() if k[0] == "bayes_safe_fallback_decisions_by_constraint_total"}
    assert by == {"risk <= 0.5": 3, "risk <= 1e+09": 0}
    labels = [dict(k[1]) for k in samples if k[0] == "bayes_safe_fallback_decisions_by_constraint_total"]
    assert {(lab["constraint"], lab["metric"]) for lab in labels} == {("0", "risk"), ("1", "risk")}


def test_a_policy_with_tuned_bounds_is_matched_to_the_declarations_in_order():
    T, R = 9, 3
    problem = Guarded(R)
    models = problem.models(R)
    tuned = (Constraint.absolute("risk", at_most=0.4), Constraint.absolute("risk", at_most=1e8))  # a tolerance's bounds
    policy = TSASC(models[0], models[1:], constraints=tuned, metric_names=problem.metric_names)
    trace = simulate(policy, problem, T, seed=0, progress=False)
    imp, _ = _known(T, R)
    assert trace.fallback_labels() == ["risk <= 0.4", "risk <= 1e+08"]
    assert [e["fallbacks"] for e in violation_breakdown(trace)] == [int(imp.sum()), 0]


def test_the_ab_tuners_trial_reports_chance_calibration():
    """A chance guard's trial numbers: the claimed confidence, and the share of allowed (non-fallback)
    plays whose true risk met the declared cap: here every possible row is allowed and only the trap
    rows break it, so the realised share is known exactly."""
    from bayes_safe.tuning import ABTest

    n, batches = 60, 3
    ab = ABTest(problem=Guarded(confidence=0.9), n_users=n, batches=batches, compare=("ts",), replicates=1)
    result = ab.evaluate_once({}, seed=0)
    rows = torch.arange(n // batches)
    imp = torch.cat([impossible(b, rows) for b in range(batches)])  # batch b at step b
    tr = torch.cat([trap(b, rows) for b in range(batches)])
    assert result["chance_claimed_risk"][0] == pytest.approx(0.9)
    assert result["chance_realised_risk"][0] == pytest.approx(1 - float(tr[~imp].double().mean()))
    assert not any(k.startswith("ts_chance") for k in result)  # plain TS claims nothing
    single = ABTest(problem=Guarded(), n_users=n, batches=batches, compare=(), replicates=1).evaluate_once({}, seed=0)
    assert not any(k.startswith("chance_") for k in single)  # single-draw guards claim no probability
