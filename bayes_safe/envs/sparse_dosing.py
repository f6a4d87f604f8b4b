"""A sparse dose-finding problem with many covariates: the chance constraint's calibration test bed.

Each patient arrives with ``p`` standardised covariates ``z`` (``z[0]`` is body weight); the
clinician's standard dose is weight-based (level ``3 + round(z[0] / 2)``, clipped to the 7
levels). Per candidate dose ``u = level / 3`` the features are

    ``x = [1, u, u^2, z[0] u, z[0], ..., z[p-1]]``   (``d = 4 + p``),

and the truth is *sparse*: only a handful of the ``d`` weights are non-zero.

* efficacy (the reward): ``x . beta_eff + N(0, 0.5^2)``, ``beta_eff = [2, 1, -0.2, 0.2, 0, 0.1,
  0, ...]``;
* adverse event (AE): 0/1 with ``P(AE) = sigmoid(x . beta_ae)``, ``beta_ae = [-5, 1.2, 0, 0,
  0.6, 0, 0.3, -0.3, 0, ...]`` (dose, weight and two more covariates).

The guardrail: the AE risk at most 5 % per patient (absolute, so the standard dose of a heavy
patient breaks it itself), with ``confidence`` the chance constraint's level.
``SparseDosing(covariates=11)`` is the ``d = 15`` version, ``covariates=76`` (default) the
``d = 80`` one on which the posterior over the AE weights is over-confident after a few hundred
patients (docs/tutorials/dose-finding.md, "Is 95 % safe really 95 %?").

``models(R, engine=..., ae_prior=...)`` gives the posteriors a user would fit: ``engine="gibbs"``
(default) a horseshoe efficacy model with known noise and a logistic AE model (intercept prior
centred at ``-3``), both sampled by the Gibbs engine, the AE model's prior being
``ae_prior="scaled"`` (default: ``N(0, 1)`` on the intercept and the three dose terms,
``N(0, ae_scale^2)`` with ``ae_scale = 0.25`` on the covariate weights), ``"wide"`` (``N(0, 1)`` on
every weight: over-confident where the policy plays at ``d = 80``, see
``bayes_safe.policies.ts_asc``, "Calibrated chance constraints") or ``"laplace"`` (``Laplace(0,
1)`` on every weight, as over-confident); ``engine="conjugate"``: a Gaussian efficacy model and a
Gaussian-likelihood (linear-probability) AE model, both in closed form (it falls back in most
rows: benchmarks/chance_calibration.py).

Everything is seeded by the ``generator`` of ``draw`` (the patients, their noise and their AE
uniforms): the truth is fixed, ``expected_all`` gives it.
"""

from __future__ import annotations

import torch

from ..random import standard_normal, standard_uniform
from .problem import Constraint, Problem, Units

__all__ = ["SparseDosing"]

LEVELS = 7
_F64 = torch.float64


def _weights(values: dict[int, float], d: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros(d, dtype=_F64, device=device)
    for j, v in values.items():
        out[j] = v
    return out


class SparseDosing(Problem):
    """Seven dose levels, ``4 + covariates`` features, a sparse truth; efficacy the reward, the AE
    risk capped at ``cap`` (with ``confidence``: a chance constraint).

    Args:
        replications: ``R``.
        covariates: ``p >= 4`` patient covariates (``d = 4 + p``; default 76, ``d = 80``).
        cap: the AE cap (default 0.05).
        confidence: None (the AE cap judged on one posterior draw) or the chance constraint's level.
        efficacy_guard: None (default) or ``c``: also guard efficacy at least ``c`` times the
            standard dose's (a single-draw relative constraint on the reward).
        device: where the problem's tensors live (default the CPU; float64). ``draw``'s generator
            draws on its own device and the draws are put on this one; ``models(engine="gibbs")``
            is the CPU's (the Gibbs engine runs on the CPU), ``engine="conjugate"`` follows it.
    """

    name = "sparse-dosing"
    metric_names = ("efficacy", "adverse_event")
    noise_std = (0.5, 0.5)

    def __init__(self, replications: int = 1, covariates: int = 76, cap: float = 0.05,
                 confidence: float | None = None, efficacy_guard: float | None = None,
                 device: torch.device | str | None = None):
        if int(covariates) < 4:
            raise ValueError(f"covariates: expected at least 4 (the truth uses 4 of them), got {covariates!r}")
        self.replications = int(replications)
        self.covariates = int(covariates)
        self.dim = 4 + self.covariates
        self.cap = float(cap)
        self.confidence = confidence
        ae = Constraint.absolute("adverse_event", at_most=self.cap, confidence=confidence)
        self.constraints = ((Constraint.relative("efficacy", at_least=efficacy_guard), ae)
                            if efficacy_guard is not None else (ae,))
        d = self.dim
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.beta_efficacy = _weights({0: 2.0, 1: 1.0, 2: -0.2, 3: 0.2, 5: 0.1}, d, self.device)
        self.beta_ae = _weights({0: -5.0, 1: 1.2, 4: 0.6, 6: 0.3, 7: -0.3}, d, self.device)

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """``[n, p]`` covariates -> ``[n, 7, 4 + p]`` candidate features."""
        n = z.shape[0]
        u = (torch.arange(LEVELS, dtype=_F64, device=z.device) / 3.0).expand(n, LEVELS)
        w = z[:, :1].expand(n, LEVELS)
        rest = z[:, None, :].expand(n, LEVELS, z.shape[1])
        return torch.cat([torch.stack([torch.ones_like(u), u, u * u, w * u], -1), rest], -1)

    def draw(self, n, generator):
        device = self.device
        z = standard_normal((n, self.covariates), generator, dtype=_F64, device=device)
        noise = standard_normal((n,), generator, dtype=_F64, device=device) * 0.5
        u_ae = standard_uniform((n,), generator, dtype=_F64, device=device)
        baseline = (3 + torch.round(0.5 * z[:, 0])).clamp(0, LEVELS - 1).long()
        return Units(self.features(z), baseline, context=(noise, u_ae))

    def expected_all(self, units):
        x = units.features
        return torch.stack([x @ self.beta_efficacy, torch.sigmoid(x @ self.beta_ae)], -1)

    def outcomes(self, units, actions):
        noise, u_ae = units.context
        means = self.expected_all(units)[torch.arange(len(units), device=actions.device), actions]
        return torch.stack([means[:, 0] + noise, (u_ae < means[:, 1]).double()], -1)

    def models(self, replications, engine: str = "gibbs", ae_prior: str = "scaled", ae_scale: float = 0.25):
        """``[efficacy, adverse_event]`` posteriors with ``batch_shape [R]`` (``()`` for None): see the
        module docstring for ``engine`` (``"gibbs"`` or ``"conjugate"``), ``ae_prior`` (``"scaled"``,
        ``"wide"`` or ``"laplace"``, the Gibbs AE model's) and ``ae_scale``."""
        import pyro
        import pyro.distributions as dist

        from ..models.linear import BayesianLinear

        shape = () if replications is None else (int(replications),)
        d = self.dim
        device = self.device if engine == "conjugate" else torch.device("cpu")  # the Gibbs engine is the CPU's
        if engine == "gibbs" and self.device.type != "cpu":
            raise ValueError(f"engine: the Gibbs engine runs on the CPU; a problem on {self.device} takes "
                             "engine='conjugate' (or build the problem on the CPU)")
        ae_loc = torch.zeros(d, dtype=_F64, device=device)
        ae_loc[0] = -3.0
        if engine == "conjugate":
            eff = BayesianLinear(dist.Normal(torch.zeros(d, dtype=_F64, device=device), 1.0).to_event(1), noise_std=0.5,
                                 batch_shape=shape)
            ae_loc[0] = 0.05
            ae = BayesianLinear(dist.Normal(ae_loc, 0.2).to_event(1), noise_std=0.2, batch_shape=shape)
            return [eff, ae]
        if engine != "gibbs":
            raise ValueError(f"engine: expected 'gibbs' or 'conjugate', got {engine!r}")

        def horseshoe():
            tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(1.0, dtype=_F64, device=device)))
            lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d, dtype=_F64, device=device)).to_event(1))
            return pyro.sample("w", dist.Normal(torch.zeros(d, dtype=_F64, device=device), tau * lam).to_event(1))

        eff = BayesianLinear(horseshoe, dim=d, noise_std=0.5, batch_shape=shape)
        if ae_prior == "wide":
            prior = dist.Normal(ae_loc, 1.0).to_event(1)
        elif ae_prior == "laplace":
            prior = dist.Laplace(ae_loc, 1.0).to_event(1)
        elif ae_prior == "scaled":
            scale = torch.full((d,), float(ae_scale), dtype=_F64, device=device)
            scale[:4] = 1.0
            prior = dist.Normal(ae_loc, scale).to_event(1)
        else:
            raise ValueError(f"ae_prior: expected 'scaled', 'wide' or 'laplace', got {ae_prior!r}")
        ae = BayesianLinear(prior, likelihood="logistic", batch_shape=shape)
        return [eff, ae]
