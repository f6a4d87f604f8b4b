"""Linear UCB with the confidence ellipsoid of Abbasi-Yadkori, Pal & Szepesvari (2011).

Theorem 2 of that paper: with ``V_t = lambda I + sum x x^T`` and ``||theta*|| <= S``, with
probability ``1 - delta`` for all ``t``,
``||theta_hat_t - theta*||_{V_t} <= beta_t = sigma sqrt(2 log(det(V_t)^1/2 det(lambda I)^-1/2 / delta)) + lambda^1/2 S``.

A conjugate ``BayesianLinear`` with known noise ``sigma`` and prior
``N(0, (sigma^2 / lambda) I)`` has precision ``Lambda_t = V_t / sigma^2``, so the ratio of
determinants is ``det Lambda_t / det Lambda_0`` and ``||x||_{V^-1} = sqrt(var(x^T w)) / sigma``.
"""

from __future__ import annotations

import torch

from .._validation import check_probability
from ..random import Generator
from .base import Policy, check_select_inputs, check_update_inputs, masked_argmax, model_device

__all__ = ["EllipsoidConfidence", "LinUCB"]


class EllipsoidConfidence:
    """Upper and lower confidence bounds of ``x^T theta`` from a conjugate linear model.

    Args:
        model: conjugate ``BayesianLinear`` with a known ``noise_std`` and batch ``[R]``.
        delta: failure probability in (0, 1).
        weight_bound: ``S >= ||theta*||_2``: a float, or one value per replication ``[R]``.
    """

    def __init__(self, model, delta: float = 0.001, weight_bound: float = 1.0):
        if not getattr(model, "conjugate", False) or getattr(model, "noise_std", None) is None:
            raise ValueError("model: the Abbasi-Yadkori ellipsoid needs a conjugate BayesianLinear with a known noise_std")
        self.model = model
        self.delta = check_probability(delta, "delta")
        bound = torch.as_tensor(weight_bound, dtype=torch.float64, device=model_device(model))
        if not bool(torch.isfinite(bound).all() and (bound > 0).all()):
            raise ValueError(f"weight_bound: expected finite values > 0, got {weight_bound!r}")
        self.weight_bound = bound
        sigma = model.noise_std
        prior_prec = model._prior_precision
        self._logdet0 = torch.logdet(prior_prec)  # [R]
        self._sqrt_lambda = (sigma**2 * torch.linalg.eigvalsh(prior_prec)[..., 0]).sqrt()  # [R]
        self.sigma = sigma

    def beta(self) -> torch.Tensor:
        """``beta_t`` per batch element, ``[R]``."""
        logdet = 2 * self.model.factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        log_ratio = 0.5 * (logdet - self._logdet0)
        return self.sigma * (2 * (log_ratio - torch.log(torch.tensor(self.delta, dtype=torch.float64,
                                                                        device=log_ratio.device)))).sqrt() + self._sqrt_lambda * self.weight_bound

    def bounds(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lower, upper)`` bounds of ``x^T theta`` at ``features [R, K, d]`` -> ``[R, K]`` each."""
        mean, var = self.model.predict(features)
        width = self.beta()[..., None] * var.clamp_min(0).sqrt() / self.sigma
        return mean - width, mean + width


class LinUCB(Policy):
    """Optimism in the face of uncertainty: play ``argmax_a max_{theta in C_t} x_a^T theta``.

    Args:
        model: conjugate ``BayesianLinear``, known noise, batch ``[R]``.
        delta: confidence level of the ellipsoid.
        weight_bound: ``S``, a bound on ``||theta*||_2`` (float or ``[R]``).
    """

    def __init__(self, model, delta: float = 0.001, weight_bound: float = 1.0):
        self.model = model
        self.confidence = EllipsoidConfidence(model, delta, weight_bound)

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        features, baseline, valid = check_select_inputs(features, baseline, valid, models=(self.model,))
        _, upper = self.confidence.bounds(features)
        return masked_argmax(upper, valid)

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        features_chosen, reward, _ = check_update_inputs(features_chosen, reward, models=(self.model,))
        self.model.update(features_chosen, reward, actions=actions)

    def models(self):
        return {"reward": self.model}
