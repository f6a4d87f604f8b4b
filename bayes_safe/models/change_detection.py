"""Adaptive forgetting (issue 30): forget only when the data say that the world changed.

``BayesianLinear(..., forgetting="adaptive")`` (or ``forgetting=AdaptiveForgetting(threshold=...,
drift=...)``) keeps every observation, as without forgetting, until a change detector run on the
model's own one-step predictive residuals raises an alarm; the batch elements that raise one
restart from the prior (the stabilised rule of Kulhavy & Zarrop 1993 at factor 0: the data are
forgotten, the prior kept) and learn the observation that raised it.

The detector is Page's two-sided cumulative-sum test (CUSUM; Page 1954, "Continuous inspection
schemes", Biometrika 41, section 2: ``S_n = max(0, S_{n-1} + x_n - k)``, an alarm when ``S_n > h``;
run on ``z`` for an upward shift and on ``-z`` for a downward one) on the standardised residual
``z = (y - x^T m) / sqrt(sigma^2 + x^T Sigma x)`` of each observation *before* it is learned
(``m``, ``Sigma``: the posterior mean and covariance then). The restart after an alarm is that of
the change-detection bandits (CUSUM-UCB, Liu, Lee & Shroff 2018, AAAI, "A change-detection based
framework for piecewise-stationary multi-armed bandit problems", Algorithm 1: the arm's
statistics are reset when its CUSUM test fires), applied here to a Bayesian posterior.

Why these residuals: when the model is right (the weights drawn from the prior and fixed, the noise
Gaussian of the stated scale), the next outcome given everything seen so far is Gaussian with the
posterior predictive mean and variance, whatever rule chose ``x`` from the past and from
randomness of its own (a Thompson draw). So the ``z`` are independent ``N(0, 1)``: the test's false
alarm rate does not depend on the policy. After a change of the weights by ``delta``, the
residuals of a well-learned arm shift by ``x^T delta`` in units of the noise, and the statistic
grows by about ``|shift| - k`` per observation.

Defaults: ``drift k = 0.5`` (tuned to a shift of one predictive standard deviation, ``k = delta /
2``) and ``threshold h = 10``. By Siegmund's approximation of the in-control run length of a
one-sided CUSUM, ``(exp(2 k b) - 2 k b - 1) / (2 k^2)`` with ``b = h + 1.166``, a false alarm of
one side comes once in about 1.4e5 observations, so once in about 7e4 for the two-sided test, and
a shift of 2 standard deviations is found in about ``h / (2 - k) = 7`` observations. With the
Normal-Inverse-Gamma model the residual is divided by the Student-t predictive's scale
``sqrt(b_n / a_n (1 + x^T V x))``: heavier-tailed than ``N(0, 1)`` while ``a_n`` is small (the
first few observations), the same afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_DTYPE = torch.float64


@dataclass(frozen=True)
class AdaptiveForgetting:
    """Forgetting that waits for evidence of a change (see the module docstring).

    Args:
        threshold: ``h > 0``, the CUSUM's alarm level in units of the predictive standard
            deviation (default 10: a false alarm once in about 7e4 observations of a right model).
        drift: ``k >= 0``, the allowance subtracted per observation (default 0.5: tuned to shifts
            of one predictive standard deviation; larger ignores smaller shifts).
    """

    threshold: float = 10.0
    drift: float = 0.5

    def __post_init__(self):
        for name, value, low in (("threshold", self.threshold, "> 0"), ("drift", self.drift, ">= 0")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
                    value <= 0 if name == "threshold" else value < 0):
                raise ValueError(f"{name}: expected a finite number {low} (AdaptiveForgetting), got {value!r}")
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "drift", float(self.drift))

    def __str__(self) -> str:
        return f"adaptive (CUSUM h={self.threshold:g}, k={self.drift:g})"


def parse_forgetting(forgetting):
    """``forgetting`` as given to ``BayesianLinear`` -> ``(factor or None, AdaptiveForgetting or None)``."""
    if isinstance(forgetting, AdaptiveForgetting):
        return None, forgetting
    if isinstance(forgetting, str) and forgetting == "adaptive":
        return None, AdaptiveForgetting()
    if forgetting is None:
        return None, None
    if isinstance(forgetting, bool) or not isinstance(forgetting, (int, float)) or not 0 < forgetting <= 1:
        raise ValueError(f"forgetting: expected a number in (0, 1] (the weight kept per observation), 'adaptive' "
                         f"(or an AdaptiveForgetting: forget when a change is detected) or None, got {forgetting!r}")
    return (None if forgetting == 1 else float(forgetting)), None


class CusumDetector:
    """Two-sided CUSUM statistics of a batch, ``[*batch]`` each (Page 1954; see the module docstring).

    Attributes:
        upper, lower: the statistics of an upward and a downward shift (float64, >= 0).
        alarms: how many changes each batch element detected (long).
    """

    def __init__(self, config: AdaptiveForgetting, batch_shape):
        self.config = config
        self.upper = torch.zeros(tuple(batch_shape), dtype=_DTYPE)
        self.lower = torch.zeros(tuple(batch_shape), dtype=_DTYPE)
        self.alarms = torch.zeros(tuple(batch_shape), dtype=torch.long)

    def step(self, z: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """Add the standardised residuals ``z [*batch]`` (only where ``active`` when given); return
        the alarms (bool ``[*batch]``), whose statistics restart at 0."""
        k, h = self.config.drift, self.config.threshold
        upper = (self.upper + z - k).clamp_min(0.0)
        lower = (self.lower - z - k).clamp_min(0.0)
        if active is not None:
            upper = torch.where(active, upper, self.upper)
            lower = torch.where(active, lower, self.lower)
        alarm = (upper > h) | (lower > h)
        zero = torch.zeros((), dtype=_DTYPE)
        self.upper = torch.where(alarm, zero, upper)
        self.lower = torch.where(alarm, zero, lower)
        self.alarms = self.alarms + alarm.long()
        return alarm
