"""Decision policies, all batched over replications (see ``bayes_safe.policies.base``)."""

from .base import Policy
from .bcts import BCTS, ConstraintMask, CTSPosterior
from .clucb import CLUCB, CLUCB2ASC, LUCB
from .conservative import ConservativeTS
from .greedy import Greedy, Random
from .streaming import StreamingConservativeTS, StreamingPerArmTS
from .thompson import ThompsonSampling
from .ts_asc import TSASC
from .ucb import EllipsoidConfidence, LinUCB

__all__ = ["BCTS", "CLUCB", "CLUCB2ASC", "LUCB", "TSASC", "CTSPosterior", "ConservativeTS", "ConstraintMask", "EllipsoidConfidence", "Greedy", "LinUCB", "Policy", "Random", "StreamingConservativeTS", "StreamingPerArmTS", "ThompsonSampling"]
