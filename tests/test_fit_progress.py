"""NUTS and SVI fits as a notebook user meets them (issue 31): a progress bar on long fits that
can be turned off, and SVI with a callable prior written for one draw as fast as one that
broadcasts (its particles mapped by ``torch.func.vmap``), with the same answer."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.progress import ENV

rng = np.random.default_rng(11)
X = rng.normal(size=(60, 3))
y = X @ np.array([1.0, 0.0, -0.5]) + 0.5 * rng.normal(size=60)


def one_draw_prior():  # written for one draw: tau * lam and .expand([3]) do not broadcast over particles
    tau = pyro.sample("tau", dist.HalfCauchy(1.0))
    lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(3)).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 0.5))
    return pyro.sample("w", dist.Normal(0.0, scale * tau * lam).expand([3]).to_event(1))


def broadcasting_prior():  # the same prior, written to broadcast over a leading dimension
    tau = pyro.sample("tau", dist.HalfCauchy(1.0))
    lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(3)).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 0.5))
    return pyro.sample("w", dist.Normal(0.0, (scale * tau)[..., None] * lam).to_event(1))


def _svi(prior, **options):
    model = BayesianLinear(prior, dim=3, noise_std=0.5, inference="svi",
                           inference_options={"svi_steps": 150, "num_samples": 50, "seed": 1, **options})
    model.update(X, y)
    return model


def test_a_callable_prior_written_for_one_draw_is_mapped_and_gives_the_broadcasting_answer():
    mapped, broadcast = _svi(one_draw_prior), _svi(broadcasting_prior)
    assert mapped.engine._broadcasts() is False and mapped.engine._maps() is True
    assert broadcast.engine._broadcasts() is True
    mapped.fit()
    broadcast.fit()
    # the same guide draws, the same particles: equal up to the order of floating-point sums
    torch.testing.assert_close(mapped.engine.svi_losses, broadcast.engine.svi_losses, rtol=1e-6, atol=1e-6)
    for site in ("w", "tau", "lam", "scale"):
        torch.testing.assert_close(mapped.engine.svi_draws[site], broadcast.engine.svi_draws[site],
                                   rtol=1e-6, atol=1e-8)


def test_a_prior_vmap_cannot_map_keeps_sequential_particles():
    def branching_prior():  # a Python branch on a drawn value: vmap cannot map it
        s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
        scale = 1.0 if bool(s > 1.0) else 0.5
        return pyro.sample("w", dist.Normal(torch.zeros(3), scale * s).to_event(1))

    model = _svi(branching_prior, svi_steps=20, svi_particles=2)
    assert model.engine._maps() is False
    model.fit()
    assert model.engine.draws.shape == (50, 3) and torch.isfinite(model.engine.draws).all()


def test_svi_and_nuts_show_a_bar_on_request_and_none_by_default_off_a_terminal(capsys):
    quiet = _svi(one_draw_prior)
    quiet.fit()
    assert capsys.readouterr().err == ""  # "auto": pytest's stderr is not a terminal
    shown = _svi(one_draw_prior, progress=True)
    shown.fit()
    err = capsys.readouterr().err
    assert "SVI fit" in err and "150/150" in err and "step" in err
    assert torch.equal(quiet.engine.draws, shown.engine.draws)  # a bar changes no draw

    laplace = dist.Laplace(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1)
    nuts = BayesianLinear(laplace, noise_std=0.5, inference="nuts", batch_shape=[2],
                          inference_options={"warmup_steps": 10, "num_samples": 10, "num_chains": 2, "progress": True,
                                             "parallel_chains": False})
    nuts.update(np.stack([X[:20], X[20:40]]), np.stack([y[:20], y[20:40]]))
    nuts.fit()
    err = capsys.readouterr().err
    assert "NUTS fit (2 problems)" in err and "80/80" in err  # 2 problems x 2 chains x 20 iterations


def test_the_environment_turns_the_fit_bars_off_and_a_bad_value_is_named(capsys, monkeypatch):
    monkeypatch.setenv(ENV, "0")
    model = _svi(one_draw_prior, progress=True, svi_steps=20)
    model.fit()
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="progress must be 'auto', True or False"):
        _svi(one_draw_prior, progress="sometimes")
