"""Posterior models: ``update``, ``predict``, ``sample`` / ``sample_at``."""

from .linear import BayesianLinear
from .per_arm import PerArmLinear
from .probit_gp import ProbitGP, ScaledOutcome, SuccessProbability

__all__ = ["BayesianLinear", "PerArmLinear", "ProbitGP", "SuccessProbability", "ScaledOutcome"]
