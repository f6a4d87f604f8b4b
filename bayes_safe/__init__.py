"""bayes_safe: safe decision-making with Bayesian posteriors.

Quick start::

    import pyro.distributions as dist
    from bayes_safe import BayesianLinear, TSASC, daulton2019, simulate

    env = daulton2019(replications=100, seed=0, alpha=0.01)
    prior = lambda: dist.Normal(0.0, 0.1).expand([env.dim]).to_event(1)
    policy = TSASC(BayesianLinear(prior(), noise_std=0.1, batch_shape=[100]),
                   [BayesianLinear(prior(), noise_std=0.1, batch_shape=[100])], alpha=0.01)
    trace = simulate(policy, env, horizon=500, seed=1)
"""

from .envs import daulton2019, kazerouni2017, kazerouni2017_neurips, make_problem
from .models import BayesianLinear, PerArmLinear
from .policies import TSASC, Greedy, LinUCB, Random, ThompsonSampling
from .random import ReplicationRNG, replication_seeds
from .simulate import simulate
from .trace import Trace

__version__ = "0.1.0"

__all__ = [
    "TSASC",
    "BayesianLinear",
    "Greedy",
    "LinUCB",
    "PerArmLinear",
    "Random",
    "ReplicationRNG",
    "ThompsonSampling",
    "Trace",
    "daulton2019",
    "kazerouni2017",
    "kazerouni2017_neurips",
    "make_problem",
    "replication_seeds",
    "simulate",
]
