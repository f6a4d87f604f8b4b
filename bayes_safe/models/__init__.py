"""Posterior models: ``update``, ``predict``, ``sample`` / ``sample_at``."""

from .linear import BayesianLinear
from .per_arm import PerArmLinear

__all__ = ["BayesianLinear", "PerArmLinear"]
