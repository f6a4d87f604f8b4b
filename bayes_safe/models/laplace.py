"""Online Laplace (Gaussian) posterior for 0/1 outcomes: a cost per decision independent of the history.

``LaplaceLinearPosterior`` is the engine ``BayesianLinear(prior, likelihood="logistic" or "probit",
inference="laplace")`` builds (``engine_name == "laplace"``). It keeps a Gaussian approximation
``N(m, P^-1)`` of the posterior of the weights, in natural form::

    P   = H + P0            eta = g + P0 m0            m = P^-1 eta

where ``P0, m0`` are the prior's precision and mean and ``(H, g)`` a quadratic summary of the data's
log-likelihood: each row ``(x, y)`` contributes ``h x x^T`` to ``H`` and ``(r + h f) x`` to ``g``,
``r = d/df log p(y | f)`` and ``h = -d^2/df^2 log p(y | f)`` evaluated at the row's linear predictor
``f = x^T w*`` at the mode ``w*`` it was fitted at (the second-order Taylor expansion of the row's
log-likelihood there, written as a Gaussian pseudo-observation). Nothing else about the rows is kept,
so memory and the cost of an update, a draw or a summary do not grow with the number of rows.

**Updates** (assumed-density filtering with a Laplace step: Spiegelhalter & Lauritzen 1990, "Sequential
updating of conditional probabilities on directed graphical structures", Networks 20; Chapelle & Li
2011, "An empirical evaluation of Thompson sampling", NeurIPS, Sec. 4 / Algorithm 3, here with the full
covariance instead of their diagonal one):

* one row: the previous Gaussian is the prior of the new row, and its mode is found exactly. The mode
  moves along ``P^-1 x`` only: ``w* = m + c P^-1 x`` with ``c = r(f0 + c s)``, ``f0 = x^T m``, ``s =
  x^T P^-1 x``, a scalar equation solved by Newton's method (monotone, 12 iterations at most). Then
  ``P += h* x x^T`` and ``eta += (r* + h* f*) x``, and ``P^-1 eta = w*`` exactly. Cost: two triangular
  solves with the cached factor, ``O(d^2)``, and a refactorisation ``O(d^3)`` at the next query.
* several rows in one ``update`` (a warm start from a log): Newton's method on the rows jointly with the
  previous Gaussian as their prior, to convergence (the Laplace approximation of that batch, exact for
  a first batch under a Gaussian prior), ``O(n d^2)`` per iteration, once.

**Scale-mixture priors** (``Laplace``, ``StudentT`` / ``Cauchy``, horseshoe; the ``ScaleMixturePrior``
of the Gibbs engine) are Gaussian given their scales, ``w_j ~ N(m0_j, 1 / p_j)``. The prior precisions
``p_j`` are set by EM (the expectation of ``1 / v_j`` given the Gaussian ``q(w) = N(m, P^-1)``, with
``E (w_j - m0_j)^2 = (m_j - m0_j)^2 + (P^-1)_jj``), re-solving the mode against the kept data summary
(``(H + P0') m' = g + P0' m0``): every ``refresh_every`` rows (``em_steps`` iterations; default every
20 rows, 5 iterations, ``O(d^3)`` each), and to convergence after a batch of rows. The expectations
are those of the Gibbs engine's conditionals (``gibbs.py``):

* Laplace ``b``: ``E[1/v_j] = 1 / (b_j sqrt(E (w_j - m0_j)^2))`` (the inverse-Gaussian conditional's
  mean, at the root mean square of ``w_j - m0_j``: the EM of the Bayesian lasso, Figueiredo 2003);
* Student-t ``(nu, s)``: ``E[g_j] = (nu + 1) / (nu + E (w_j - m0_j)^2 / s^2)``, ``p_j = E[g_j] / s^2``;
* horseshoe ``(s, c)``: the mean-field expectations of the Makalic & Schmidt (2016) hierarchy (the
  variational Bayes of Neville, Ormerod & Wand 2014) iterated to a fixed point:
  ``E[1/lam_j^2] = 1 / (E[1/nu_j] + E w_j^2 E[1/tau^2] / 2)``, ``E[1/nu_j] = 1 / (1/c_j^2 +
  E[1/lam_j^2])``, ``E[1/tau^2] = ((d+1)/2) / (E[1/xi] + sum_j E w_j^2 E[1/lam_j^2] / 2)``,
  ``E[1/xi] = 1 / (1/s^2 + E[1/tau^2])``; ``p_j = E[1/lam_j^2] E[1/tau^2]``.

A Gaussian prior (``MultivariateNormal``, ``Normal(...).to_event(1)``) is used as it is.

**Queries.** A Thompson draw is ``w = L^-T (u + z)``, ``L L^T = P``, ``u = L^-1 eta``, ``z ~ N(0, I)``
(the conjugate engine's draw; ``S`` at once under a ``DrawBatch``, independent: nothing moves).
``predict`` gives the mean and variance of the success probability ``link(x^T w)`` under the
Gaussian, by 32-node Gauss-Hermite quadrature in ``f = x^T w ~ N(x^T m, x^T P^-1 x)`` (error far
below 1e-8 for these links at the spreads met in practice).

The approximation: each row's curvature is taken at the mode when it arrived (the rows are not
re-linearised later), and the scales by EM rather than integrated over. On a sparse logistic model
(d = 90, 20,000 rows, ``benchmarks/sparse_logistic.py``) the predicted probabilities are within 0.01
of a long Gibbs chain's; see the user guide (performance) for the measured figures.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..random import DrawBatch, Generator, standard_normal
from ._gaussian import cholesky as _cholesky

_DTYPE = torch.float64
#: ``inference_options`` keys of this engine
LAPLACE_OPTIONS = ("refresh_every", "em_steps", "newton_steps", "tol")
_GH_NODES, _GH_WEIGHTS = (torch.as_tensor(a, dtype=_DTYPE) for a in np.polynomial.hermite_e.hermegauss(32))
_GH_WEIGHTS = _GH_WEIGHTS / _GH_WEIGHTS.sum()  # expectations under N(0, 1)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _derivatives(likelihood: str, f: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r, h)``: the first derivative of ``log p(y | f)`` in ``f`` and minus the second (``h > 0``)."""
    if likelihood == "logistic":
        p = torch.sigmoid(f)
        return y - p, (p * (1.0 - p)).clamp_min(1e-300)
    # probit: log Phi(t), t = (2y - 1) f; ratio phi(t) / Phi(t) in logs (stable far in the tails)
    sign = 2.0 * y - 1.0
    t = sign * f
    ratio = torch.exp(-0.5 * t * t - _LOG_SQRT_2PI - torch.special.log_ndtr(t))
    return sign * ratio, (ratio * (t + ratio)).clamp_min(1e-300)


class LaplaceLinearPosterior:
    """Online Laplace approximation ``N(m, P^-1)`` of the weights of a logistic or probit model,
    batched over ``batch_shape`` (see the module docstring).

    Args:
        prior: a ``ScaleMixturePrior`` (``gibbs.recognise_prior``): Gaussian, Laplace, Student-t or
            horseshoe.
        dim: ``d``.
        batch_shape: ``[*b]``.
        likelihood: ``"logistic"`` or ``"probit"`` (a Gaussian likelihood is refused: the conjugate
            engine is exact for it).
        refresh_every: rows between EM refreshes of a scale-mixture prior's precisions (default 20).
        em_steps: EM iterations per refresh (default 5).
        newton_steps: the most Newton iterations of a batch update (default 50; the scalar step of a
            one-row update takes at most 12).
        tol: convergence tolerance on the weights (absolute, default 1e-9) of the batch Newton and EM.

    Shapes: ``add(X [*b, n, d], y [*b, n])``; ``draw() -> [*b, d]`` (``[S, *b, d]`` under a
    ``DrawBatch``); ``summary(X [*b, k, d], link) -> (mean_w [*b, d], mean [*b, k], var [*b, k])``.
    """

    method = "laplace"

    def __init__(self, prior, dim: int, batch_shape, *, likelihood: str = "logistic", refresh_every: int = 20,
                 em_steps: int = 5, newton_steps: int = 50, tol: float = 1e-9):
        if likelihood not in ("logistic", "probit"):
            raise ValueError(f"likelihood: the laplace engine approximates 0/1 outcomes ('logistic' or 'probit'); "
                             f"a {likelihood!r} likelihood with a Gaussian prior is exact with inference='conjugate', "
                             f"got {likelihood!r}")
        for name, value, low in (("refresh_every", refresh_every, 1), ("em_steps", em_steps, 0),
                                 ("newton_steps", newton_steps, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"inference_options: {name!r} must be an int >= {low}, got {value!r}")
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0 or not math.isfinite(tol):
            raise ValueError(f"inference_options: 'tol' must be a positive number, got {tol!r}")
        self.prior = prior
        self.dim = int(dim)
        self.batch_shape = torch.Size(batch_shape)
        self.likelihood = likelihood
        self.refresh_every, self.em_steps, self.newton_steps, self.tol = (
            int(refresh_every), int(em_steps), int(newton_steps), float(tol))
        b, d = tuple(self.batch_shape), self.dim
        self.kind = prior.kind
        self.m0 = prior.loc.to(_DTYPE).expand(*b, d).clone()
        self.H = torch.zeros((*b, d, d), dtype=_DTYPE)
        # ``base_prior`` (``set_base``): the data summary at which the posterior is the base prior,
        # ``(P_base - P0, P_base m_base - P0 m0)``; forgetting pulls ``(H, g)`` toward it (None: toward 0)
        self.base_H: torch.Tensor | None = None
        self.base_g: torch.Tensor | None = None
        self.g = torch.zeros((*b, d), dtype=_DTYPE)
        self.n = 0
        self.since_refresh = 0
        self.aux: dict[str, torch.Tensor] = {}
        if self.kind == "gaussian":
            self.prior_precision = prior.precision.to(_DTYPE).expand(*b, d, d).clone()  # full, fixed
        else:
            if self.kind == "laplace":
                p = 1.0 / (2.0 * prior.scale**2)  # 1 / the mixing variance's prior mean
            elif self.kind == "student":
                p = 1.0 / prior.scale**2  # E[g] = 1
            else:
                c2, s2 = prior.local_scale**2, prior.global_scale**2
                self.aux = {"inv_lam2": 1.0 / c2, "inv_nu": 1.0 / (1.0 / c2 + 1.0 / c2),
                            "inv_tau2": 1.0 / s2, "inv_xi": 1.0 / (1.0 / s2 + 1.0 / s2)}
                p = self.aux["inv_lam2"] * self.aux["inv_tau2"][..., None]
            self.prior_precision = p.to(_DTYPE).expand(*b, d).clone()  # diagonal, by EM
        self._invalidate()
        self._mean: torch.Tensor | None = self.m0.clone()

    # ------------------------------------------------------------------ natural parameters
    def _prior_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(P0 [*b, d, d], P0 m0 [*b, d])``."""
        p0 = self.prior_precision
        if self.kind == "gaussian":
            return p0, (p0 @ self.m0[..., None])[..., 0]
        return torch.diag_embed(p0), p0 * self.m0

    def precision(self) -> torch.Tensor:
        """``P = H + P0``, ``[*b, d, d]``."""
        return self.H + self._prior_terms()[0]

    def eta(self) -> torch.Tensor:
        """``eta = g + P0 m0``, ``[*b, d]``."""
        return self.g + self._prior_terms()[1]

    def _invalidate(self) -> None:
        self._L = self._u = self._mean = None

    def factor(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L [*b, d, d], u [*b, d, 1])`` with ``L L^T = P`` and ``u = L^-1 eta`` (cached)."""
        if self._L is None:
            self._L = _cholesky(self.precision())
            self._u = torch.linalg.solve_triangular(self._L, self.eta()[..., None], upper=False)
        return self._L, self._u

    def mean(self) -> torch.Tensor:
        """The mode ``m = P^-1 eta``, ``[*b, d]`` (cached)."""
        if self._mean is None:
            L, u = self.factor()
            self._mean = torch.linalg.solve_triangular(L.mT, u, upper=True)[..., 0]
        return self._mean

    def covariance(self) -> torch.Tensor:
        """``P^-1``, ``[*b, d, d]``."""
        return torch.cholesky_inverse(self.factor()[0])

    # ------------------------------------------------------------------ data
    def add(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """Learn rows ``X [*b, n, d]``, ``y [*b, n]`` (0/1, checked by the caller)."""
        X = X.to(_DTYPE).expand(*self.batch_shape, *X.shape[-2:])
        y = y.to(_DTYPE).expand(*self.batch_shape, y.shape[-1])
        n = X.shape[-2]
        if n == 0:
            return
        if n == 1:
            self._add_one(X[..., 0, :], y[..., 0])
        else:
            self._add_batch(X, y)
        self.n += n
        self.since_refresh += n
        if self.kind != "gaussian" and (n > 1 or self.since_refresh >= self.refresh_every):
            self.refresh(self.em_steps if n == 1 else None)

    def _add_one(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One row per batch element, ``x [*b, d]``, ``y [*b]``: the exact mode of (previous Gaussian) x
        (this row's likelihood), found along ``P^-1 x`` by a scalar Newton iteration."""
        L, _ = self.factor()
        m = self.mean()
        a = torch.cholesky_solve(x[..., None], L)[..., 0]  # P^-1 x
        s = (x * a).sum(-1)
        f0 = (x * m).sum(-1)
        c = torch.zeros_like(f0)
        for _ in range(12):  # c = r(f0 + c s): phi(c) = c - r(f0 + c s) is increasing (phi' = 1 + s h)
            r, h = _derivatives(self.likelihood, f0 + c * s, y)
            step = (c - r) / (1.0 + s * h)
            c = c - step
            if float(step.abs().max()) < 1e-13:
                break
        f = f0 + c * s
        r, h = _derivatives(self.likelihood, f, y)
        self.H.addcmul_(x[..., :, None] * h[..., None, None], x[..., None, :])
        self.g.add_(x * (r + h * f)[..., None])
        # the new mode is m + c P^-1 x exactly (module docstring); it is recomputed from (H, g) at the
        # next query (with the factor a draw needs anyway), so the state is (H, g) and nothing else
        self._invalidate()

    def _add_batch(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """Rows ``X [*b, n, d]``: Newton's method on the rows with the previous Gaussian as their prior
        (and, for a scale-mixture prior, EM of its precisions between rounds), then their summary."""
        H0, g0 = self.H, self.g
        w = self.mean()
        rounds = 1 if self.kind == "gaussian" else 8
        for _ in range(rounds):
            P0, e0 = self._prior_terms()
            for _ in range(self.newton_steps):
                f = (X @ w[..., None])[..., 0]
                r, h = _derivatives(self.likelihood, f, y)
                hess = H0 + P0 + X.mT @ (X * h[..., None])
                rhs = g0 + e0 + (X.mT @ (r + h * f)[..., None])[..., 0]
                new = torch.cholesky_solve(rhs[..., None], _cholesky(hess))[..., 0]
                done = float((new - w).abs().max()) < self.tol
                w = new
                if done:
                    break
            f = (X @ w[..., None])[..., 0]
            r, h = _derivatives(self.likelihood, f, y)
            self.H = H0 + X.mT @ (X * h[..., None])
            self.g = g0 + (X.mT @ (r + h * f)[..., None])[..., 0]
            self._invalidate()
            if self.kind == "gaussian":
                return
            self.refresh(None)
            fitted, w = w, self.mean()
            if float((w - fitted).abs().max()) < 1e-6:  # the rows' expansion point is the mode: done
                return

    def forget(self, factor: torch.Tensor) -> None:
        """Stabilised forgetting (Kulhavy & Zarrop 1993): the data summary ``(H, g)`` of each batch
        element weighed by ``factor [*b]`` in ``[0, 1]``, the prior kept. The Gaussian pseudo-
        likelihood of the rows learned so far raised to the power ``factor``: a fixed factor before
        each row, or ``keep`` at an adaptive restart (0: the prior alone)."""
        f = factor.to(_DTYPE)
        if self.base_H is None:
            self.H = self.H * f[..., None, None]
            self.g = self.g * f[..., None]
        else:  # toward the base prior; an element at factor 1 keeps its summary exactly
            kept = f == 1
            self.H = torch.where(kept[..., None, None], self.H,
                                 self.base_H + f[..., None, None] * (self.H - self.base_H))
            self.g = torch.where(kept[..., None], self.g, self.base_g + f[..., None] * (self.g - self.base_g))
        self._invalidate()

    def set_base(self, loc: torch.Tensor, precision: torch.Tensor) -> None:
        """Make the Gaussian ``N(loc [*b, d], precision^-1 [*b, d, d])`` what forgetting returns to
        (``BayesianLinear``'s ``base_prior``): the posterior at data summary ``(P_base - P0, P_base
        m_base - P0 m0)``. Gaussian priors only (a scale-mixture prior's precisions move with EM)."""
        P0, e0 = self._prior_terms()
        self.set_base_summary((precision - P0).to(_DTYPE), ((precision @ loc[..., None])[..., 0] - e0).to(_DTYPE))

    def set_base_summary(self, H: torch.Tensor, g: torch.Tensor) -> None:
        """The base prior as the data summary ``(H [*b, d, d], g [*b, d])`` at which the posterior is it
        (``set_base``'s, or a saved state's: exact)."""
        if self.kind != "gaussian":
            raise ValueError(f"base_prior: the laplace engine returns to a base prior only from a Gaussian prior "
                             f"(its {self.kind} prior's precisions are refitted by EM); give a Gaussian prior")
        self.base_H, self.base_g = H, g

    def base(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(loc [*b, d], precision [*b, d, d])`` of the base prior, or None (the prior itself)."""
        if self.base_H is None:
            return None
        P0, e0 = self._prior_terms()
        precision = self.base_H + P0
        return torch.cholesky_solve((self.base_g + e0)[..., None], torch.linalg.cholesky(precision))[..., 0], precision

    # ------------------------------------------------------------------ scale-mixture prior: EM
    def refresh(self, steps: int | None = None) -> None:
        """EM of a scale-mixture prior's precisions against the kept data summary: ``steps``
        iterations, or (``None``) until the mode moves less than ``tol`` (at most 500)."""
        self.since_refresh = 0
        if self.kind == "gaussian":
            return
        count = 500 if steps is None else int(steps)
        for _ in range(count):
            L, _ = self.factor()
            m = self.mean()
            var = torch.cholesky_inverse(L).diagonal(dim1=-2, dim2=-1)
            e2 = (m - self.m0) ** 2 + var
            p = self.prior
            if self.kind == "laplace":
                prec = 1.0 / (p.scale * e2.sqrt())
            elif self.kind == "student":
                prec = (p.df + 1.0) / (p.df + e2 / p.scale**2) / p.scale**2
            else:
                a, d = self.aux, self.dim
                inv_c2, inv_s2 = 1.0 / p.local_scale**2, 1.0 / p.global_scale**2
                for _ in range(20):  # the mean-field fixed point given E w^2
                    a["inv_lam2"] = 1.0 / (a["inv_nu"] + 0.5 * e2 * a["inv_tau2"][..., None])
                    a["inv_nu"] = 1.0 / (inv_c2 + a["inv_lam2"])
                    a["inv_tau2"] = 0.5 * (d + 1) / (a["inv_xi"] + 0.5 * (e2 * a["inv_lam2"]).sum(-1))
                    a["inv_xi"] = 1.0 / (inv_s2 + a["inv_tau2"])
                prec = a["inv_lam2"] * a["inv_tau2"][..., None]
            self.prior_precision = prec.clamp(1e-12, 1e12)
            self._invalidate()
            if steps is None and float((self.mean() - m).abs().max()) < self.tol:
                break

    def fit(self, generator: Generator = None) -> None:
        """EM of a scale-mixture prior's precisions to convergence (nothing for a Gaussian prior)."""
        self.refresh(None)

    # ------------------------------------------------------------------ queries
    def draw(self, generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """One Gaussian draw ``[*b, d]``, or ``[S, *b, d]`` independent ones under a ``DrawBatch``
        (the state never moves: ``played`` changes nothing)."""
        L, u = self.factor()
        z = standard_normal((*self.batch_shape, self.dim, 1), generator, key=key)
        if z.dtype != _DTYPE:
            z = z.to(_DTYPE)
        rhs = u + z
        if isinstance(generator, DrawBatch) and rhs.dim() == L.dim() + 1:
            # S draws: one solve with S right-hand columns per factor (not S broadcast copies of it)
            cols = rhs[..., 0].movedim(0, -1)  # [*b, d, S]
            return torch.linalg.solve_triangular(L.mT, cols, upper=True).movedim(-1, 0)
        return torch.linalg.solve_triangular(L.mT, rhs, upper=True)[..., 0]

    def summary(self, X: torch.Tensor | None, generator: Generator = None, link=None):
        """``(mean_w [*b, d], mean [*b, k], var [*b, k])``: the mode, and the mean and variance of
        ``link(x^T w)`` (of ``x^T w`` when ``link`` is None) under the Gaussian, by Gauss-Hermite
        quadrature in ``f = x^T w``."""
        m = self.mean()
        if X is None:
            return m, None, None
        L, _ = self.factor()
        mu = (X @ m[..., None])[..., 0]
        v = torch.linalg.solve_triangular(L, X.mT, upper=False)
        var = (v * v).sum(-2)
        if link is None:
            return m, mu, var
        f = mu[..., None] + var.sqrt()[..., None] * _GH_NODES  # [*b, k, 32]
        p = link(f)
        mean = (p * _GH_WEIGHTS).sum(-1)
        second = (p * p * _GH_WEIGHTS).sum(-1)
        return m, mean, (second - mean * mean).clamp_min(0.0)

    # ------------------------------------------------------------------ state (bayes_safe.state)
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """name -> tensor of everything the engine learned (the state files' ``laplace.tensors``)."""
        out = {"H": self.H, "g": self.g, "prior_precision": self.prior_precision}
        out.update({f"aux.{k}": v for k, v in self.aux.items()})
        return out

    def load_state_tensors(self, values: dict[str, torch.Tensor], n: int, since_refresh: int) -> None:
        """Put saved tensors (checked against ``state_tensors``' shapes by the caller) in place."""
        self.H, self.g = values["H"].clone(), values["g"].clone()
        self.prior_precision = values["prior_precision"].clone()
        self.aux = {k.split(".", 1)[1]: v.clone() for k, v in values.items() if k.startswith("aux.")}
        self.n, self.since_refresh = int(n), int(since_refresh)
        self._invalidate()
