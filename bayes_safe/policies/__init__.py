"""Decision policies, all batched over replications (see :mod:`bayes_safe.policies.base`)."""

from .base import Policy
from .bcts import BCTS, ConstraintMask, CTSPosterior
from .clucb import CLUCB, CLUCB2ASC, LUCB
from .greedy import Greedy, Random
from .thompson import ThompsonSampling
from .ts_asc import TSASC
from .ucb import EllipsoidConfidence, LinUCB

__all__ = ["Policy", "ThompsonSampling", "TSASC", "LinUCB", "EllipsoidConfidence", "Greedy", "Random", "LUCB", "CLUCB", "CLUCB2ASC", "BCTS", "ConstraintMask", "CTSPosterior"]
