"""A custom weight prior whose support is not the real line is rejected before any work, naming the argument."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.diagnostics import prior_predictive
from bayes_safe.models import PerArmLinear
from bayes_safe.models.linear import check_real_support
from bayes_safe.models.pyro_inference import PyroLinearPosterior

BAD = {
    "gamma": dist.Gamma(2.0, 1.0).expand([3]).to_event(1),
    "beta": dist.Beta(2.0, 2.0).expand([3]).to_event(1),
    "half-cauchy": dist.HalfCauchy(torch.ones(3)).to_event(1),
    "uniform": dist.Uniform(-1.0, 1.0).expand([3]).to_event(1),
    "dirichlet": dist.Dirichlet(torch.ones(3)),
    "bernoulli": dist.Bernoulli(0.5 * torch.ones(3)).to_event(1),
}
GOOD = {
    "normal": dist.Normal(0.0, 1.0).expand([3]).to_event(1),
    "laplace": dist.Laplace(0.0, 1.0).expand([3]).to_event(1),
    "student-t": dist.StudentT(3.0, 0.0, 1.0).expand([3]).to_event(1),
    "cauchy": dist.Cauchy(0.0, 1.0).expand([3]).to_event(1),
    "mvn": dist.MultivariateNormal(torch.zeros(3), torch.eye(3)),
    "low-rank mvn": dist.LowRankMultivariateNormal(torch.zeros(3), torch.ones(3, 1), torch.ones(3)),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_weight_priors_off_the_real_line_are_rejected_everywhere(name):
    prior = BAD[name]
    support = str(prior.support)
    for build in (
        lambda: BayesianLinear(prior, noise_std=0.5),
        lambda: BayesianLinear(prior, noise_std=0.5, inference="svi"),
        lambda: BayesianLinear(prior, noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=[4]),
        lambda: PerArmLinear(prior, num_arms=2, noise_std=0.5),
        lambda: PyroLinearPosterior(prior, 3, noise_std=0.5),
        lambda: prior_predictive(prior, torch.randn(5, 3), noise_std=0.5),
    ):
        with pytest.raises(ValueError, match=r"^prior: its support is ") as err:
            build()
        assert support in str(err.value) and "any real value" in str(err.value)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_priors_on_the_real_line_are_accepted(name):
    check_real_support(GOOD[name])
    PyroLinearPosterior(GOOD[name], 3, noise_std=0.5)


def test_callable_prior_is_checked_at_the_site_it_returns():
    def positive_weights():
        return pyro.sample("w", dist.Gamma(torch.ones(3), 1.0).to_event(1))

    def returned_site():
        scale = pyro.sample("scale", dist.HalfCauchy(1.0))  # a positive hyperparameter is fine
        return pyro.sample("v", dist.Exponential(scale * torch.ones(3)).to_event(1))

    def horseshoe():  # positive scales times an unconstrained draw: accepted
        tau = pyro.sample("tau", dist.HalfCauchy(1.0))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(3)).to_event(1))
        return tau * lam * pyro.sample("z", dist.Normal(torch.zeros(3), 1.0).to_event(1))

    with pytest.raises(ValueError, match=r"prior \(site 'w', the returned weights\): its support is"):
        BayesianLinear(positive_weights, dim=3, noise_std=0.5)
    with pytest.raises(ValueError, match=r"prior \(site 'v', the returned weights\): its support is"):
        PyroLinearPosterior(returned_site, 3, noise_std=0.5)
    assert BayesianLinear(horseshoe, dim=3, noise_std=0.5, inference="svi").dim == 3


def test_support_is_checked_before_the_batch_and_noise():
    """The prior is checked at construction, before any fit (and the noise prior's own check stays)."""
    with pytest.raises(ValueError, match="prior: its support"):
        BayesianLinear(BAD["gamma"], noise_std=0.5, batch_shape=[3], refit_every=10)
    with pytest.raises(ValueError, match="noise_prior must be supported on the positive reals"):
        PyroLinearPosterior(GOOD["laplace"], 3, noise_prior=dist.Normal(0.0, 1.0))
