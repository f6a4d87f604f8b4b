"""Every public object says what it is (issue 31, notebook manners): the class, its engine, shapes,
observations and settings; never a tensor dump, never ``<object at 0x...>``."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling, daulton2019, simulate
from bayes_safe.envs import Constraint
from bayes_safe.models import PerArmLinear
from bayes_safe.policies import CLUCB, Greedy
from bayes_safe.random import DrawBatch, ReplicationRNG

F64 = torch.float64


def _model(**kw):
    return BayesianLinear(dist.Normal(torch.zeros(4, dtype=F64), 1.0).to_event(1), noise_std=0.5, **kw)


def _objects():
    env = daulton2019(replications=2, seed=0)
    ts = ThompsonSampling(_model(batch_shape=[2]))
    trace = simulate(ts, env, horizon=3, seed=0)
    return {
        "BayesianLinear": (_model(forgetting=0.99), ["dim=4", "noise_std=0.5", "conjugate", "forgetting=0.99"]),
        "ThompsonSampling": (ts, ["reward=BayesianLinear(", "batch_shape=[2]"]),
        "TSASC alpha": (TSASC(_model(), [_model()], alpha=0.1), ["constraint0=BayesianLinear(", "alpha=0.1"]),
        "TSASC declared": (TSASC(_model(), [_model()], constraints=[Constraint.relative("unsubscribe", at_most=1.02)],
                                 metric_names=["click", "unsubscribe"]), ["unsubscribe", "metric_names=['click'"]),
        "CLUCB": (CLUCB(_model(batch_shape=[1]), torch.zeros(1, dtype=F64), alpha=0.1), ["CLUCB(", "alpha=0.1"]),
        "Greedy": (Greedy(_model()), ["Greedy(reward=BayesianLinear("]),
        "PerArmLinear": (PerArmLinear(dist.Normal(torch.zeros(3, dtype=F64), 1.0).to_event(1), 5, noise_std=1.0),
                         ["num_arms=5", "dim=3", "observations per arm=[0, 0, 0, 0, 0]"]),
        "ReplicationRNG": (ReplicationRNG(list(range(10))), ["replications=10", "'...'"]),
        "DrawBatch": (DrawBatch(200, played=True), ["num_draws=200", "played=True"]),
        "LinearBandit": (env, ["daulton2019", "num_arms=100", "dim=4", "alpha=0.01"]),
        "Trace": (trace, ["horizon=3", "replications=2", "policy='ThompsonSampling'", "problem='daulton2019'"]),
    }


@pytest.mark.parametrize("name", list(_objects()))
def test_a_repr_says_what_the_object_is_without_dumping_tensors(name):
    obj, needles = _objects()[name]
    text = repr(obj)
    assert " object at 0x" not in text and "tensor(" not in text and len(text) < 700, text
    assert text.startswith(type(obj).__name__ + "("), text
    for needle in needles:
        assert needle in text, (needle, text)


def test_models_take_dataframes_and_series_as_the_decider_does():
    """Features and outcomes as pandas objects (issue 31, conventions): the same posterior as numpy."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(6, 4)), columns=["age", "price", "hour", "visits"])
    outcome = pd.Series(rng.normal(size=6), name="revenue")
    a, b = _model(), _model()
    a.update(frame, outcome)
    b.update(frame.to_numpy(), outcome.to_numpy())
    assert torch.equal(a.precision, b.precision) and torch.equal(a.eta, b.eta)
    torch.testing.assert_close(a.predict(frame)[0], b.predict(frame.to_numpy())[0])
    with pytest.raises(TypeError, match="X: expected numbers, got a DataFrame with non-numeric entries"):
        a.update(frame.assign(hour="noon"), outcome)


def test_a_study_says_what_it_searches():
    """A Study shown in a notebook names its problem, search space and objective (and how far it got)."""
    from bayes_safe.tuning import ABTest, Range, Study, VideoUploadProblem

    ab = ABTest(VideoUploadProblem(warmup=500), n_users=500, batches=1, compare=())
    study = Study(ab, parameters=[Range("alpha", 0.0, 0.06)], objective="q_1080p_change",
                  outcome_constraints=["reliability_change >= -1"], sobol_trials=2, seed=0)
    text = repr(study)
    assert " object at 0x" not in text and text.startswith("Study("), text
    for needle in ("video-upload", "alpha", "q_1080p_change", "reliability_change >= -1"):
        assert needle in text, (needle, text)
