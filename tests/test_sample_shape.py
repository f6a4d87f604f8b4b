"""``sample(sample_shape)`` as in torch and Pyro (issue 31), for every engine a user samples
directly; a generator in first place still means one draw (the form the policies use)."""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.models import BayesianLinear, PerArmLinear

F64 = torch.float64


def _normal(d=3):
    return dist.Normal(torch.zeros(d, dtype=F64), 1.0).to_event(1)


MODELS = {
    "conjugate": lambda b: BayesianLinear(_normal(), noise_std=0.5, batch_shape=b),
    "normal-inverse-gamma": lambda b: BayesianLinear(
        _normal(), noise_prior=dist.InverseGamma(torch.tensor(3.0, dtype=F64), torch.tensor(1.0, dtype=F64)),
        batch_shape=b),
    "gibbs-laplace": lambda b: BayesianLinear(dist.Laplace(torch.zeros(3, dtype=F64), 1.0).to_event(1),
                                              noise_std=0.5, batch_shape=b),
    "per-arm": lambda b: PerArmLinear(_normal(), 2, noise_std=0.5, batch_shape=b),
}


@pytest.mark.parametrize("batch", [(), (2,)], ids=["unbatched", "batched"])
@pytest.mark.parametrize("name", list(MODELS))
def test_sample_shape_leads_the_draws(name, batch):
    model = MODELS[name](batch)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(*batch, 40, 3))
    y = X @ np.array([1.0, -1.0, 0.5]) + 0.5 * rng.normal(size=(*batch, 40))
    if isinstance(model, PerArmLinear):
        for i in range(40):
            model.update(X[..., i, :], y[..., i], actions=np.full(batch, i % 2) if batch else i % 2)
    else:
        model.update(X, y)
    event = (*batch, 2, 3) if isinstance(model, PerArmLinear) else (*batch, 3)
    assert tuple(model.sample().shape) == event
    assert tuple(model.sample((7,)).shape) == (7, *event)
    assert tuple(model.sample(torch.Size([2, 3]), generator=torch.Generator().manual_seed(0)).shape) == (2, 3, *event)
    assert tuple(model.sample(torch.Generator().manual_seed(1)).shape) == event  # a generator first: one draw
    draws = model.sample((400,), generator=torch.Generator().manual_seed(2))
    assert torch.isfinite(draws).all()
    if not isinstance(model, PerArmLinear):  # the draws' mean is the posterior's
        assert torch.allclose(draws.mean(0), model.posterior_mean, atol=0.08)


def test_conjugate_draws_are_seeded_and_independent():
    model = MODELS["conjugate"](())
    model.update(torch.eye(3, dtype=F64), torch.ones(3, dtype=F64))
    a = model.sample((1000,), generator=torch.Generator().manual_seed(5))
    b = model.sample((1000,), generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    torch.testing.assert_close(torch.cov(a.T), model.posterior_covariance, atol=0.02, rtol=0.1)


def test_a_bad_sample_shape_is_named():
    with pytest.raises(ValueError, match=r"sample_shape: expected a tuple of sizes .*generator goes by keyword"):
        MODELS["conjugate"](()).sample(100)


def test_fit_on_unchanged_data_runs_nothing():
    """Issue 31: ``fit()`` right after the automatic fit used to re-run it with no new data."""
    model = BayesianLinear(_normal(), noise_std=0.5, inference="svi",
                           inference_options={"svi_steps": 60, "num_samples": 50})
    model.update(torch.eye(3, dtype=F64), torch.ones(3, dtype=F64))
    model.sample(torch.Generator().manual_seed(0))           # the automatic fit, at the first draw
    draws = model._draws
    assert model.fit() is False and model._draws is draws     # nothing new: nothing runs
    model.update(torch.ones(1, 3, dtype=F64), torch.ones(1, dtype=F64))
    assert model.fit() is True and model._draws is not draws  # a new observation: a refit
    assert model.fit(force=True) is True
