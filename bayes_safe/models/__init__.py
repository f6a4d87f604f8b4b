"""Posterior models: ``update``, ``predict``, ``sample`` / ``sample_at``.

``ProbitGP`` and its wrappers load GPyTorch, so they are imported on first use.
"""

from .baseline_residual import BaselineResidual, baseline_residual, residual_features
from .calibrated import CalibratedPerArm, calibrated_per_arm
from .change_detection import AdaptiveForgetting
from .empirical_bayes import PriorFit, fit_prior, power_prior, redraw_prior
from .linear import BayesianLinear
from .per_arm import PerArmLinear

__all__ = ["AdaptiveForgetting", "BaselineResidual", "BayesianLinear", "CalibratedPerArm", "PerArmLinear", "PriorFit",
           "ProbitGP", "ScaledOutcome", "SuccessProbability", "baseline_residual", "calibrated_per_arm", "fit_prior",
           "power_prior", "redraw_prior", "residual_features"]

_LAZY = {"ProbitGP", "SuccessProbability", "ScaledOutcome"}


def __getattr__(name):
    if name in _LAZY:
        from . import probit_gp

        return getattr(probit_gp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
