"""Write ./state/decider: the Decider the replicas of compose.yaml load (edit the policy to yours).

TS-ASC over 4 named features: a reward model and one guardrail metric whose mean may not fall
more than 10 % below the baseline's (conjugate Gaussian models: replicas hold the same posterior
to the last digit; docs/replicas.md).
"""

import pyro.distributions as dist
import torch

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.online import Decider

prior = dist.Normal(torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)).to_event(1)
policy = TSASC(BayesianLinear(prior, noise_std=0.5), [BayesianLinear(prior, noise_std=0.5)], alpha=0.1)
print(Decider(policy, feature_names=["tenure", "opens", "hour", "segment"], seed=0).save("state/decider"))
