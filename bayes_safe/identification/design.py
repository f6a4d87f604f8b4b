"""Optimal experimental designs for learning a linear constraint, and their rounding.

Lindner et al. (2022), section 3.3 and appendix B, need allocations (designs) ``lambda`` over
the arms ``X`` that solve problems of the form

```text
rho = min_lambda max_{x in T} w_x ||x||^2_{A(lambda)^-1},    A(lambda) = sum_{a in X} lambda_a a a^T,
```

with the targets ``T`` and weights ``w``:

* G-Allocation (appendix B.2): ``T = X``, ``w = 1``;
* ACOL (Algorithm 1, line 7): ``T = U_t`` (the uncertain arms), ``w = 1``;
* the oracle (appendix B.1): ``T = X_theta(x*)``, ``w_x = 1 / (phi^T x - tau)^2``.

``optimal_design`` solves them. When the targets are the arms themselves with unit weights,
the Kiefer-Wolfowitz (1960) equivalence theorem says the G-optimal design is the D-optimal one
and its value is ``dim span(X)``; we solve that case with the Wolfe-Atwood algorithm
(Frank-Wolfe / Fedorov-Wynn steps *and away steps*, exact line search of the log-determinant,
Kumar-Yildirim start on at most ``2 dim`` arms; Todd & Yildirim 2007), a certificate of
optimality being ``max_x ||x||^2 <= dim (1 + tol)``. The away steps drop arms the optimum does
not need, so the design's support is near-minimal (issue 16, item 5: the previous
multiplicative warm start left 987 of 1,000 arms with weight, down to 1e-11, where the optimum
needs about 320; a large support lengthens ACOL's minimum round ``r(eps)`` and makes
``round_design`` pull every support arm). Any other case (a subset of targets, weights) is a
saddle-point problem ``min_lambda max_mu sum_x mu_x w_x ||x||^2`` which we solve by
multiplicative primal-dual iterations (exponentiated gradient on the target weights ``mu``, the
multiplicative algorithm of the L-criterion on ``lambda``) with a certified lower bound from the
Frank-Wolfe gap (see ``_primal_dual``), followed by *prune and polish*: the solve is repeated on
the arms of largest weight only, and the sparsest such design whose value is still within
``tol`` of the (global) lower bound is kept. Either way the returned design carries the same
certificate (``value <= (1 + tol) lower_bound``), and a solve that reaches its iteration cap
before the certificate warns (``DesignWarning``) instead of returning silently.

The authors' implementation (``frank_wolfe_allocation``) runs plain Frank-Wolfe with step
``2 / (k + 2)`` for at most 1,000 iterations, stops when the step is small and moves weights
below 1e-5 to the heaviest arm; it certifies nothing. Its returned value is the *unsquared*
``max_x ||x||_{A^-1}`` (see ``ACOL(round_length="authors")``).

``round_design`` turns a design into ``N`` whole pulls with the efficient rounding of
Pukelsheim & Rieder (1992) (Pukelsheim, *Optimal Design of Experiments*, 2006, ch. 12), the
procedure the authors' implementation uses.

Shapes: ``arms`` is ``[n, d]``, ``targets`` ``[m, d]``, a design ``[n]`` (non-negative, sums to 1).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

__all__ = ["DesignResult", "DesignWarning", "design_value", "optimal_design", "round_design",
           "rounding_min_samples"]


class DesignWarning(RuntimeWarning):
    """``optimal_design`` stopped at its iteration cap before certifying ``tol``."""


@dataclass
class DesignResult:
    """A design and its quality.

    Attributes:
        weights: ``[n]`` the allocation ``lambda`` over the arms (sums to 1).
        value: ``max_{x in T} w_x ||x||^2_{A(lambda)^-1}`` at ``weights`` (the ``rho`` of Algorithm 1).
        lower_bound: a certified lower bound on the optimal value (so ``value / lower_bound - 1``
            bounds the relative sub-optimality).
        iterations: Frank-Wolfe iterations used.
        method: ``"d-optimal"`` (Kiefer-Wolfowitz route) or ``"primal-dual"`` (any targets/weights).
        converged: whether the certificate ``value <= (1 + tol) lower_bound`` was reached
            (``False``: the iteration cap was hit first, and a ``DesignWarning`` was issued).
    """

    weights: np.ndarray
    value: float
    lower_bound: float
    iterations: int
    method: str
    converged: bool = True

    @property
    def support(self) -> int:
        """The number of arms with positive weight."""
        return int((self.weights > 0).sum())

    @property
    def relative_gap(self) -> float:
        return self.value / self.lower_bound - 1.0 if self.lower_bound > 0 else math.inf


def _basis(arms: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """``[d, k]`` orthonormal basis of the span of the arms (so designs are well posed in k dims)."""
    _, s, vt = np.linalg.svd(arms, full_matrices=False)
    keep = s > rtol * max(s[0], 1e-300) if s.size else np.zeros(0, bool)
    return vt[keep].T


def _inv_pd(a: np.ndarray) -> np.ndarray:
    """Inverse of a symmetric positive-definite matrix through its Cholesky factor (with jitter)."""
    k = a.shape[0]
    jitter = 0.0
    scale = max(np.trace(a) / max(k, 1), 1e-300)
    for _ in range(8):
        try:
            c = np.linalg.cholesky(a + jitter * np.eye(k))
            ci = np.linalg.inv(c)  # triangular, k <= d: off any hot path
            return ci.T @ ci
        except np.linalg.LinAlgError:
            jitter = max(jitter * 10, 1e-12 * scale)
    # last resort (near-singular or slightly indefinite from round-off): eigenvalues floored
    vals, vecs = np.linalg.eigh((a + a.T) / 2)
    if not np.all(np.isfinite(vals)):
        raise np.linalg.LinAlgError("design matrix has non-finite entries")
    vals = np.maximum(vals, 1e-12 * max(vals.max(), 1e-300))
    return (vecs / vals) @ vecs.T


def design_value(arms, weights, targets=None, target_weights=None) -> float:
    """``max_{x in targets} w_x ||x||^2_{A(weights)^-1}`` (``inf`` if a target is not covered)."""
    arms = np.asarray(arms, float)
    targets = arms if targets is None else np.asarray(targets, float)
    w = np.ones(len(targets)) if target_weights is None else np.asarray(target_weights, float)
    a = arms.T @ (np.asarray(weights, float)[:, None] * arms)
    vals, vecs = np.linalg.eigh(a)
    tol = 1e-10 * max(vals.max(), 1e-300)
    proj = targets @ vecs
    inside = vals > tol
    if np.any(np.abs(proj[:, ~inside]) > 1e-8 * (1 + np.abs(proj).max())):
        return math.inf
    g = (proj[:, inside] ** 2 / vals[inside]).sum(1)
    return float((w * g).max())


def _check(arms, targets, target_weights):
    arms = np.asarray(arms, dtype=float)
    if arms.ndim != 2 or arms.shape[0] == 0:
        raise ValueError(f"arms: expected a non-empty [n, d] array, got shape {list(arms.shape)}")
    if not np.all(np.isfinite(arms)):
        raise ValueError("arms: expected finite values")
    if targets is None:
        t = arms
    else:
        t = np.asarray(targets, dtype=float)
        if t.ndim != 2 or t.shape[1] != arms.shape[1] or t.shape[0] == 0:
            raise ValueError(
                f"targets: expected a non-empty [m, {arms.shape[1]}] array, got shape {list(t.shape)}")
    if target_weights is None:
        w = np.ones(len(t))
    else:
        w = np.asarray(target_weights, dtype=float)
        if w.shape != (len(t),) or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError(f"target_weights: expected {len(t)} finite non-negative numbers, got shape {list(w.shape)}")
    return arms, t, w


def optimal_design(arms, targets=None, target_weights=None, *, tol: float = 1e-2, max_iter: int = 300,
                   eta: float = 1.0, prune: float = 1e-9, sparse: bool = True) -> DesignResult:
    """Solve ``min_lambda max_{x in targets} w_x ||x||^2_{A(lambda)^-1}`` over designs on ``arms``.

    Args:
        arms: ``[n, d]`` the arms a design may pull.
        targets: ``[m, d]`` the arms whose uncertainty is minimised (``None``: the arms, i.e.
            G-optimal design). Targets must lie in the span of the arms.
        target_weights: ``[m]`` non-negative weights ``w_x`` (``None``: all 1).
        tol: certified relative optimality gap at which to stop (``value <= (1 + tol) lower_bound``).
        max_iter: cap on the iterations (the G-optimal route counts its cheap Frank-Wolfe steps
            separately, up to ``20 * max_iter``). Reaching it before ``tol`` is certified issues a
            ``DesignWarning`` (and ``converged=False``).
        eta: step size of the target weights in the primal-dual route.
        prune: weights below ``prune`` (relative) are set to zero at the end.
        sparse: primal-dual route only: prune and polish the support (see the module docstring);
            ``False`` returns the multiplicative solution, whose weights are all positive.

    Returns:
        ``DesignResult``.
    """
    tol = float(tol)
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol: expected a number > 0, got {tol!r}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter: expected an int >= 1, got {max_iter!r}")
    max_iter = int(max_iter)
    arms, t, w = _check(arms, targets, target_weights)
    basis = _basis(arms)
    k = basis.shape[1]
    n = arms.shape[0]
    if k == 0:  # all arms are zero: every design is optimal, every target is zero or uncovered
        val = 0.0 if np.allclose(t, 0) else math.inf
        return DesignResult(np.full(n, 1.0 / n), val, val, 0, "trivial")
    x = arms @ basis  # [n, k]
    z = t @ basis  # [m, k]
    if np.any(np.abs(t - z @ basis.T) > 1e-8 * (1 + np.abs(t).max())):
        raise ValueError("targets: some targets are not in the span of the arms; no design covers them")
    keep = w > 0
    if targets is None and target_weights is None:
        lam, value, lower, it = _d_optimal(x, tol, max_iter)
        method = "d-optimal"
    elif not keep.any():
        return DesignResult(np.full(n, 1.0 / n), 0.0, 0.0, 0, "trivial")
    else:
        lam, value, lower, it = _primal_dual(x, z[keep], w[keep], tol, max_iter, eta)
        if sparse and lower > 0 and value <= lower * (1.0 + tol):
            lam, it2 = _prune_and_polish(x, z[keep], w[keep], lam, lower, tol, max_iter, eta)
            it += it2
        method = "primal-dual"
    lam = np.where(lam > prune * lam.max(), lam, 0.0)
    lam /= lam.sum()
    value = design_value(x, lam, z, w)
    lower = min(lower, value)
    converged = bool(value <= lower * (1.0 + tol) * (1.0 + 1e-9))
    if not converged:
        gap = value / lower - 1.0 if lower > 0 else math.inf
        warnings.warn(
            f"optimal_design: stopped at the iteration cap (max_iter={max_iter}, {method} route) with a certified "
            f"relative gap of {gap:.3g} > tol={tol:g}; the design is usable but not certified to tol "
            "(raise max_iter or tol)", DesignWarning, stacklevel=2)
    return DesignResult(lam, value, lower, it, method, converged)


def _kumar_yildirim_start(x: np.ndarray) -> np.ndarray:
    """Indices of at most ``2k`` arms spanning ``R^k`` (Kumar & Yildirim 2005): for ``k``
    directions, each orthogonal to the differences of the arms chosen so far, the arms of
    largest and smallest projection (deterministic: the directions come from a fixed seed)."""
    k = x.shape[1]
    rng = np.random.default_rng(0)
    chosen: list[int] = []
    basis = np.zeros((k, 0))
    for _ in range(k):
        b = rng.standard_normal(k)
        if basis.shape[1]:
            b -= basis @ (basis.T @ b)
        p = x @ b
        hi, lo = int(np.argmax(p)), int(np.argmin(p))
        chosen += [hi, lo]
        diff = x[hi] - x[lo]
        diff -= basis @ (basis.T @ diff)
        nd = np.linalg.norm(diff)
        if nd > 1e-12 * (1 + np.abs(x).max()):
            basis = np.column_stack([basis, diff / nd])
    return np.unique(chosen)


def _d_optimal(x: np.ndarray, tol: float, max_iter: int):
    """Wolfe-Atwood (Frank-Wolfe with away steps) for ``max log det A(lambda)`` (== G-optimal,
    Kiefer-Wolfowitz), following Todd & Yildirim (2007).

    Start: uniform on the Kumar-Yildirim arms (uniform on all arms if they do not span).
    With ``g_a = a^T A^-1 a`` (``sum_a lambda_a g_a = k``), each step either moves mass towards
    ``a = argmax g`` (Fedorov-Wynn, ``gamma = (g_a / k - 1) / (g_a - 1)``) or, when the support arm
    ``j = argmin_{lambda_j > 0} g_j`` is further from ``k``, away from ``j`` (exact step
    ``s = (k - g_j) / (g_j (k - 1))`` on ``A' = (A - s x_j x_j^T) / (1 - s)``, capped at
    ``lambda_j``: a *drop step* that removes ``j`` from the support). Stops once
    ``max g <= k (1 + tol)`` (the certificate) and ``min_{support} g >= k (1 - tol)`` (every
    support arm is nearly active, so weights the optimum does not need are gone).
    """
    n, k = x.shape
    if k == 1:  # one dimension: all weight on the longest arm (first on ties)
        lam = np.zeros(n)
        lam[int(np.argmax(np.abs(x[:, 0])))] = 1.0
        return lam, 1.0, 1.0, 0
    lam = np.zeros(n)
    lam[_kumar_yildirim_start(x)] = 1.0
    lam /= lam.sum()
    amat = x.T @ (lam[:, None] * x)
    if np.linalg.matrix_rank(amat) < k:
        lam = np.full(n, 1.0 / n)
        amat = x.T @ (lam[:, None] * x)
    ainv = _inv_pd(amat)
    g = ((x @ ainv) * x).sum(1)
    it = 0
    while it < 20 * max_iter:
        a = int(np.argmax(g))
        gmax = float(g[a])
        supp = np.flatnonzero(lam > 0)
        j = int(supp[np.argmin(g[supp])])
        gmin = float(g[j])
        if gmax <= k * (1 + tol) and gmin >= k * (1 - tol):
            break
        it += 1
        if gmax - k >= k - gmin or lam[j] >= 1.0:  # toward a (Fedorov-Wynn step)
            gamma = (gmax / k - 1.0) / (gmax - 1.0)
            c = gamma / (1.0 - gamma)
            v = ainv @ x[a]
            u = x @ v  # [n] x^T A^-1 a
            g = (g - c * u**2 / (1.0 + c * gmax)) / (1.0 - gamma)
            ainv = (ainv - c * np.outer(v, v) / (1.0 + c * gmax)) / (1.0 - gamma)
            lam *= 1.0 - gamma
            lam[a] += gamma
        else:  # away from j: A' = (A - s x_j x_j^T) / (1 - s), lambda' = (lambda - s e_j) / (1 - s)
            s = (k - gmin) / (gmin * (k - 1.0)) if gmin > 0 else math.inf
            drop = s >= lam[j]
            if drop:
                s = float(lam[j])
            v = ainv @ x[j]
            u = x @ v
            den = 1.0 - s * gmin
            if den <= 1e-12:  # x_j alone carries a direction: cannot leave (round-off guard)
                break
            g = (g + s * u**2 / den) * (1.0 - s)
            ainv = (ainv + s * np.outer(v, v) / den) * (1.0 - s)
            lam[j] -= s
            lam /= 1.0 - s
            if drop:
                lam[j] = 0.0
            np.maximum(lam, 0.0, out=lam)
        if it % 200 == 0:  # refresh against round-off drift
            ainv = _inv_pd(x.T @ (lam[:, None] * x))
            g = ((x @ ainv) * x).sum(1)
    lam = lam / lam.sum()
    ainv = _inv_pd(x.T @ (lam[:, None] * x))
    value = float(((x @ ainv) * x).sum(1).max())
    return lam, value, float(k), it


def _prune_and_polish(x, z, w, lam, lower, tol, max_iter, eta):
    """Sparsify a certified primal-dual design: for relative weight thresholds from 0.3 down to
    1e-4, re-solve on the arms at or above the threshold only, and return the first (sparsest)
    design whose value over all targets is within ``tol`` of ``lower`` (a lower bound for the
    unrestricted problem, so the certificate is unchanged). Returns ``(lambda, iterations)``;
    ``lambda`` unchanged when no threshold gives a smaller support.
    """
    n = lam.size
    top = lam.max()
    base = int((lam > 1e-9 * top).sum())
    its = 0
    for th in (0.3, 0.1, 0.03, 0.01, 3e-3, 1e-3, 1e-4):
        sub = np.flatnonzero(lam >= th * top)
        if sub.size >= base:
            break
        if np.linalg.matrix_rank(x[sub]) < np.linalg.matrix_rank(np.vstack([x[sub], z])):
            continue  # some target is outside the span of these arms
        ls, _, _, it = _primal_dual(x[sub], z, w, tol / 4.0, max_iter, eta)
        its += it
        full = np.zeros(n)
        full[sub] = ls
        full = np.where(full > 1e-9 * full.max(), full, 0.0)
        full /= full.sum()
        if design_value(x, full, z, w) <= lower * (1.0 + tol):
            return full, its
    return lam, its


def _primal_dual(x: np.ndarray, z: np.ndarray, w: np.ndarray, tol: float, max_iter: int, eta: float):
    """Multiplicative primal-dual iterations for ``min_lambda max_{x in T} w_x g_x(lambda)``.

    The problem is the saddle point ``min_lambda max_{mu in simplex(T)} sum_x mu_x w_x g_x(lambda)``.
    Each iteration (1) moves the target weights by exponentiated gradient,
    ``mu_x <- mu_x exp(eta (h_x / max h - 1))`` with ``h_x = w_x g_x``, and (2) moves the design
    by the multiplicative algorithm of the L-criterion ``tr(A^-1 C_mu)``,
    ``C_mu = sum_x mu_x w_x x x^T``: ``lambda_a <- lambda_a s_a`` with
    ``s_a = a^T A^-1 C_mu A^-1 a / tr(C_mu A^-1)`` (``sum_a lambda_a s_a = 1``; ``s_a = 1`` on the
    support at the optimum: the equivalence theorem). Certificate: for any ``mu``,
    ``min_lambda max_x h_x >= min_lambda tr(A^-1 C_mu) >= tr(A^-1 C_mu) (2 - max_a s_a)`` (the
    Frank-Wolfe gap of the convex L-criterion), so we stop once the best design's value is
    within ``tol`` of the best lower bound. The bound is taken at the current ``mu`` and at the
    running average of the ``mu`` iterates (which converges to the optimal target weights where
    the iterates oscillate; issue 16: on the driving problems it cut uncertified gaps of 0.25 to
    0.08).
    """
    n, k = x.shape
    m = z.shape[0]
    lam = np.full(n, 1.0 / n)
    mu = np.full(m, 1.0 / m)
    mu_sum = np.zeros(m)
    best_val, best_lam, lower = math.inf, lam, 0.0
    it = 0
    while it < max_iter:
        it += 1
        amat = x.T @ (lam[:, None] * x)
        # a relative ridge of 1e-10 keeps A invertible when weights of arms the targets do not
        # need reach zero (e.g. fewer arms than dimensions); it changes values by ~1e-10
        ainv = _inv_pd(amat + 1e-10 * np.trace(amat) / k * np.eye(k))
        b = z @ ainv  # [m, k]
        g = np.einsum("ij,ij->i", b, z)
        h = w * g
        hmax = float(h.max())
        if hmax < best_val:
            best_val, best_lam = hmax, lam
        c = mu * w
        phi = float(c @ g)  # tr(C_mu A^-1)
        s = np.maximum(((x @ (b.T @ (c[:, None] * b))) * x).sum(1) / phi, 0.0)  # [n]
        if not (np.isfinite(phi) and np.all(np.isfinite(s))):
            break
        lower = max(lower, phi * (2.0 - float(s.max())))
        mu_sum += mu
        if it > 1 and best_val > lower * (1.0 + tol):  # the bound at the averaged target weights
            cb = mu_sum * w / mu_sum.sum()
            phib = float(cb @ g)
            sb = ((x @ (b.T @ (cb[:, None] * b))) * x).sum(1) / phib
            if np.isfinite(phib) and np.all(np.isfinite(sb)):
                lower = max(lower, phib * (2.0 - float(sb.max())))
        if best_val <= lower * (1.0 + tol):
            break
        mu = mu * np.exp(eta * (h / hmax - 1.0))
        mu /= mu.sum()
        lam = lam * s
        lam /= lam.sum()
    return best_lam, best_val, lower, it


def rounding_min_samples(support: int, epsilon: float) -> int:
    """``r(epsilon)`` of Algorithm 1 for efficient rounding: ``ceil((1 + epsilon) p / epsilon)``.

    Efficient rounding gives every support point ``n_i >= (N - p) lambda_i`` pulls (checked in
    the tests), so ``sum_i n_i x_i x_i^T >= (N - p) A(lambda)`` and
    ``||x||^2_{(sum n x x^T)^-1} <= N / (N - p) * ||x||^2_{A(lambda)^-1} / N``: the rounding is
    ``epsilon``-approximate (``N / (N - p) <= 1 + epsilon``) once ``N >= (1 + epsilon) p / epsilon``.
    """
    return math.ceil((1.0 + epsilon) * support / epsilon)


def round_design(weights, n_samples: int) -> np.ndarray:
    """Efficient rounding (Pukelsheim & Rieder 1992) of a design into ``n_samples`` pulls.

    Start from ``n_i = ceil((N - p/2) lambda_i)`` on the ``p`` support points, then, while the
    total is below ``N``, add a pull where ``n_j / lambda_j`` is smallest, and while above,
    remove one where ``(n_k - 1) / lambda_k`` is largest. When ``N < p`` (fewer pulls than support
    points, e.g. the first round of Uniform on many arms) the start is clipped at zero and the
    same loop fills the pulls (the paper is silent on this case).

    Args:
        weights: ``[n]`` a design (non-negative, positive sum; normalised here).
        n_samples: ``N >= 1``.

    Returns:
        ``[n]`` int counts summing to ``N`` (zero off the support).
    """
    lam = np.asarray(weights, dtype=float)
    if lam.ndim != 1 or lam.size == 0 or np.any(~np.isfinite(lam)) or np.any(lam < 0) or lam.sum() <= 0:
        raise ValueError("weights: expected a non-empty 1-d array of non-negative numbers with a positive sum")
    n_samples = int(n_samples)
    if n_samples < 1:
        raise ValueError(f"n_samples: expected an int >= 1, got {n_samples}")
    lam = lam / lam.sum()
    support = np.flatnonzero(lam > 0)
    p = support.size
    wts = lam[support]
    counts = np.maximum(np.ceil((n_samples - p / 2.0) * wts), 0.0).astype(np.int64)
    total = int(counts.sum())
    # the loop moves one pull at a time; the discrepancy is at most about p/2
    while total < n_samples:
        j = int(np.argmin(counts / wts))
        counts[j] += 1
        total += 1
    while total > n_samples:
        ratio = np.where(counts > 0, (counts - 1) / wts, -np.inf)
        j = int(np.argmax(ratio))
        counts[j] -= 1
        total -= 1
    out = np.zeros(lam.size, dtype=np.int64)
    out[support] = counts
    return out
