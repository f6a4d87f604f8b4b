"""Warm starts: a prior fitted on logged data, as a Pyro distribution any model takes.

```python
from bayes_safe.models import BayesianLinear, fit_prior

fit = fit_prior(X, y, groups=instance)       # logged rows of other instances (numpy, pandas, torch)
print(fit)                                   # the prior's mean and scales, the noise, the evidence
model = BayesianLinear(fit.prior, noise_std=fit.noise_std)
```

**``fit_prior``: empirical Bayes over instances.** The history holds rows ``(x_i, y_i)`` of ``G``
instances (users, markets, earlier experiments: ``groups``), each with weights of its own drawn
from one population, ``w_g ~ N(mu, Sigma)``, and ``y_i = x_i^T w_g + N(0, sigma^2)``. The prior
of a new instance is the population ``N(mu, Sigma)``: ``mu``, ``Sigma`` (and ``sigma`` unless
given) maximise the marginal likelihood of the history, ``prod_g N(y_g; X_g mu, X_g Sigma X_g^T
+ sigma^2 I)`` (type-II maximum likelihood; Bishop 2006, s.3.5; for this hierarchical model
Gelman et al., *Bayesian Data Analysis*, 3rd ed., s.15.4), found by expectation-maximisation
(Dempster, Laird & Rubin 1977): the E-step is each instance's conjugate posterior ``N(m_g,
V_g)``, the M-step ``mu = mean_g m_g``, ``Sigma = mean_g [(m_g - mu)(m_g - mu)^T + V_g]``,
``sigma^2 = sum_g E||y_g - X_g w_g||^2 / N``. Each step raises the evidence; iterations stop when
it changes by less than ``tol`` per row. Everything runs on per-instance sufficient statistics
(``X_g^T X_g``, ``X_g^T y_g``), so 5,000 rows of 50 instances take a few milliseconds.

**Shrinkage.** ``covariance="diagonal"`` (the default) keeps one scale per feature; ``"full"``
fits the correlations too (it needs many instances: ``d (d + 1) / 2`` numbers); ``"isotropic"``
one scale for all. ``shrinkage`` in ``[0, 1]`` pulls the fitted ``Sigma`` toward the isotropic
``(tr Sigma / d) I`` after every M-step (a fixed-weight linear shrinkage in the spirit of Ledoit
& Wolf 2004), which keeps a full covariance well conditioned with few instances. ``min_scale``
floors every prior standard deviation, so a feature the history never varied is not pinned to
its mean (a prior scale of 0 would never learn). A fitted prior says what the history supports:
with few instances its scales are noisy, and a scale far smaller than the truth makes a policy
slow to leave a wrong mean; ``min_scale`` is the guard.

**``power_prior``: one history of the same instance.** When the log is the same population the
new policy serves (an old policy's log of the same users), there is one instance and no spread
between instances to fit. The power prior (Ibrahim & Chen 2000) weighs that history's
likelihood by ``weight`` in ``(0, 1]``: the conjugate posterior of ``prior`` after the logged rows,
each counting as ``weight`` of an observation (``weight = 1``: the old posterior itself; 0.1:
ten logged rows count as one new one). It is the recipe for starting a new policy from an old
policy's log: ``docs/guide/warm-starts.md``.

Both return a ``pyro.distributions`` Normal over ``R^d`` (``MultivariateNormal`` for a full
covariance, ``Normal(...).to_event(1)`` otherwise) of float64: inspect its ``mean`` and
``stddev``, or pass it to any model (conjugate, Gibbs, Langevin, NUTS / SVI, per arm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyro.distributions as dist
import torch

from .._validation import as_tensor, check_finite

__all__ = ["PriorFit", "fit_prior", "power_prior"]

F64 = torch.float64


@dataclass(frozen=True)
class PriorFit:
    """What ``fit_prior`` found.

    Attributes:
        prior: the population ``N(mu, Sigma)`` as a Pyro distribution over ``R^d`` (float64).
        noise_std: the fitted (or given) observation noise ``sigma``.
        log_evidence: the log marginal likelihood of the history at the fit.
        num_groups: ``G``, the instances the history holds; ``num_rows``: ``N``.
        iterations: EM iterations run; ``converged``: whether the evidence settled within ``tol``.
    """

    prior: dist.Distribution
    noise_std: float
    log_evidence: float
    num_groups: int
    num_rows: int
    iterations: int
    converged: bool

    @property
    def mean(self) -> torch.Tensor:
        """``mu [d]``."""
        return self.prior.mean

    @property
    def covariance(self) -> torch.Tensor:
        """``Sigma [d, d]``."""
        p = self.prior
        return p.covariance_matrix if isinstance(p, dist.MultivariateNormal) else torch.diag(p.variance)

    def __repr__(self) -> str:
        mean = [round(v, 4) for v in self.mean.tolist()]
        sd = [round(v, 4) for v in self.covariance.diagonal().sqrt().tolist()]
        return (f"PriorFit(mean={mean}, sd={sd}, noise_std={self.noise_std:.4g}, log_evidence={self.log_evidence:.6g}, "
                f"groups={self.num_groups}, rows={self.num_rows}, iterations={self.iterations}, "
                f"converged={self.converged})")


def _rows(X, y, name_x: str = "X", name_y: str = "y") -> tuple[torch.Tensor, torch.Tensor]:
    X = check_finite(as_tensor(X, name_x), name_x)
    y = check_finite(as_tensor(y, name_y), name_y)
    if X.dim() != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{name_x}: expected logged features [N, d] with N, d >= 1, got shape {list(X.shape)}")
    if y.dim() == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != X.shape[:1]:
        raise ValueError(f"{name_y}: expected one outcome per row of {name_x}, shape [{X.shape[0]}], got {list(y.shape)}")
    return X, y


def _group_index(groups, n: int) -> tuple[torch.Tensor, int]:
    """``groups`` (any hashable labels, one per row) as indices ``0 .. G - 1`` ``[N]`` and ``G``."""
    if groups is None:
        raise ValueError("groups: expected one label per row naming its instance (user, market, experiment); "
                         "fit_prior fits the spread between instances and needs at least 2 (for one history of the "
                         "same population use power_prior)")
    if type(groups).__module__.startswith("pandas"):
        groups = groups.to_numpy()
    labels = np.asarray(groups.cpu().numpy() if isinstance(groups, torch.Tensor) else groups)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"groups: expected one label per row, shape [{n}], got {list(labels.shape)}")
    _, index = np.unique(labels, return_inverse=True)
    G = int(index.max()) + 1
    if G < 2:
        raise ValueError("groups: the history holds one instance; the spread between instances needs at least 2 "
                         "(for one history of the same population use power_prior)")
    return torch.as_tensor(index, dtype=torch.long), G


def _project(S: torch.Tensor, covariance: str, shrinkage: float, floor: float) -> torch.Tensor:
    d = S.shape[-1]
    if covariance == "isotropic":
        S = torch.eye(d, dtype=F64) * (S.diagonal().mean())
    elif covariance == "diagonal":
        S = torch.diag(S.diagonal())
    if shrinkage:
        S = (1 - shrinkage) * S + shrinkage * S.diagonal().mean() * torch.eye(d, dtype=F64)
    S = 0.5 * (S + S.mT)
    if floor:  # every variance at least floor (and the matrix stays positive definite)
        S = S + torch.diag((floor - S.diagonal()).clamp_min(0))
    return S


def _e_step(mu, Sigma, var, xtx, xty, yty, n) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Each instance's posterior ``N(m_g [G, d], V_g [G, d, d])`` under ``N(mu, Sigma)`` and
    ``sigma^2 = var``, and the log evidence of the history there (module docstring), from the
    per-instance sufficient statistics ``xtx [G, d, d]``, ``xty [G, d]``, ``yty [G]``, ``n [G]``."""
    L_prior = torch.linalg.cholesky(Sigma)
    prior_prec = torch.cholesky_inverse(L_prior)
    P = prior_prec + xtx / var                                   # [G, d, d]
    Lp = torch.linalg.cholesky(P)
    m = torch.cholesky_solve(((prior_prec @ mu) + xty / var)[..., None], Lp)[..., 0]
    V = torch.cholesky_inverse(Lp)
    # completing the square: log N(y; X mu, X Sigma X^T + var I) = -n/2 log(2 pi var) - 1/2 log|Sigma|
    #   + 1/2 log|V| - 1/2 (y^T y / var + mu^T Sigma^-1 mu - m^T P m)
    quad = yty / var + mu @ prior_prec @ mu - (m[:, None, :] @ P @ m[..., None])[:, 0, 0]
    logdet_sigma = 2 * L_prior.diagonal().log().sum()
    logdet_v = -2 * Lp.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    evidence = float((-0.5 * n * math.log(2 * math.pi * var) - 0.5 * logdet_sigma + 0.5 * logdet_v - 0.5 * quad).sum())
    return m, V, evidence


def fit_prior(X, y, groups, *, noise_std: float | None = None, covariance: str = "diagonal",
              shrinkage: float = 0.0, min_scale: float = 1e-3, max_iter: int = 1000, tol: float = 1e-9) -> PriorFit:
    """The population prior ``N(mu, Sigma)`` of instances' weights, by marginal likelihood (module docstring).

    Args:
        X: logged features ``[N, d]`` (the played action's features, as the models learn them);
            numpy, pandas, lists or a tensor.
        y: the logged outcomes ``[N]`` of one metric (a Gaussian likelihood: 0/1 outcomes are fitted
            as a linear probability model).
        groups: ``[N]`` labels naming each row's instance (at least 2 distinct).
        noise_std: the observation noise ``sigma`` if known; None fits it.
        covariance: ``"diagonal"`` (default), ``"full"`` or ``"isotropic"``.
        shrinkage: weight in ``[0, 1]`` toward the isotropic covariance after each M-step.
        min_scale: the smallest prior standard deviation allowed (> 0).
        max_iter, tol: EM stops after ``max_iter`` iterations or when the log evidence per row
            changes by less than ``tol``.
    """
    X, y = _rows(X, y)
    index, G = _group_index(groups, X.shape[0])
    if covariance not in ("diagonal", "full", "isotropic"):
        raise ValueError(f"covariance: expected 'diagonal', 'full' or 'isotropic', got {covariance!r}")
    if isinstance(shrinkage, bool) or not isinstance(shrinkage, (int, float)) or not 0 <= shrinkage <= 1:
        raise ValueError(f"shrinkage: expected a number in [0, 1], got {shrinkage!r}")
    if isinstance(min_scale, bool) or not isinstance(min_scale, (int, float)) or not 0 < min_scale < math.inf:
        raise ValueError(f"min_scale: expected a positive number, got {min_scale!r}")
    if noise_std is not None and (isinstance(noise_std, bool) or not isinstance(noise_std, (int, float))
                                  or not 0 < noise_std < math.inf):
        raise ValueError(f"noise_std: expected a positive number or None (fitted), got {noise_std!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter: expected a positive int, got {max_iter!r}")
    N, d = X.shape
    # per-instance sufficient statistics: X_g^T X_g [G, d, d], X_g^T y_g [G, d], y_g^T y_g [G], n_g [G]
    xtx = torch.zeros(G, d, d, dtype=F64).index_add_(0, index, X[:, :, None] * X[:, None, :])
    xty = torch.zeros(G, d, dtype=F64).index_add_(0, index, X * y[:, None])
    yty = torch.zeros(G, dtype=F64).index_add_(0, index, y * y)
    n = torch.zeros(G, dtype=F64).index_add_(0, index, torch.ones(N, dtype=F64))
    # a start: pooled least squares for mu, the outcomes' spread for sigma, unit scales
    pooled = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    resid = float(((y - X @ pooled) ** 2).mean())
    var = float(noise_std) ** 2 if noise_std is not None else max(resid, 1e-12)
    mu = pooled
    Sigma = _project(torch.eye(d, dtype=F64) * max(float(pooled.square().mean()), 1.0), covariance, shrinkage,
                     min_scale ** 2)
    previous, converged = -math.inf, False
    for iteration in range(1, max_iter + 1):
        m, V, evidence = _e_step(mu, Sigma, var, xtx, xty, yty, n)
        if abs(evidence - previous) < tol * N:
            converged = True
            break
        previous = evidence
        # M: the population's mean and covariance, and the noise
        mu = m.mean(0)
        dev = m - mu
        Sigma = _project((dev[:, :, None] * dev[:, None, :] + V).mean(0), covariance, shrinkage, min_scale ** 2)
        if noise_std is None:
            sq = yty - 2 * (m * xty).sum(-1) + (m[:, None, :] @ xtx @ m[..., None])[:, 0, 0]
            var = max(float((sq + (xtx * V).sum((-2, -1))).sum() / N), 1e-12)
    if not converged:  # the evidence of what is returned
        evidence = _e_step(mu, Sigma, var, xtx, xty, yty, n)[2]
    prior = (dist.MultivariateNormal(mu, covariance_matrix=Sigma) if covariance == "full"
             else dist.Normal(mu, Sigma.diagonal().sqrt()).to_event(1))
    return PriorFit(prior, math.sqrt(var), evidence, G, N, iteration, converged)


def power_prior(prior, X, y, *, noise_std: float, weight: float = 0.5) -> dist.Distribution:
    """``prior`` updated with a history of the same population, each logged row counting ``weight``
    (module docstring): the Gaussian ``N(m, V)`` with ``V^-1 = Sigma0^-1 + weight X^T X / sigma^2``
    and ``m = V (Sigma0^-1 mu0 + weight X^T y / sigma^2)``.

    Args:
        prior: a Gaussian prior over ``R^d`` (``Normal(...).to_event(1)`` or ``MultivariateNormal``).
        X, y: the logged features ``[N, d]`` and outcomes ``[N]``.
        noise_std: the observation noise ``sigma`` of the history.
        weight: the weight of a logged row, in ``(0, 1]``.
    Returns a ``MultivariateNormal`` over ``R^d`` (float64)."""
    X, y = _rows(X, y)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= 1:
        raise ValueError(f"weight: expected a number in (0, 1] (what one logged row counts for), got {weight!r}")
    if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)) or not 0 < noise_std < math.inf:
        raise ValueError(f"noise_std: expected a positive number, got {noise_std!r}")
    base = prior.base_dist if isinstance(prior, dist.Independent) else prior
    if isinstance(base, dist.Normal) and isinstance(prior, dist.Independent) and prior.event_shape == X.shape[1:]:
        mu0, cov0 = base.loc.to(F64).expand(X.shape[1:]), torch.diag(base.scale.to(F64).expand(X.shape[1:]) ** 2)
    elif isinstance(prior, dist.MultivariateNormal) and prior.event_shape == X.shape[1:]:
        mu0, cov0 = prior.loc.to(F64), prior.covariance_matrix.to(F64)
    else:
        raise ValueError(f"prior: expected a Gaussian over R^{X.shape[1]} (Normal(loc, scale).to_event(1) or "
                         f"MultivariateNormal) with no batch shape, got {type(prior).__name__} with event shape "
                         f"{list(getattr(prior, 'event_shape', []))}")
    prec0 = torch.cholesky_inverse(torch.linalg.cholesky(cov0))
    s2 = float(noise_std) ** 2
    prec = prec0 + weight * X.mT @ X / s2
    L = torch.linalg.cholesky(prec)
    cov = torch.cholesky_inverse(L)
    mean = torch.cholesky_solve((prec0 @ mu0 + weight * X.mT @ y / s2)[:, None], L)[:, 0]
    return dist.MultivariateNormal(mean, covariance_matrix=0.5 * (cov + cov.mT))
