"""Constrained linear best-arm identification (CBAI) problems: Lindner et al. (2022), section 3.

A CBAI problem ``nu = (X, theta, phi, tau)`` (Definition 1): arms ``X`` (``[n, d]``), a known
reward parameter ``theta`` (``[d]``), an unknown constraint parameter ``phi`` (``[d]``) and a
threshold ``tau``; arm ``x`` is feasible iff ``phi^T x <= tau``; the goal is
``x* = argmax_{x feasible} theta^T x``. Querying arm ``x`` returns

* ``feedback="gaussian"``: ``phi^T x + eta`` with ``eta ~ N(0, noise_sd^2)`` (section 4: sd 0.05);
* ``feedback="binary"``: ``y in {0, 1}`` with ``P(y = 1) = (phi^T x + 1) / 2`` (appendix C.2;
  requires ``phi^T x in [-1, 1]``). ``y = 1`` reads "the constraint is violated"; the learners
  use ``2 y - 1``, whose mean is ``phi^T x``.

Instances (section 4): ``irrelevant_dimensions``, ``unit_sphere``, ``connected_1d``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "CBAIProblem",
    "check_arms",
    "check_delta",
    "check_theta",
    "connected_1d",
    "irrelevant_dimensions",
    "unit_sphere",
]

FEEDBACKS = ("gaussian", "binary")


def check_arms(arms, name: str = "arms") -> np.ndarray:
    """``[n, d]`` float array of distinct, finite arms; raise ValueError naming ``name`` otherwise."""
    try:
        x = np.array(arms, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: expected an [n, d] array of numbers, got {type(arms).__name__}") from exc
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-d [n, d] array, got shape {list(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one arm, got none (shape {list(x.shape)})")
    if x.shape[1] == 0:
        raise ValueError(f"{name}: expected at least one feature, got shape {list(x.shape)}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: expected finite values, found {int((~np.isfinite(x)).sum())} NaN or inf")
    uniq, first, counts = np.unique(x, axis=0, return_index=True, return_counts=True)
    if uniq.shape[0] != x.shape[0]:
        dup = int(np.flatnonzero((x == uniq[np.argmax(counts)]).all(1))[1])
        raise ValueError(
            f"{name}: expected distinct arms, but arm {dup} duplicates arm {int(first[np.argmax(counts)])} "
            f"({int((counts > 1).sum())} duplicated feature vectors); remove duplicates first")
    return x


def check_theta(theta, d: int, name: str = "theta") -> np.ndarray:
    """``[d]`` finite float vector; raise ValueError naming ``name`` if its width is not ``d``."""
    try:
        t = np.array(theta, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: expected a vector of numbers, got {type(theta).__name__}") from exc
    if t.ndim != 1 or t.shape[0] != d:
        raise ValueError(f"{name}: expected a vector of width {d} (the arms' feature dimension), got shape {list(t.shape)}")
    if not np.all(np.isfinite(t)):
        raise ValueError(f"{name}: expected finite values")
    return t


def check_delta(delta, name: str = "delta") -> float:
    v = float(delta)
    if not (math.isfinite(v) and 0.0 < v < 1.0):
        raise ValueError(f"{name}: expected a significance level in (0, 1), got {delta!r}")
    return v


@dataclass
class CBAIProblem:
    """A CBAI instance with a simulated response (Definition 1 of Lindner et al. 2022).

    Args:
        arms: ``[n, d]`` distinct arms.
        theta: ``[d]`` the known reward parameter.
        phi: ``[d]`` the constraint parameter (hidden from the learners).
        tau: the threshold: ``x`` is feasible iff ``phi^T x <= tau``.
        noise_sd: the sd of the Gaussian observation noise (ignored for binary feedback).
        feedback: ``"gaussian"`` or ``"binary"`` (see module docstring).
        name: a label for reports.
    """

    arms: np.ndarray
    theta: np.ndarray
    phi: np.ndarray
    tau: float = 0.0
    noise_sd: float = 0.05
    feedback: str = "gaussian"
    name: str = "cbai"
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.arms = check_arms(self.arms)
        d = self.arms.shape[1]
        self.theta = check_theta(self.theta, d, "theta")
        self.phi = check_theta(self.phi, d, "phi")
        self.tau = float(self.tau)
        if not math.isfinite(self.tau):
            raise ValueError(f"tau: expected a finite threshold, got {self.tau!r}")
        if self.feedback not in FEEDBACKS:
            raise ValueError(f"feedback: expected one of {FEEDBACKS}, got {self.feedback!r}")
        self.noise_sd = float(self.noise_sd)
        if not (math.isfinite(self.noise_sd) and self.noise_sd >= 0):
            raise ValueError(f"noise_sd: expected a finite number >= 0, got {self.noise_sd!r}")
        if self.feedback == "binary":
            c = self.constraint_values
            if np.any(np.abs(c) > 1 + 1e-12):
                raise ValueError(
                    "phi: binary feedback needs phi^T x in [-1, 1] for every arm "
                    f"(P(y = 1) = (phi^T x + 1) / 2), found values in [{c.min():.3g}, {c.max():.3g}]; normalise the arms")

    @property
    def n_arms(self) -> int:
        return self.arms.shape[0]

    @property
    def dim(self) -> int:
        return self.arms.shape[1]

    @property
    def constraint_values(self) -> np.ndarray:
        """``[n]`` ``phi^T x`` of every arm."""
        return self.arms @ self.phi

    @property
    def rewards(self) -> np.ndarray:
        """``[n]`` ``theta^T x`` of every arm."""
        return self.arms @ self.theta

    @property
    def feasible(self) -> np.ndarray:
        """``[n]`` bool: ``phi^T x <= tau``."""
        return self.constraint_values <= self.tau

    @property
    def optimal_arms(self) -> np.ndarray:
        """Indices of the constrained optimal arms (ties included; empty if nothing is feasible)."""
        f = self.feasible
        if not f.any():
            return np.zeros(0, dtype=int)
        r = self.rewards
        best = r[f].max()
        return np.flatnonzero(f & (r >= best - 1e-12 * (1 + abs(best))))

    @property
    def c_min(self) -> float:
        """``C+_min = min_x |phi^T x - tau|`` (Proposition 1)."""
        return float(np.abs(self.constraint_values - self.tau).min())

    def is_correct(self, recommendation) -> bool:
        """Whether ``recommendation`` (an arm index or None) is a constrained optimal arm."""
        opt = self.optimal_arms
        if recommendation is None:
            return opt.size == 0
        return bool(np.isin(int(recommendation), opt))

    def mean_response(self) -> np.ndarray:
        """``[n]`` the mean of an observation on the scale the learners use (``phi^T x``)."""
        return self.constraint_values

    def sample(self, arm: int, rng: np.random.Generator):
        """One observation of ``arm`` (a float, or an int in {0, 1} for binary feedback)."""
        c = float(self.arms[arm] @ self.phi)
        if self.feedback == "binary":
            return int(rng.random() < (c + 1.0) / 2.0)
        return c + self.noise_sd * float(rng.standard_normal())

    def sample_sums(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``[n]`` the sum of ``counts[i]`` independent observations of each arm, on the learners' scale.

        Exact in distribution: a sum of ``k`` ``N(c, s^2)`` draws is ``N(k c, k s^2)``; a sum of
        ``k`` ``2 y - 1`` with ``y ~ Bernoulli(p)`` is ``2 Binomial(k, p) - k``. Round-based
        learners only use these sums, so a round of ``10^7`` pulls costs ``O(n)``.
        """
        counts = np.asarray(counts, dtype=np.int64)
        c = self.constraint_values
        if self.feedback == "binary":
            p = np.clip((c + 1.0) / 2.0, 0.0, 1.0)
            return 2.0 * rng.binomial(counts, p) - counts
        return counts * c + self.noise_sd * np.sqrt(counts) * rng.standard_normal(counts.shape)


def irrelevant_dimensions(d: int = 10, epsilon: float = 0.05, noise_sd: float = 0.05) -> CBAIProblem:
    """Instance 1 of section 4.1: ``d + 1`` arms ``e_1 .. e_{d-1}, (1 - eps) e_d, (1 + eps) e_d``.

    ``theta = phi = e_d``, ``tau = 1``: ``e_1 .. e_{d-1}`` are feasible but sub-optimal,
    ``(1 - eps) e_d`` is optimal and ``(1 + eps) e_d`` infeasible.
    """
    d = int(d)
    if d < 1:
        raise ValueError(f"d: expected an int >= 1, got {d}")
    if not (0 < epsilon < 1):
        raise ValueError(f"epsilon: expected a value in (0, 1), got {epsilon!r}")
    arms = np.zeros((d + 1, d))
    arms[: d - 1, : d - 1] = np.eye(d - 1)
    arms[d - 1, d - 1] = 1.0 - epsilon
    arms[d, d - 1] = 1.0 + epsilon
    e = np.zeros(d)
    e[-1] = 1.0
    return CBAIProblem(arms, e, e.copy(), tau=1.0, noise_sd=noise_sd, name=f"irrelevant-dimensions(d={d}, eps={epsilon})",
                       info={"d": d, "epsilon": epsilon})


def _sphere(rng: np.random.Generator, shape) -> np.ndarray:
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def unit_sphere(n: int = 30, d: int = 30, seed: int = 0, noise_sd: float = 0.05) -> CBAIProblem:
    """Instance 2 of section 4.1: ``n`` arms and ``theta`` uniform on the unit sphere of ``R^d``,
    ``phi = x_i - x_j`` for the two closest arms (l2), ``tau = 0``.

    The paper does not state ``tau`` for this instance; section 3 takes ``tau = 0`` w.l.o.g., and
    ``tau = 0`` puts the two closest arms on opposite sides of the boundary (``phi^T x_i > 0 >
    phi^T x_j``), which is what makes the instance hard.
    """
    n, d = int(n), int(d)
    if n < 2 or d < 1:
        raise ValueError(f"n, d: expected n >= 2 and d >= 1, got n={n}, d={d}")
    rng = np.random.default_rng(seed)
    arms = _sphere(rng, (n, d))
    theta = _sphere(rng, (d,))
    dist = np.linalg.norm(arms[:, None, :] - arms[None, :, :], axis=-1)
    dist[np.diag_indices(n)] = np.inf
    i, j = np.unravel_index(int(np.argmin(dist)), dist.shape)
    phi = arms[i] - arms[j]
    return CBAIProblem(arms, theta, phi, tau=0.0, noise_sd=noise_sd, name=f"unit-sphere(n={n}, d={d}, seed={seed})",
                       info={"n": n, "d": d, "seed": seed})


CONNECTED_GRIDS = ("authors", "linspace")


def connected_1d(n: int = 10, tau: float = 0.25, noise_sd: float = 0.05, *, grid: str = "authors") -> CBAIProblem:
    """Section 4.2 (Figure 3): ``n`` arms in ``[0, 1]`` (``d = 1``), ``theta = phi = 1``, ``tau = 0.25``.

    The paper says "10 arms ... equally spaced between 0 and 1", which fits two grids (issue 16,
    item 6):

    * ``grid="authors"`` (default): ``1/n, 2/n, ..., 1`` (0.1, ..., 1.0), the authors'
      ``get_toy_instance_5``, the instance behind Figure 3 (``C_min = 0.05``);
    * ``grid="linspace"``: ``linspace(0, 1, n)``, which includes a zero arm (certified
      feasible at once, carrying no information) and puts the closest arm 0.028 from the
      boundary (``C_min = 0.028`` for ``n = 10``): 2x (G-ACOL) to 3.4x (Max Rew-U) the queries
      (docs/reports/acol-synthetic).

    The feasible set (arms ``<= 0.25``) is connected, so the regret-minimising baselines Max Rew-F
    and Max Rew-U can work here.
    """
    if grid not in CONNECTED_GRIDS:
        raise ValueError(f"grid: expected one of {CONNECTED_GRIDS}, got {grid!r}")
    n = int(n)
    if n < 2:
        raise ValueError(f"n: expected an int >= 2, got {n}")
    x = np.arange(1, n + 1) / n if grid == "authors" else np.linspace(0.0, 1.0, n)
    return CBAIProblem(x[:, None], np.ones(1), np.ones(1), tau=tau, noise_sd=noise_sd,
                       name=f"connected-1d(n={n}, tau={tau}, grid={grid})", info={"n": n, "grid": grid})
