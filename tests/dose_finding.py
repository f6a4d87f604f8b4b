"""A dose-finding problem written for the guardrail tests (not one of the library's problems).

Each patient arrives with three covariates ``z`` (``z1`` is body weight, standardised); the
clinician's standard dose is weight-based (level ``3 + round(z1 / 2)``, clipped to the 7 levels).
Per candidate dose ``u = level / 3`` the features are ``x = [1, u, u^2, z1 u, z1, z2]``:

* efficacy (the reward): ``x . beta_eff + N(0, 0.5^2)`` (noise unknown to the models: a
  Normal-Inverse-Gamma efficacy model);
* adverse event (AE): 0/1 with ``P(AE) = sigmoid(x . beta_ae)`` (a well-specified logistic model).

Guardrails: the AE rate at most 5 % (absolute, so the standard dose of a heavy patient breaks
it), and efficacy at least 0.8 x the standard dose's (a guardrail on the reward itself).
"""

from __future__ import annotations

import pyro.distributions as dist
import torch

from bayes_safe import BayesianLinear
from bayes_safe.envs import Constraint, Problem, Units

LEVELS = 7
BETA_EFFICACY = torch.tensor([2.0, 1.0, -0.2, 0.2, 0.0, 0.1], dtype=torch.float64)
BETA_AE = torch.tensor([-5.0, 1.2, 0.0, 0.0, 0.6, 0.0], dtype=torch.float64)
NOISE_SD = 0.5
AE_CAP = 0.05


def dose_features(z: torch.Tensor) -> torch.Tensor:
    """``[n, 3]`` covariates -> ``[n, 7, 6]`` candidate features."""
    u = torch.arange(LEVELS, dtype=torch.float64) / 3.0  # [K]
    n = z.shape[0]
    u = u.expand(n, LEVELS)
    z1, z2 = z[:, :1].expand(n, LEVELS), z[:, 1:2].expand(n, LEVELS)
    return torch.stack([torch.ones_like(u), u, u * u, z1 * u, z1, z2], -1)


class DoseFinding(Problem):
    """Seven dose levels, an NIG efficacy reward guarded relative to the standard dose, a logistic AE capped at 5 %."""

    name = "dose-finding"
    metric_names = ("efficacy", "adverse_event")
    noise_std = (NOISE_SD, 0.5)

    def __init__(self, replications: int = 1, cap: float = AE_CAP, confidence: float | None = None,
                 fallback: str = "safest"):
        self.replications = replications
        self.cap = cap
        self.confidence = confidence
        self.fallback = fallback
        self.constraints = (Constraint.relative("efficacy", at_least=0.8),
                            Constraint.absolute("adverse_event", at_most=cap, confidence=confidence))

    def draw(self, n, generator):
        z = torch.randn(n, 3, generator=generator, dtype=torch.float64)
        noise = torch.randn(n, generator=generator, dtype=torch.float64) * NOISE_SD
        u_ae = torch.rand(n, generator=generator, dtype=torch.float64)
        baseline = (3 + torch.round(0.5 * z[:, 0])).clamp(0, LEVELS - 1).long()
        return Units(dose_features(z), baseline, context=(noise, u_ae))

    def expected_all(self, units):
        x = units.features
        efficacy = x @ BETA_EFFICACY
        risk = torch.sigmoid(x @ BETA_AE)
        return torch.stack([efficacy, risk], -1)

    def outcomes(self, units, actions):
        noise, u_ae = units.context
        means = self.expected_all(units)[torch.arange(len(units)), actions]
        return torch.stack([means[:, 0] + noise, (u_ae < means[:, 1]).double()], -1)

    def models(self, replications):
        shape = () if replications is None else (replications,)
        eff_prior = dist.Normal(torch.zeros(6, dtype=torch.float64), torch.full((6,), 2.0, dtype=torch.float64)).to_event(1)
        efficacy = BayesianLinear(eff_prior, noise_prior=dist.InverseGamma(2.0, 0.5), batch_shape=shape)
        ae_loc = torch.tensor([-3.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        ae_prior = dist.Normal(ae_loc, torch.full((6,), 1.5, dtype=torch.float64)).to_event(1)
        ae = BayesianLinear(ae_prior, likelihood="logistic", batch_shape=shape, inference_options={"seed": 0})
        return [efficacy, ae]
