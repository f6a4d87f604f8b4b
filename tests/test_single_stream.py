"""One stream at decision speed (issue 27): the quick checks of ``select`` / ``update`` and of the
``Decider`` give the numbers and the errors of the general checks, and the benchmark runs.

The speed itself is measured by ``benchmarks/single_stream.py`` (ratios in one run), not here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling
from bayes_safe.online import Decider

ROOT = Path(__file__).resolve().parents[1]


def _model(d: int = 4, noise: float = 0.5) -> BayesianLinear:
    return BayesianLinear(dist.Normal(torch.zeros(d, dtype=torch.float64), 1.0).to_event(1), noise_std=noise,
                          batch_shape=[1])


def _policy(kind: str):
    return ThompsonSampling(_model()) if kind == "ts" else TSASC(_model(), [_model()], alpha=0.1)


def _run(kind: str, convert, steps: int = 60):
    """``steps`` decisions of a user's loop, inputs passed through ``convert``; (actions, posterior tensors)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(1, 12, 4))
    theta = rng.normal(size=(2, 4))
    policy = _policy(kind)
    g = torch.Generator().manual_seed(5)
    actions = []
    for _ in range(steps):
        a = int(policy.select(convert(X), convert(np.array([2])) if kind == "ts-asc" else None, generator=g))
        y = X[0, a] @ theta.T + rng.normal(size=2) * 0.5
        if kind == "ts":
            policy.update(convert(X[:, a]), convert(y[:1]))
        else:
            policy.update(convert(X[:, a]), convert(y[:1]), convert(y[None, 1:]))
        actions.append(a)
    state = [t.clone() for m in policy.models().values() for t in (m.precision, m.eta)]
    return actions, state


@pytest.mark.parametrize("kind", ["ts", "ts-asc"])
def test_tensor_inputs_give_the_numbers_of_converted_ones(kind):
    """float64 tensors take the quick check; numpy arrays and lists are converted by the general one:
    the same actions and the same posterior, bit for bit."""
    fast = _run(kind, lambda a: torch.as_tensor(a, dtype=torch.float64) if a.dtype.kind == "f" else torch.as_tensor(a))
    arrays = _run(kind, lambda a: a)
    lists = _run(kind, lambda a: a.tolist())
    assert fast[0] == arrays[0] == lists[0]
    for a, b, c in zip(fast[1], arrays[1], lists[1]):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_one_context_without_the_replication_axis():
    """features [K, d] and an int baseline, then update with [d] and a float: the quick path of R = 1."""
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(6, 4)))
    p1, p2 = TSASC(_model(), [_model()], alpha=0.1), TSASC(_model(), [_model()], alpha=0.1)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for t in range(20):
        a1 = p1.select(X, 0, generator=g1)
        a2 = p2.select(X[None], torch.tensor([0]), generator=g2)
        assert a1.shape == (1,) and torch.equal(a1, a2)
        p1.update(X[int(a1)], float(t % 3), torch.tensor([[0.5]], dtype=torch.float64))
        p2.update(X[int(a1)][None], torch.tensor([float(t % 3)], dtype=torch.float64),
                  torch.tensor([[0.5]], dtype=torch.float64))
    assert torch.equal(p1.reward_model.precision, p2.reward_model.precision)
    assert torch.equal(p1.constraint_models[0].eta, p2.constraint_models[0].eta)


@pytest.mark.parametrize("bad, match", [
    ("nan", "features: expected finite values, found 1 NaN or inf"),
    ("width", "features: expected width d=4"),
    ("rows", "features: expected a batch of R=1 replications"),
    ("baseline", r"baseline: expected action indices in \[0, 12\), got values \[12\]"),
    ("valid", r"valid: expected shape \[1, 12\]"),
])
def test_tensor_inputs_keep_the_general_errors(bad, match):
    X = torch.randn(1, 12, 4, dtype=torch.float64)
    baseline, valid = torch.tensor([0]), None
    if bad == "nan":
        X[0, 3, 1] = float("nan")
    elif bad == "width":
        X = torch.randn(1, 12, 5, dtype=torch.float64)
    elif bad == "rows":
        X = torch.randn(2, 12, 4, dtype=torch.float64)
    elif bad == "baseline":
        baseline = torch.tensor([12])
    else:
        valid = torch.ones(1, 11, dtype=torch.bool)
    for policy in (_policy("ts"), _policy("ts-asc")):
        with pytest.raises(ValueError, match=match):
            policy.select(X, baseline, valid=valid)


def test_update_tensor_errors_and_nothing_learned():
    policy = _policy("ts-asc")
    before = policy.reward_model.precision.clone()
    x = torch.randn(1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="reward: expected finite values"):
        policy.update(x, torch.tensor([float("inf")], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="constraints: expected finite values"):
        policy.update(x, torch.zeros(1, dtype=torch.float64), torch.full((1, 1), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match=r"constraints: expected shape \[1, 1\]"):
        policy.update(x, torch.zeros(1, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64))
    assert torch.equal(policy.reward_model.precision, before)


def test_decider_array_and_list_inputs_decide_alike():
    """Candidates as a float64 array (the quick coercion) and as lists: the same decisions,
    propensities and posterior; the caller's array is copied, and NaN is refused as before."""
    rng = np.random.default_rng(1)
    contexts = [rng.normal(size=(5, 4)) for _ in range(30)]
    a, b = (Decider(TSASC(_model(), [_model()], alpha=0.1), num_draws=50, seed=2) for _ in range(2))
    for i, x in enumerate(contexts):
        da, db = a.decide(x, baseline=0), b.decide(x.tolist(), baseline=0)
        assert da.to_dict() | {"decision_id": None} == db.to_dict() | {"decision_id": None}  # ids: each Decider's own key
        assert da.decision_id.split("-")[0] == db.decision_id.split("-")[0] == str(i)
        assert a.feedback(da.decision_id, float(i % 2), [0.3]) and b.feedback(db.decision_id, float(i % 2), (0.3,))
        assert abs(sum(da.probabilities) - 1) < 1e-12 and da.probabilities[da.action] == da.propensity
    assert torch.equal(a.policy.reward_model.precision, b.policy.reward_model.precision)
    x = contexts[0].copy()
    d = a.decide(x, baseline=0)
    x[:] = 7.0  # the caller reuses its array: the pending decision keeps what was decided on
    assert a.pending[d.decision_id.split("-")[0]]["features"] == contexts[0][d.action].tolist()
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match="features: expected finite numbers, got NaN or inf"):
        a.decide(x, baseline=0)


def test_batched_propensity_draws_match_one_draw_at_a_time():
    """The S draws (one solve against the candidates) agree with S one-column solves of the same
    normals to rounding (the Decider's draws; a DrawBatch's normals are float32 draws widened)."""
    from bayes_safe.random import DrawBatch

    model = _model()
    X = torch.randn(1, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model.update(X[:, 1], torch.tensor([0.7], dtype=torch.float64))
    g = torch.Generator().manual_seed(4)
    f = model.sample_at(X, DrawBatch(64, 1, g))
    z = torch.randn((64, 1, 4, 1), generator=torch.Generator().manual_seed(4), dtype=torch.float32).double()
    w = torch.linalg.solve_triangular(model.factor.mT, model._whitened_mean() + z, upper=True)[..., 0]
    assert f.shape == (64, 1, 5)
    torch.testing.assert_close(f, (X @ w[..., None])[..., 0], rtol=1e-12, atol=1e-12)


def test_benchmark_runs():
    """``benchmarks/single_stream.py --quick --repeats 1`` prints every row with its reference ratio."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "single_stream.py"), "--quick", "--repeats", "1"], check=False,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for row in ("numpy loop", "simulate lean path", "public TS select+update", "public TS-ASC select+update",
                "Decider decide+feedback, TS-ASC d=4 K=5 S=200, no log", "SQLite log"):
        assert row in out.stdout
    assert "load average at start" in out.stdout and "load average at end" in out.stdout
