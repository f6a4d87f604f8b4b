"""Build policies by name for a linear problem (used by the command line and the studies)."""

from __future__ import annotations

import pyro.distributions as dist

from .models import BayesianLinear
from .policies import TSASC, Greedy, LinUCB, Random, ThompsonSampling

__all__ = ["POLICIES", "ridge_model", "make_policy"]

POLICIES = ("ts", "ts-asc", "linucb", "greedy", "random")


def ridge_model(env, metric: int = 0, ridge: float = 1.0) -> BayesianLinear:
    """Bayesian ridge regression for one metric of ``env``: prior ``N(0, sigma^2 / ridge I)``, known ``sigma``.

    This is the "Bayesian interpretation" of ridge regression with penalty ``ridge``
    (Daulton et al. 2019 s.4.1 use ``ridge = 1``): its posterior mean is the ridge estimate.
    """
    sigma = float(env.noise_std[metric])
    prior = dist.Normal(0.0, sigma / ridge**0.5).expand([env.dim]).to_event(1)
    return BayesianLinear(prior, noise_std=sigma, batch_shape=[env.replications])


def make_policy(name: str, env, *, ridge: float = 1.0, alpha: float | None = None, delta: float = 0.001,
                weight_bound: float | None = None):
    """A policy registered as ``name`` (see ``POLICIES``), with ridge models for ``env``'s metrics."""
    if name not in POLICIES:
        raise ValueError(f"policy: unknown name {name!r}; expected one of {list(POLICIES)}")
    if ridge <= 0:
        raise ValueError(f"ridge: expected > 0, got {ridge}")
    if name == "random":
        return Random()
    reward = ridge_model(env, 0, ridge)
    if name == "ts":
        return ThompsonSampling(reward)
    if name == "greedy":
        return Greedy(reward)
    if name == "linucb":
        # default S: each replication's true ||theta*|| (an oracle bound, as in the papers' experiments)
        bound = weight_bound if weight_bound is not None else env.parameters[:, 0].norm(dim=-1)
        return LinUCB(reward, delta=delta, weight_bound=bound)
    if env.num_metrics < 2:
        raise ValueError(f"policy: {name!r} needs a problem with a constraint metric; {env.name!r} has none")
    alpha = env.alpha if alpha is None else alpha
    if alpha is None:
        raise ValueError("alpha: required for ts-asc on a problem without its own alpha")
    constraints = [ridge_model(env, m, ridge) for m in range(1, env.num_metrics)]
    return TSASC(reward, constraints, alpha=alpha)
