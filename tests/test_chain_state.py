"""Saving and loading models sampled by the Gibbs and Langevin engines.

A saved chain resumes exactly: after a load, the next Thompson draws equal the draws the
original model makes from the same generator state (the chain's state, its data and its
adaptation all travel in the file, and nothing executes on load).
"""

from __future__ import annotations

import json

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.random import ReplicationRNG
from bayes_safe.state import StateError, load_state, save_state

F64 = torch.float64


def horseshoe():  # top level of an importable module: saved as its import path
    tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(1.0, dtype=F64)))
    lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(3, dtype=F64)).to_event(1))
    return pyro.sample("w", dist.Normal(torch.zeros(3, dtype=F64), tau * lam).to_event(1))


def shared_scale():
    s = pyro.sample("s", dist.LogNormal(torch.tensor(0.0, dtype=F64), 0.5))
    return pyro.sample("w", dist.Normal(torch.zeros(3, dtype=F64), s).expand([3]).to_event(1))


def _feed(model, rng, n=25, binary=False, seed=0):
    data = np.random.default_rng(seed)
    R = model.batch_shape[0]
    for _ in range(n):
        x = data.normal(size=(R, model.dim))
        y = (data.uniform(size=R) < 0.5).astype(float) if binary else x @ np.array([1.0, -0.5, 0.0]) + data.normal(size=R)
        model.sample(rng, key="w")
        model.update(x, y)


MODELS = {
    "gibbs-laplace-noise-prior": lambda: BayesianLinear(dist.Laplace(0.0, 1.0).expand([3]).to_event(1),
                                                        noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=[2]),
    "gibbs-horseshoe-probit": lambda: BayesianLinear(horseshoe, dim=3, likelihood="probit", batch_shape=[2]),
    "gibbs-student-logistic": lambda: BayesianLinear(dist.StudentT(3.0, 0.0, 1.0).expand([3]).to_event(1),
                                                     likelihood="logistic", batch_shape=[2]),
    "langevin-shared-scale": lambda: BayesianLinear(shared_scale, dim=3, noise_std=0.5, batch_shape=[2]),
    "langevin-laplace-probit-R1": lambda: BayesianLinear(dist.Laplace(0.0, 1.0).expand([3]).to_event(1),
                                                         likelihood="probit", inference="langevin", batch_shape=[1]),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_saved_chain_resumes_exactly(name, tmp_path):
    model = MODELS[name]()
    binary = model.likelihood != "gaussian"
    rng = ReplicationRNG.from_seed(3, model.batch_shape[0])
    _feed(model, rng, binary=binary)
    save_state(model, tmp_path / "model")
    loaded = load_state(tmp_path / "model", allow_imports=True)
    assert loaded.engine_name == model.engine_name and repr(loaded) == repr(model)
    a, b = ReplicationRNG.from_seed(9, model.batch_shape[0]), ReplicationRNG.from_seed(9, model.batch_shape[0])
    x = torch.tensor([[0.3, -1.0, 0.5]], dtype=F64).expand(model.batch_shape[0], 1, 3)
    for i in range(5):
        torch.testing.assert_close(loaded.sample(b, key="w"), model.sample(a, key="w"), rtol=0, atol=0)
        y = torch.ones(model.batch_shape[0], 1, dtype=F64) * (i % 2)
        model.update(x, y)
        loaded.update(x, y)


def test_a_tampered_chain_is_refused_by_name(tmp_path):
    model = MODELS["langevin-shared-scale"]()
    _feed(model, ReplicationRNG.from_seed(1, 2))
    path = save_state(model, tmp_path / "model")
    header = json.loads(path.read_text())
    header["object"]["chain"]["counters"].pop("adapt_count")
    path.write_text(json.dumps(header))
    with pytest.raises(StateError, match=r"chain.counters: expected exactly"):
        load_state(tmp_path / "model", allow_imports=True)
