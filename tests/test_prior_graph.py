"""Recorded prior graphs (bayes_safe.models.prior_graph) and the Langevin engine's use of them.

The recording must replay the user's function exactly where it can, refuse where it cannot
(random numbers, branches on values, in-place updates), and leave the Langevin chain where the
eager engine would take it: same draws to rounding, same errors (batch equivalence: in
tests/test_langevin.py).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.models.prior_graph import compile_prior

F64 = torch.float64


def _value_and_grad(f):
    return lambda t: torch.func.grad_and_value(f)(t)


def _checks(P, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(P, generator=g, dtype=F64),) for _ in range(k)]


def test_a_user_function_is_replayed_exactly_with_its_gradient():
    def log_density(t):  # a Student-t like density written by hand, with a shared scale
        scale = torch.nn.functional.softplus(t[0]) + 0.1
        z = t[1:] / scale
        return -(2.5 * torch.log1p(z * z / 4.0)).sum() - (t.shape[0] - 1) * torch.log(scale) - 0.5 * t[0] ** 2

    fn = _value_and_grad(log_density)
    x = torch.tensor([0.3, 1.0, -2.0, 0.5], dtype=F64)
    graph = compile_prior(fn, (x,), _checks(4))
    assert graph is not None
    for (t,) in _checks(4, k=5, seed=7):
        for got, want in zip(graph(t), fn(t)):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("case", ["random", "branch", "in_place", "numpy"])
def test_what_a_recording_cannot_replay_is_refused(case):
    def f(t):
        if case == "random":
            return (t * torch.randn(t.shape, dtype=F64)).sum()  # its own random numbers
        if case == "branch":
            return t.sum() if t[0] > 0 else -t.sum()  # a Python branch on a value
        if case == "in_place":
            u = t.clone()
            u.mul_(2.0)
            return u.sum()
        return torch.as_tensor(np.exp(t.detach().numpy())).sum()  # leaves torch

    assert compile_prior(f, (torch.ones(3, dtype=F64),), _checks(3)) is None


def test_a_recording_that_disagrees_with_the_function_is_refused():
    calls = {"n": 0}

    def drifting(t):  # Python state: the recording froze the first call's constant
        calls["n"] += 1
        return t.sum() * calls["n"]

    assert compile_prior(drifting, (torch.ones(2, dtype=F64),), _checks(2)) is None


def _hierarchical(d):
    def prior():
        s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
        return pyro.sample("w", dist.Normal(0.0, s).expand([d]).to_event(1))

    return prior


def _non_centred(d):
    def prior():  # w is not a site: w = s * z, so the engine needs dw/dtheta
        s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
        z = pyro.sample("z", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        return s * z

    return prior


def _data(n, d, seed, binary=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    f = X @ np.linspace(-1.0, 1.0, d)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-f))).astype(float) if binary else f + 0.5 * rng.normal(size=n)
    return X, y


@pytest.mark.parametrize("prior, options", [
    (_hierarchical, {"noise_std": 0.5}),
    (_non_centred, {"noise_std": 0.5}),
    (_hierarchical, {"noise_prior": dist.InverseGamma(2.0, 1.0)}),
    (_hierarchical, {"likelihood": "probit"}),
    (_non_centred, {"likelihood": "logistic"}),
])
def test_recorded_chains_follow_the_eager_chains(prior, options):
    d = 3
    X, y = _data(80, d, seed=1, binary="likelihood" in options)
    models = [BayesianLinear(prior(d), dim=d, inference_options={"compile": c}, **options) for c in (True, False)]
    draws = []
    for model in models:
        g = torch.Generator().manual_seed(3)
        out = []
        for i in range(80):  # decide, observe, learn: one row at a time, as inside simulate
            out.append(model.sample(g).clone())
            model.update(X[i:i + 1], y[i:i + 1])
        draws.append(torch.stack(out))
    assert models[0].engine.compiled and not models[1].engine.compiled
    torch.testing.assert_close(draws[0], draws[1], atol=1e-8, rtol=0)
    torch.testing.assert_close(models[0].engine.accept_rate, models[1].engine.accept_rate, atol=1e-8, rtol=0)


def test_a_prior_with_a_branch_on_its_values_stays_eager_and_works():
    def switching():
        s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        return w * 2.0 if s > 1.0 else w  # a branch the recording would freeze

    model = BayesianLinear(switching, dim=2, noise_std=0.5)
    X, y = _data(30, 2, seed=2)
    model.update(X, y)
    w = model.sample(torch.Generator().manual_seed(0))
    assert torch.isfinite(w).all() and not model.engine.compiled


def test_nan_at_the_chain_state_is_reported_by_the_recorded_step_too():
    def broken():  # NaN mean for s > 3: a bug in a user's prior that typical prior draws never hit
        s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
        loc = torch.where(s > 3.0, torch.tensor(float("nan"), dtype=F64), torch.tensor(0.0, dtype=F64))
        return pyro.sample("w", dist.Normal(loc, 1.0).expand([2]).to_event(1))

    for compile_ in (True, False):
        model = BayesianLinear(broken, dim=2, noise_std=1.0, inference_options={"compile": compile_})
        X, y = _data(5, 2, seed=3)
        model.update(X, y)
        g = torch.Generator().manual_seed(0)
        model.sample(g)
        assert model.engine.compiled == compile_
        model.update(X[:1], y[:1])  # new data (not doubling them): the next step re-evaluates the state
        model.engine.theta[..., 0] = np.log(10.0)  # move the chain to s = 10 (unconstrained log s) ...
        model.engine._cache = model.engine._stale_cache = None  # ... and forget its state's evaluation
        theta, step = model.engine.theta.clone(), model.engine.log_step.clone()
        with pytest.raises(FloatingPointError, match=r"prior 'broken': Langevin step 0 produced NaN .* current state"):
            model.sample(g)
        assert torch.equal(model.engine.theta, theta) and torch.equal(model.engine.log_step, step)


def shared_scale_prior():  # top level: pickles by reference
    s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    return pyro.sample("w", dist.Normal(0.0, s).expand([2]).to_event(1))


def test_copies_share_the_recording_and_pickles_record_again():
    model = BayesianLinear(shared_scale_prior, dim=2, noise_std=0.5)
    X, y = _data(20, 2, seed=5)
    model.update(X, y)
    model.sample(torch.Generator().manual_seed(0))
    engine = model.engine
    assert engine.compiled
    assert copy.deepcopy(engine)._step_graph is engine._step_graph
    clone = pickle.loads(pickle.dumps(engine))
    assert not clone.compiled  # records again at its next step
    a = engine.draw(torch.Generator().manual_seed(1)).clone()
    b = clone.draw(torch.Generator().manual_seed(1))
    assert clone.compiled
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_inference_mode_is_refused_with_a_clear_error_and_no_grad_works():
    model = BayesianLinear(shared_scale_prior, dim=2, noise_std=0.5)
    X, y = _data(20, 2, seed=6)
    model.update(X, y)
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"Langevin engine .* outside inference mode"):
        model.sample(torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model.sample(torch.Generator().manual_seed(0))).all()


def test_compile_option_is_checked():
    with pytest.raises(ValueError, match=r"inference_options: 'compile' must be True or False, got 1"):
        BayesianLinear(_hierarchical(2), dim=2, noise_std=1.0, inference_options={"compile": 1})
