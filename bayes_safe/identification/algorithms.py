"""Learners for constrained linear best-arm identification: Lindner et al. (2022), sections 3.3-3.4.

Every learner keeps confidence intervals ``[l(x), u(x)]`` on ``phi^T x`` for every arm and three
disjoint sets of arm indices, updated after each observation (greedy learners) or each round
(round-based learners), as in Algorithm 1 lines 16-18 and Algorithm 2 lines 9-11:

* ``F`` (``feasible``): certified feasible (``u(x) <= tau``);
* ``infeasible``: certified infeasible (``l(x) > tau``);
* ``U`` (``uncertain``): neither, and with reward above
  ``r = max_{x in F} theta^T x`` (Section 3.3's definition of ``U_t``; an arm tying ``r`` is
  dropped, since the recommendation already attains its reward).

The learner stops when ``U`` is empty and recommends ``argmax_{x in F} theta^T x`` (``None`` if
``F`` is empty, which happens only when no arm is feasible). Classification is final: an arm
leaves ``U`` once and is never re-classified (the paper's ``U_t`` only shrinks; ``F_t`` in the
paper also absorbs arms outside ``U_t`` whose upper bound drops below ``tau``, which cannot
change ``r`` except for an arm already certified infeasible, a contradiction of probability
``<= delta`` that we do not act on).

Step interface (a person answers the queries):

```python
learner = GACOL(arms, theta, tau=1.0, beta=0.25, feedback="binary")
while not learner.done:
    arm = learner.next_query()
    learner.observe(arm, ask_person(arm))      # 1 = "violates", 0 = "fine"
best = learner.recommendation
```

Round-based learners (``ACOL``, ``GAllocation``, ``Uniform``, ``Oracle``;
Algorithms 1 and 3) use Proposition 2 intervals from a fresh regression on each round's data;
greedy learners (``Greedy`` and its named forms, Algorithm 2) use one regression on all
data with Proposition 3 intervals (``beta="theory"``) or a tuned ``beta``.

Constants where the paper is silent follow the authors' public implementation (issue 7):

* round-based: ``delta_t = delta^2 / (t^2 |X|)``, ``beta_t = R sqrt(2 log(1 / delta_t))``
  (Proposition 2 with the union bound over arms inside ``delta_t``), ridge 0.01 on each
  round's regression, Pukelsheim's efficient rounding, round length ``ceil(2^t log(1/delta_t))``
  for Oracle, G-Allocation and Uniform (Algorithm 3 with ``v = 2``); ACOL's round length is
  ``ceil(2^(2t+3) R^2 log(1/delta_t) (1 + eps) rho_t)``, with two conventions (issue 16, item 1):
  ``round_length="paper"`` (default) takes Algorithm 1's ``rho_t``, the *squared* norm
  ``min_lambda max_{x in U_t} ||x||^2_{A^-1}`` (line 8, the quantity Theorem 2's proof needs),
  ``eps = 0.1`` and the minimum ``r(eps)`` (line 9); ``round_length="authors"`` takes the
  authors' implementation's *unsquared* ``max_{x in U_t} ||x||_{A^-1}``, ``eps = 0.01`` and no
  minimum, which is what reproduces Figure 2 (ACOL's queries barely grow with irrelevant
  dimensions);
* greedy: the arm to query (issue 16, item 2): ``rule="max_var"`` is Algorithm 2 line 4 as
  printed (``argmax_{x in pool} ||x||^2_{A^-1}``); ``rule="max_var_reduction"`` is the authors'
  implementation and section 3.4's prose ("the arm that reduces uncertainty within U_t the
  most"): take that most uncertain arm ``x_u`` of the pool, then query, among *all* arms, the
  one whose rank-one update most reduces ``||x_u||^2_{A^-1}``;
* greedy: ridge 0.1 with rank-one (Sherman-Morrison) updates; tuned intervals are
  ``phi_hat^T x +- sqrt(beta) ||x||_{A^-1}``, so the paper's tuned ``beta_t = 1/4`` is a
  confidence multiplier of 0.5 (the implementation's constant);
* ``R`` (``noise_scale``), the sub-Gaussian scale of the noise, is 1 by default, the paper's
  convention (it holds for Gaussian noise of sd 0.05 and for binary feedback in {-1, 1});
* Proposition 3: ``beta_t = R sqrt(d log((1 + t L^2 / ridge) / delta)) + sqrt(ridge) S`` with
  ``L = max ||x||`` (computed from the arms) and ``S >= ||phi||`` (``phi_norm_bound``, default 1;
  the studies pass the true ``||phi||``).

Shapes: ``arms`` ``[n, d]``, ``theta`` ``[d]``; arm indices are ints in ``[0, n)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .design import optimal_design, round_design, rounding_min_samples
from .problems import CBAIProblem, check_arms, check_delta, check_theta

__all__ = [
    "ACOL",
    "ALGORITHMS",
    "CONVENTIONS",
    "GACOL",
    "TUNED_BETA",
    "ConstraintLearner",
    "GAllocation",
    "Greedy",
    "IdentificationResult",
    "Oracle",
    "RoundBased",
    "Uniform",
    "convention_options",
    "make_learner",
    "simulate",
    "simulate_greedy_batch",
]

#: the paper's tuned beta_t (section 4.1), i.e. a confidence multiplier sqrt(1/4) = 0.5
TUNED_BETA = 0.25

#: where the paper's text and the authors' code differ (issue 16): ``"paper"`` follows the
#: printed algorithms, ``"authors"`` the public implementation (see ``make_learner``)
CONVENTIONS = ("paper", "authors")


@dataclass
class IdentificationResult:
    """What a learner ended with.

    Attributes:
        recommendation: the recommended arm index (``None`` if nothing was certified feasible).
        queries: the number of observations used.
        finished: whether ``U`` became empty (``False``: stopped by the query budget).
        correct: whether the recommendation is a constrained optimal arm (``None`` if unknown).
        rounds: rounds completed (round-based learners; 0 for greedy learners).
    """

    recommendation: int | None
    queries: int
    finished: bool
    correct: bool | None = None
    rounds: int = 0
    extra: dict = field(default_factory=dict)


class ConstraintLearner:
    """Common state and the step interface of every learner (see the module docstring).

    Args:
        arms: ``[n, d]`` distinct arms (the candidate controllers, recipes, ...).
        theta: ``[d]`` the known reward parameter.
        tau: the known threshold (``x`` feasible iff ``phi^T x <= tau``).
        delta: the significance (``0 < delta < 1``; the paper uses 0.05).
        feedback: ``"gaussian"`` (a real number per query) or ``"binary"`` (0 or 1, mapped to
            ``2 y - 1``).
        noise_scale: ``R``, the sub-Gaussian scale assumed by the confidence intervals.
        seed: seeds the learner's own randomness (random choices, the order of a round's pulls).
    """

    name = "learner"

    def __init__(self, arms, theta, tau: float = 0.0, *, delta: float = 0.05, feedback: str = "gaussian",
                 noise_scale: float = 1.0, seed: int | None = 0):
        self.arms = check_arms(arms)
        self.n, self.d = self.arms.shape
        self.theta = check_theta(theta, self.d)
        self.tau = float(tau)
        if not math.isfinite(self.tau):
            raise ValueError(f"tau: expected a finite threshold, got {tau!r}")
        self.delta = check_delta(delta)
        if feedback not in ("gaussian", "binary"):
            raise ValueError(f"feedback: expected 'gaussian' or 'binary', got {feedback!r}")
        self.feedback = feedback
        self.noise_scale = float(noise_scale)
        if not (math.isfinite(self.noise_scale) and self.noise_scale > 0):
            raise ValueError(f"noise_scale: expected a finite number > 0, got {noise_scale!r}")
        self.rng = np.random.default_rng(seed)
        self.rewards = self.arms @ self.theta  # [n]
        self._u = np.ones(self.n, dtype=bool)  # U
        self._f = np.zeros(self.n, dtype=bool)  # F
        self._inf = np.zeros(self.n, dtype=bool)  # certified infeasible
        self.lower = np.full(self.n, -np.inf)  # [n] current l(x)
        self.upper = np.full(self.n, np.inf)  # [n] current u(x)
        self.num_queries = 0

    # ------------------------------------------------------------------ sets and the answer
    @property
    def uncertain(self) -> np.ndarray:
        """Indices of ``U_t``."""
        return np.flatnonzero(self._u)

    @property
    def feasible(self) -> np.ndarray:
        """Indices of ``F_t`` (certified feasible)."""
        return np.flatnonzero(self._f)

    @property
    def infeasible(self) -> np.ndarray:
        """Indices of the arms certified infeasible."""
        return np.flatnonzero(self._inf)

    @property
    def done(self) -> bool:
        """``U_t`` is empty: the recommendation is optimal with probability ``>= 1 - delta``."""
        return not self._u.any()

    @property
    def recommendation(self) -> int | None:
        """``argmax_{x in F_t} theta^T x`` (first index on ties), ``None`` while ``F_t`` is empty.

        Available at any time (the anytime rule of section 3.4); optimal w.h.p. once ``done``.
        """
        if not self._f.any():
            return None
        idx = np.flatnonzero(self._f)
        return int(idx[np.argmax(self.rewards[idx])])

    def _classify(self, lower: np.ndarray, upper: np.ndarray) -> None:
        """Algorithm 1 lines 16-18 / Algorithm 2 lines 9-11 with the new bounds ``[n]``."""
        self.lower, self.upper = lower, upper
        u = self._u
        new_f = u & (upper <= self.tau)
        new_inf = u & (lower > self.tau) & ~new_f
        self._f |= new_f
        self._inf |= new_inf
        u &= ~(new_f | new_inf)
        if self._f.any():
            r = self.rewards[self._f].max()
            u &= self.rewards > r
        self._u = u

    def _response(self, y) -> float:
        """Validate one answer and put it on the ``phi^T x`` scale."""
        if self.feedback == "binary":
            if isinstance(y, (bool, np.bool_)):
                y = int(y)
            try:
                yf = float(y)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"y: expected binary feedback 0 or 1, got {y!r}") from exc
            if yf not in (0.0, 1.0):
                raise ValueError(f"y: expected binary feedback 0 or 1 (1 = constraint violated), got {y!r}")
            return 2.0 * yf - 1.0
        try:
            yf = float(y)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"y: expected a real-valued observation, got {y!r}") from exc
        if not math.isfinite(yf):
            raise ValueError(f"y: expected a finite observation, got {y!r}")
        return yf

    def _check_arm(self, arm) -> int:
        try:
            i = int(arm)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"arm: expected an arm index, got {arm!r}") from exc
        if i != arm or not 0 <= i < self.n:
            raise ValueError(f"arm: expected an index in [0, {self.n}), got {arm!r}")
        return i

    # ------------------------------------------------------------------ step interface
    def next_query(self) -> int:
        """The arm to query next (raises RuntimeError once ``done``)."""
        raise NotImplementedError

    def observe(self, arm: int, y) -> None:
        """Record the answer ``y`` for ``arm`` and update the intervals and sets."""
        raise NotImplementedError

    def run(self, respond: Callable[[int], float], max_queries: int | None = None) -> IdentificationResult:
        """Ask ``respond(arm)`` until ``U`` is empty or ``max_queries`` answers were used."""
        while not self.done and (max_queries is None or self.num_queries < max_queries):
            arm = self.next_query()
            self.observe(arm, respond(arm))
        return self.result()

    def result(self, problem: CBAIProblem | None = None) -> IdentificationResult:
        rec = self.recommendation
        correct = None if problem is None else (self.done and problem.is_correct(rec))
        return IdentificationResult(rec, self.num_queries, self.done, correct, getattr(self, "round", 0))

    def _after_done_error(self):
        raise RuntimeError(f"{self.name}: U is empty, nothing left to query; read .recommendation")


# ====================================================================== round-based (static)
class RoundBased(ConstraintLearner):
    """Algorithm 3 (and Algorithm 1 through ``ACOL``): rounds of a static allocation.

    Each round ``t`` pulls the rounded allocation, fits a fresh ridge regression (ridge 0.01)
    on that round's data only, and sets ``l, u = phi_hat^T x -+ beta_t ||x||_{A^-1}`` with
    Proposition 2's ``beta_t = R sqrt(2 log(1/delta_t))``, ``delta_t = delta^2 / (t^2 |X|)``.
    Within a round the pulls come in a random order (seeded); for the step interface
    ``observe`` must receive the arm ``next_query`` gave.
    """

    ridge = 0.01
    growth = 2.0  # v of Algorithm 3

    def __init__(self, arms, theta, tau: float = 0.0, **kwargs):
        super().__init__(arms, theta, tau, **kwargs)
        self.round = 0
        self._plan: np.ndarray | None = None  # [N] arm order of the current round
        self._pos = 0
        self._counts = np.zeros(self.n, dtype=np.int64)
        self._sums = np.zeros(self.n)
        self.round_lengths: list[int] = []
        self.design_values: list[float] = []

    # subclasses: the allocation of round t and its length
    def allocation(self, t: int) -> np.ndarray:
        raise NotImplementedError

    def delta_t(self, t: int) -> float:
        return self.delta**2 / (t**2 * self.n)

    def round_length(self, t: int) -> int:
        return math.ceil(self.growth**t * math.log(1.0 / self.delta_t(t)))

    def beta_t(self, t: int) -> float:
        return self.noise_scale * math.sqrt(2.0 * math.log(1.0 / self.delta_t(t)))

    def _plan_round(self) -> np.ndarray:
        """Counts ``[n]`` of the next round (and the order of its pulls, built lazily)."""
        t = self.round + 1
        lam = self.allocation(t)
        n_t = self.round_length(t)
        counts = round_design(lam, n_t)
        return counts

    def pending_counts(self) -> np.ndarray:
        """``[n]`` the pulls of the current round (planned now if no round is under way)."""
        if self.done:
            self._after_done_error()
        if self._plan is None:
            counts = self._plan_round()
            self._plan_counts = counts
            self._plan = None if counts.sum() > 50_000_000 else self.rng.permutation(np.repeat(np.arange(self.n), counts))
            self._pos = 0
            if self._plan is None:  # too long to list: pull in index order
                self._plan = np.zeros(0, dtype=np.int64)
        return self._plan_counts

    def next_query(self) -> int:
        if self.done:
            self._after_done_error()
        if self._plan is None:
            self.pending_counts()
        if self._plan.size == 0:
            cum = np.cumsum(self._plan_counts)
            return int(np.searchsorted(cum, self._pos, side="right"))
        return int(self._plan[self._pos])

    def observe(self, arm: int, y) -> None:
        arm = self._check_arm(arm)
        expected = self.next_query()
        if arm != expected:
            raise ValueError(f"arm: this round-based learner asked for arm {expected}, got an answer for arm {arm}")
        self._counts[arm] += 1
        self._sums[arm] += self._response(y)
        self._pos += 1
        self.num_queries += 1
        if self._pos >= int(self._plan_counts.sum()):
            self._finish_round()

    def observe_round(self, sums: np.ndarray) -> None:
        """Feed a whole round at once: ``sums[i]`` is the sum of the ``pending_counts()[i]``
        answers of arm ``i`` on the ``phi^T x`` scale (binary answers as ``2 y - 1``).

        Only the sums enter the round's regression, so this equals feeding the answers one by
        one; ``simulate`` uses it.
        """
        counts = self.pending_counts()
        if self._pos != 0:
            raise RuntimeError("observe_round: part of this round was already observed step by step")
        sums = np.asarray(sums, dtype=float)
        if sums.shape != (self.n,):
            raise ValueError(f"sums: expected shape [{self.n}], got {list(sums.shape)}")
        self._counts = counts.copy()
        self._sums = sums.copy()
        self.num_queries += int(counts.sum())
        self._finish_round()

    def _finish_round(self) -> None:
        t = self.round + 1
        x = self.arms
        c = self._counts.astype(float)
        a = x.T @ (c[:, None] * x) + self.ridge * np.eye(self.d)
        b = x.T @ self._sums
        chol = np.linalg.cholesky(a)
        phi_hat = np.linalg.solve(a, b)
        half = np.linalg.solve(chol, x.T)  # [d, n]: ||x||^2_{A^-1} = column norms
        width = self.beta_t(t) * np.sqrt((half**2).sum(0))
        mean = x @ phi_hat
        self.phi_hat = phi_hat
        self.round = t
        self.round_lengths.append(int(c.sum()))
        self._classify(mean - width, mean + width)
        self._counts = np.zeros(self.n, dtype=np.int64)
        self._sums = np.zeros(self.n)
        self._plan = None
        self._pos = 0


class Uniform(RoundBased):
    """Uniform: every arm with equal weight each round (Table D.2; Algorithm 3, static intervals)."""

    name = "Uniform"

    def allocation(self, t: int) -> np.ndarray:
        return np.full(self.n, 1.0 / self.n)


class GAllocation(RoundBased):
    """G-Allocation (appendix B.2): ``lambda_G = argmin_lambda max_{x in X} ||x||^2_{A^-1}`` every round."""

    name = "G-Allocation"

    def allocation(self, t: int) -> np.ndarray:
        if not hasattr(self, "_lam"):
            res = optimal_design(self.arms)
            self._lam = res.weights
            self.design_values.append(res.value)
        return self._lam


class Oracle(RoundBased):
    """The oracle (appendix B.1): knows ``phi`` and uses
    ``lambda* = argmin_lambda max_{x in X_theta(x*)} ||x||^2_{A^-1} / (phi^T x - tau)^2``.

    ``X_theta(x*)`` is the arms with reward at least the optimal arm's. Not implementable in
    practice; it is the benchmark of Figure 2.

    Args:
        phi: ``[d]`` the true constraint parameter.
    """

    name = "Oracle"

    def __init__(self, arms, theta, tau: float = 0.0, *, phi, **kwargs):
        super().__init__(arms, theta, tau, **kwargs)
        self.phi = check_theta(phi, self.d, "phi")

    def allocation(self, t: int) -> np.ndarray:
        if not hasattr(self, "_lam"):
            c = self.arms @ self.phi - self.tau
            feas = c <= 0
            if feas.any():
                best = self.rewards[feas].max()
                target = self.rewards >= best - 1e-12 * (1 + abs(best))
            else:
                target = np.ones(self.n, dtype=bool)
            gap2 = np.maximum(c[target] ** 2, 1e-300)
            res = optimal_design(self.arms, targets=self.arms[target], target_weights=1.0 / gap2)
            self._lam = res.weights
            self.design_values.append(res.value)
        return self._lam


class ACOL(RoundBased):
    """Adaptive Constraint Learning, Algorithm 1 of Lindner et al. (2022).

    Round ``t``: ``lambda_t = argmin_lambda max_{x in U_t} ||x||^2_{A(lambda)^-1}`` (line 7; designs
    over all arms, targets ``U_t``; ``optimal_design``), then
    ``N_t = ceil(2^(2t+3) R^2 log(1/delta_t) (1 + eps) rho_t)`` pulls by efficient rounding and
    Proposition 2 intervals from this round's data. ``rho_t`` and the minimum length differ
    between the paper and the authors' code (issue 16, item 1):

    * ``round_length="paper"``: ``rho_t = min_lambda max_{x in U_t} ||x||^2_{A^-1}`` (line 8, the
      squared norm Theorem 2's proof uses) and ``N_t >= r(eps)`` (line 9), ``eps = 0.1``;
    * ``round_length="authors"``: ``rho_t = max_{x in U_t} ||x||_{A^-1}`` at the design, the
      unsquared norm the implementation's Frank-Wolfe returns, ``eps = 0.01``, no ``r(eps)``.

    On the irrelevant-dimensions instance (epsilon = 0.05, 10 seeds) the paper's form makes
    ACOL's queries grow 1.56x from d = 5 to d = 40 and the authors' form 1.23x (their code:
    1.24x): only the latter shows section 4.1's "does not increase when adding irrelevant
    dimensions", since the first round's ``rho_1`` is ``d`` (Kiefer-Wolfowitz) squared-form and
    ``sqrt(d)`` unsquared.

    Args:
        round_length: ``"paper"`` (default) or ``"authors"``.
        rounding_epsilon: ``eps`` of the ``eps``-approximate rounding (default 0.1 for the
            paper's form, 0.01 for the authors'). ``r(eps) = ceil((1 + eps) p / eps)`` with ``p``
            the support size, the length from which efficient rounding is ``eps``-approximate
            (see ``rounding_min_samples``); only the paper's form applies it.
        design_tol: relative optimality gap of the design solver.
    """

    name = "ACOL"
    ROUND_LENGTHS = ("paper", "authors")

    def __init__(self, arms, theta, tau: float = 0.0, *, round_length: str = "paper",
                 rounding_epsilon: float | None = None, design_tol: float = 1e-2, **kwargs):
        super().__init__(arms, theta, tau, **kwargs)
        if round_length not in self.ROUND_LENGTHS:
            raise ValueError(f"round_length: expected one of {self.ROUND_LENGTHS}, got {round_length!r}")
        self.round_length_convention = round_length
        if rounding_epsilon is None:
            rounding_epsilon = 0.1 if round_length == "paper" else 0.01
        if not (isinstance(rounding_epsilon, (int, float)) and math.isfinite(rounding_epsilon) and rounding_epsilon > 0):
            raise ValueError(f"rounding_epsilon: expected a number > 0, got {rounding_epsilon!r}")
        self.epsilon = float(rounding_epsilon)
        self.design_tol = float(design_tol)
        self._rho = 1.0
        self._support = 1
        self.supports: list[int] = []
        self.design_gaps: list[float] = []

    def allocation(self, t: int) -> np.ndarray:
        u = self._u
        if u.all():
            res = optimal_design(self.arms, tol=self.design_tol)  # U = X: G-optimal (Kiefer-Wolfowitz)
        else:
            res = optimal_design(self.arms, targets=self.arms[u], tol=self.design_tol)
        # rho_t: the squared max-norm (Algorithm 1 line 8) or its square root (authors' code)
        self._rho = res.value if self.round_length_convention == "paper" else math.sqrt(res.value)
        self._support = res.support
        self.design_values.append(res.value)
        self.supports.append(res.support)
        self.design_gaps.append(res.relative_gap)  # > design_tol: the solver's cap (a DesignWarning)
        return res.weights

    def round_length(self, t: int) -> int:
        n_t = 2.0 ** (2 * t + 3) * self.noise_scale**2 * math.log(1.0 / self.delta_t(t)) * (1 + self.epsilon) * self._rho
        if self.round_length_convention == "authors":
            return max(math.ceil(n_t), 1)
        return max(math.ceil(n_t), rounding_min_samples(self._support, self.epsilon), 1)


# ====================================================================== greedy (adaptive)
RULES = ("max_var", "max_var_reduction", "uniform", "max_reward")
POOLS = ("all", "uncertain", "feasible")


class Greedy(ConstraintLearner):
    """Algorithm 2 (G-ACOL) and the adaptive baselines of Table D.2.

    One ridge regression (ridge 0.1) on all data, updated by rank-one steps. After each answer:
    ``l, u = phi_hat^T x -+ m_t ||x||_{A^-1}`` with ``m_t`` Proposition 3's ``beta_t``
    (``beta="theory"``) or ``sqrt(beta)`` for a tuned ``beta`` (the paper's ``beta_t = 1/4``
    gives 0.5), then the sets are updated and the next arm is chosen by ``rule`` among ``pool``:

    ====================  ===========  ===========
    Table D.2 name        rule         pool
    ====================  ===========  ===========
    G-ACOL                max_var      uncertain
    G-ACOL Uniform        uniform      uncertain
    Greedy Max Var        max_var      all
    Adaptive Uniform      uniform      all
    Max Rew-U             max_reward   uncertain
    Max Rew-F             max_reward   feasible
    ====================  ===========  ===========

    ``max_var`` picks ``argmax ||x||^2_{A^-1}`` (Algorithm 2, line 4 as printed),
    ``max_reward`` ``argmax theta^T x`` (first index on ties), ``uniform`` a uniformly random
    arm of the pool. ``max_var_reduction`` (the authors' implementation, and section 3.4's
    "reduces uncertainty within U_t the most") takes the pool's most uncertain arm
    ``x_u = argmax ||x||^2_{A^-1}`` and queries the arm ``a`` of *all* arms that minimises
    ``||x_u||^2_{(A + a a^T)^-1} = ||x_u||^2_{A^-1} - (x_u^T A^-1 a)^2 / (1 + ||a||^2_{A^-1})``
    (first index on ties). In one dimension ``max_var`` within ``U`` is Max Rew-U (both pick
    the largest arm of ``U``), ``max_var_reduction`` always queries the longest arm (issue 16,
    item 2: 496 queries against 5,879 on the 1-d instance of Figure 3). Max Rew-F (section 4.2) queries at
    random among all arms while ``F`` holds no arm with non-zero features (the paper: "until
    F_t is not empty"; a zero arm, certified feasible at once and carrying no information,
    would otherwise stall it forever).

    Args:
        rule, pool: see the table.
        beta: ``"theory"`` or a number > 0 (tuned).
        ridge: the regulariser ``lambda`` (0.1).
        phi_norm_bound: ``S >= ||phi||`` for Proposition 3 (default 1).
    """

    name = "Greedy"

    def __init__(self, arms, theta, tau: float = 0.0, *, rule: str = "max_var", pool: str = "uncertain",
                 beta: float | str = TUNED_BETA, ridge: float = 0.1, phi_norm_bound: float = 1.0, **kwargs):
        super().__init__(arms, theta, tau, **kwargs)
        if rule not in RULES:
            raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
        if pool not in POOLS:
            raise ValueError(f"pool: expected one of {POOLS}, got {pool!r}")
        self.rule, self.pool = rule, pool
        if isinstance(beta, str):
            if beta != "theory":
                raise ValueError(f"beta: expected 'theory' or a number > 0, got {beta!r}")
            self.beta = "theory"
        else:
            b = float(beta)
            if not (math.isfinite(b) and b > 0):
                raise ValueError(f"beta: expected 'theory' or a number > 0, got {beta!r}")
            self.beta = b
        self.ridge = float(ridge)
        if not (math.isfinite(self.ridge) and self.ridge > 0):
            raise ValueError(f"ridge: expected a number > 0, got {ridge!r}")
        self.phi_norm_bound = float(phi_norm_bound)
        if not (math.isfinite(self.phi_norm_bound) and self.phi_norm_bound >= 0):
            raise ValueError(f"phi_norm_bound: expected a number >= 0, got {phi_norm_bound!r}")
        self.arm_norm = float(np.linalg.norm(self.arms, axis=1).max())  # L
        self._nonzero = np.linalg.norm(self.arms, axis=1) > 0
        self._a = self.ridge * np.eye(self.d)
        self._b = np.zeros(self.d)
        self._ainv = np.eye(self.d) / self.ridge
        self._var = (self.arms**2).sum(1) / self.ridge  # [n] ||x||^2_{A^-1}
        self._mean = np.zeros(self.n)  # [n] phi_hat^T x
        self._next: int | None = None
        self._ubuf = np.zeros(0)
        self._upos = 4096

    def multiplier(self, t: int) -> float:
        """The confidence multiplier after ``t`` answers."""
        if self.beta == "theory":
            return self.noise_scale * math.sqrt(
                self.d * math.log((1.0 + t * self.arm_norm**2 / self.ridge) / self.delta)) + math.sqrt(self.ridge) * self.phi_norm_bound
        return math.sqrt(self.beta)

    def _uniform01(self) -> float:
        """The learner's next U[0, 1) number, drawn in blocks of 4,096 (as the batch engine does)."""
        if self._upos >= 4096:
            self._ubuf = self.rng.random(4096)
            self._upos = 0
        u = float(self._ubuf[self._upos])
        self._upos += 1
        return u

    def _choose(self) -> int:
        u = self._uniform01() if (self.rule == "uniform" or self.pool == "feasible") else 0.0
        if self.pool == "all":
            cand = None
        elif self.pool == "uncertain":
            cand = np.flatnonzero(self._u)
        else:
            cand = np.flatnonzero(self._f & self._nonzero)
            if cand.size == 0:
                return min(int(u * self.n), self.n - 1)
        if self.rule == "uniform":
            if cand is None:
                return min(int(u * self.n), self.n - 1)
            return int(cand[min(int(u * cand.size), cand.size - 1)])
        score = self._var if self.rule in ("max_var", "max_var_reduction") else self.rewards
        best = int(np.argmax(score)) if cand is None else int(cand[np.argmax(score[cand])])
        if self.rule == "max_var_reduction":
            return int(np.argmax(_var_reduction(self.arms, self._ainv, self._var, best)))
        return best

    def next_query(self) -> int:
        if self.done:
            self._after_done_error()
        if self._next is None:
            self._next = self._choose()
        return self._next

    def observe(self, arm: int, y) -> None:
        """Record an answer for ``arm`` (any arm may be answered; intervals are adaptive)."""
        arm = self._check_arm(arm)
        self._update(arm, self._response(y))

    def _update(self, arm: int, y: float) -> None:
        x = self.arms[arm]
        v = self._ainv @ x
        s = 1.0 + float(x @ v)
        xv = self.arms @ v  # [n]
        resid = y - self._mean[arm]
        self._var -= xv**2 / s
        self._mean += xv * (resid / s)
        self._ainv -= np.outer(v, v) / s
        self._a += np.outer(x, x)
        self._b += y * x
        self.num_queries += 1
        if self.num_queries % 2000 == 0:  # refresh against round-off drift
            self._refresh()
        width = self.multiplier(self.num_queries) * np.sqrt(np.maximum(self._var, 0.0))
        self._classify(self._mean - width, self._mean + width)
        self._next = None

    def _refresh(self) -> None:
        chol = np.linalg.cholesky(self._a)
        ci = np.linalg.inv(chol)
        self._ainv = ci.T @ ci
        half = ci @ self.arms.T
        self._var = (half**2).sum(0)
        self._mean = self.arms @ (self._ainv @ self._b)

    def simulate(self, problem: CBAIProblem, rng: np.random.Generator, max_queries: int) -> None:
        """Answer from ``problem`` until done or ``max_queries`` (through ``simulate_greedy_batch``)."""
        simulate_greedy_batch([problem], rule=self.rule, pool=self.pool, beta=self.beta, ridge=self.ridge,
                              phi_norm_bounds=[self.phi_norm_bound], delta=self.delta,
                              noise_scale=self.noise_scale, max_queries=max_queries, noise_rngs=[rng],
                              choice_rngs=[self.rng], learners=[self])


def _var_reduction(arms: np.ndarray, ainv: np.ndarray, var: np.ndarray, target: int) -> np.ndarray:
    """``[n]`` how much querying each arm ``a`` reduces ``||x_u||^2_{A^-1}`` of arm ``target``:
    ``(x_u^T A^-1 a)^2 / (1 + ||a||^2_{A^-1})`` (Sherman-Morrison); ``var`` is ``||a||^2_{A^-1}``."""
    u = arms @ (ainv @ arms[target])
    return u**2 / (1.0 + var)


class GACOL(Greedy):
    """G-ACOL (Algorithm 2): greedy queries for the uncertain arms ``U_t``; ``beta="theory"`` for
    Proposition 3 intervals or a tuned ``beta`` (default the paper's 1/4).

    Args:
        rule: ``"max_var"`` (default; Algorithm 2 line 4 as printed: the most uncertain arm of
            ``U_t``) or ``"max_var_reduction"`` (the authors' implementation and section 3.4's
            prose: the arm that most reduces the variance of ``U_t``'s most uncertain arm; it
            reproduces Figure 3). See ``Greedy``.
    """

    name = "G-ACOL"
    G_ACOL_RULES = ("max_var", "max_var_reduction")

    def __init__(self, arms, theta, tau: float = 0.0, *, beta: float | str = TUNED_BETA, rule: str = "max_var",
                 **kwargs):
        if rule not in self.G_ACOL_RULES:
            raise ValueError(f"rule: expected one of {self.G_ACOL_RULES} for G-ACOL, got {rule!r}")
        kwargs.pop("pool", None)
        super().__init__(arms, theta, tau, rule=rule, pool="uncertain", beta=beta, **kwargs)


# ====================================================================== names, simulation
#: Table D.2: name -> (class, fixed keyword arguments). "(tuned)" variants take ``beta``.
ALGORITHMS: dict[str, tuple[type, dict]] = {
    "Oracle": (Oracle, {}),
    "G-Allocation": (GAllocation, {}),
    "Uniform": (Uniform, {}),
    "ACOL": (ACOL, {}),
    "Greedy Max Var": (Greedy, {"rule": "max_var", "pool": "all", "beta": "theory"}),
    "Adaptive Uniform": (Greedy, {"rule": "uniform", "pool": "all", "beta": "theory"}),
    "Max Rew-U": (Greedy, {"rule": "max_reward", "pool": "uncertain", "beta": "theory"}),
    "Max Rew-F": (Greedy, {"rule": "max_reward", "pool": "feasible", "beta": "theory"}),
    "G-ACOL": (Greedy, {"rule": "max_var", "pool": "uncertain", "beta": "theory"}),
    "G-ACOL Uniform": (Greedy, {"rule": "uniform", "pool": "uncertain", "beta": "theory"}),
    "Greedy Max Var (tuned)": (Greedy, {"rule": "max_var", "pool": "all", "beta": TUNED_BETA}),
    "Adaptive Uniform (tuned)": (Greedy, {"rule": "uniform", "pool": "all", "beta": TUNED_BETA}),
    "G-ACOL (tuned)": (Greedy, {"rule": "max_var", "pool": "uncertain", "beta": TUNED_BETA}),
    "G-ACOL Uniform (tuned)": (Greedy, {"rule": "uniform", "pool": "uncertain", "beta": TUNED_BETA}),
    "Max Rew-U (tuned)": (Greedy, {"rule": "max_reward", "pool": "uncertain", "beta": TUNED_BETA}),
    "Max Rew-F (tuned)": (Greedy, {"rule": "max_reward", "pool": "feasible", "beta": TUNED_BETA}),
}


def convention_options(name: str, convention: str = "paper") -> dict:
    """The keyword arguments that put Table D.2 learner ``name`` in ``convention`` (issue 16).

    ``"paper"``: ``{}`` (the printed algorithms: ACOL's squared ``rho_t`` with ``r(eps)``,
    Algorithm 2's max-variance query). ``"authors"``: ACOL gets ``round_length="authors"``;
    the learners whose rule is ``max_var`` (G-ACOL, Greedy Max Var and their tuned forms) get
    ``rule="max_var_reduction"``, as the authors' ``get_next_arm`` serves both; the others are
    the same in both conventions.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
    if name not in ALGORITHMS:
        raise ValueError(f"name: unknown algorithm {name!r}; expected one of {sorted(ALGORITHMS)}")
    if convention == "paper":
        return {}
    cls, fixed = ALGORITHMS[name]
    if cls is ACOL:
        return {"round_length": "authors"}
    if fixed.get("rule") == "max_var":
        return {"rule": "max_var_reduction"}
    return {}


def make_learner(name: str, arms, theta, tau: float = 0.0, *, phi=None, convention: str = "paper",
                 **kwargs) -> ConstraintLearner:
    """A learner by its Table D.2 name (see ``ALGORITHMS``).

    Args:
        name: e.g. ``"ACOL"``, ``"G-ACOL (tuned)"``, ``"Max Rew-U"``.
        phi: the true constraint parameter, required by ``"Oracle"`` only.
        convention: ``"paper"`` (default) or ``"authors"``: see ``convention_options``; explicit
            ``kwargs`` (``round_length``, ``rule``) override it.
        kwargs: passed on (``delta``, ``feedback``, ``seed``, ``beta`` for the greedy learners,
            ``phi_norm_bound``, ``round_length`` for ACOL ...); a ``beta`` or ``rule`` given here
            overrides the table's.
    """
    if name not in ALGORITHMS:
        raise ValueError(f"name: unknown algorithm {name!r}; expected one of {sorted(ALGORITHMS)}")
    cls, fixed = ALGORITHMS[name]
    opts = {**fixed, **convention_options(name, convention), **kwargs}
    if cls is Oracle:
        if phi is None:
            raise ValueError("phi: the Oracle needs the true constraint parameter")
        opts["phi"] = phi
    if not issubclass(cls, Greedy):
        for k in ("beta", "phi_norm_bound", "ridge", "rule", "pool"):
            opts.pop(k, None)
    if cls is not ACOL:
        for k in ("round_length", "rounding_epsilon", "design_tol"):
            opts.pop(k, None)
    learner = cls(arms, theta, tau, **opts)
    learner.name = name
    return learner


def simulate_greedy_batch(problems: list[CBAIProblem], *, rule: str, pool: str, beta: float | str = TUNED_BETA,
                          seeds: list[int] | None = None, ridge: float = 0.1, phi_norm_bounds=None,
                          delta: float = 0.05, noise_scale: float = 1.0, max_queries: int = 10**9,
                          noise_rngs=None, choice_rngs=None, learners=None) -> list[IdentificationResult]:
    """Run ``R`` independent greedy learners (Algorithm 2 / Table D.2) in lockstep, vectorised.

    The DESIGN's batch-first rule: one Python step advances all ``R`` replications (problems of
    equal shape ``[n, d]``, e.g. the 30 seeds of a Figure 2 point), so the step cost is shared.
    Replication ``r`` draws its answers' noise (and, for the ``uniform`` rule, its choices) from
    its own generators in blocks of 4,096, so its result does not depend on ``R`` (tested).
    Replications that finish are dropped from the batch.

    Args:
        problems: ``R`` problems with arms of the same shape.
        rule, pool, beta, ridge, delta, noise_scale: as for ``Greedy``.
        seeds: ``R`` ints; replication ``r`` uses ``SeedSequence(seeds[r]).spawn(2)`` for noise
            and choices (ignored when ``noise_rngs``/``choice_rngs`` are given).
        phi_norm_bounds: ``R`` values of ``S`` (default: each problem's true ``||phi||``).
        max_queries: the query budget of each replication.
        learners: optional ``Greedy`` objects that receive the final state.

    Returns:
        ``R`` ``IdentificationResult``.
    """
    R = len(problems)
    if R == 0:
        raise ValueError("problems: expected at least one problem")
    if rule not in RULES or pool not in POOLS:
        raise ValueError(f"rule/pool: expected one of {RULES} / {POOLS}, got {rule!r} / {pool!r}")
    shape = problems[0].arms.shape
    if any(p.arms.shape != shape for p in problems):
        raise ValueError("problems: every problem of a batch needs arms of the same shape")
    if noise_rngs is None or choice_rngs is None:
        seeds = list(range(R)) if seeds is None else [int(s) for s in seeds]
        if len(seeds) != R:
            raise ValueError(f"seeds: expected {R} seeds, got {len(seeds)}")
        pairs = [np.random.SeedSequence(s).spawn(2) for s in seeds]
        noise_rngs = [np.random.default_rng(a) for a, _ in pairs]
        choice_rngs = [np.random.default_rng(b) for _, b in pairs]
    n, d = shape
    X = np.stack([p.arms for p in problems])  # [R, n, d]
    rew = np.einsum("rnd,rd->rn", X, np.stack([p.theta for p in problems]))  # [R, n]
    c = np.einsum("rnd,rd->rn", X, np.stack([p.phi for p in problems]))  # [R, n]
    tau = np.array([p.tau for p in problems])[:, None]
    binary = np.array([p.feedback == "binary" for p in problems])
    sd = np.array([p.noise_sd for p in problems])
    S = np.array([np.linalg.norm(p.phi) for p in problems]) if phi_norm_bounds is None else np.asarray(phi_norm_bounds, float)
    L2 = (X**2).sum(-1).max(1)  # [R] L^2
    nonzero = (X**2).sum(-1) > 0
    if learners is not None:  # continue from a learner's state (R = 1 from Greedy.simulate)
        ainv = np.stack([lr._ainv for lr in learners]).copy()
        amat = np.stack([lr._a for lr in learners]).copy()
        bvec = np.stack([lr._b for lr in learners]).copy()
        var = np.stack([lr._var for lr in learners]).copy()
        mean = np.stack([lr._mean for lr in learners]).copy()
        U = np.stack([lr._u for lr in learners]).copy()
        F = np.stack([lr._f for lr in learners]).copy()
        INF = np.stack([lr._inf for lr in learners]).copy()
        t = np.array([lr.num_queries for lr in learners], dtype=np.int64)
    else:
        ainv = np.repeat(np.eye(d)[None] / ridge, R, 0)
        amat = np.repeat(np.eye(d)[None] * ridge, R, 0)
        bvec = np.zeros((R, d))
        var = (X**2).sum(-1) / ridge
        mean = np.zeros((R, n))
        U = np.ones((R, n), bool)
        F = np.zeros((R, n), bool)
        INF = np.zeros((R, n), bool)
        t = np.zeros(R, dtype=np.int64)
    lower = np.full((R, n), -np.inf)
    upper = np.full((R, n), np.inf)
    block = 4096
    sqrt_ridge = math.sqrt(ridge)
    draw_unif = rule == "uniform" or pool == "feasible"
    # the loop works on compacted copies of the live rows; finished rows are written back
    rows = np.flatnonzero(U.any(1) & (t < max_queries))
    st = {}

    def load(sel):
        st.update(X=X[sel], rew=rew[sel], c=c[sel], tau=tau[sel], bin=binary[sel], nz=nonzero[sel], L2=L2[sel], S=S[sel],
                  ainv=ainv[sel], a=amat[sel], b=bvec[sel], var=var[sel], mean=mean[sel], U=U[sel], F=F[sel],
                  INF=INF[sel], t=t[sel], lo=lower[sel], hi=upper[sel])

    def store(sel, keep):
        for key, arr in (("ainv", ainv), ("a", amat), ("b", bvec), ("var", var), ("mean", mean), ("U", U), ("F", F),
                         ("INF", INF), ("t", t), ("lo", lower), ("hi", upper)):
            arr[sel] = st[key][keep]

    load(rows)
    noise = np.zeros((rows.size, block))
    unif = np.zeros((rows.size, block))
    pos = block  # live rows step together, so one position serves them all
    while rows.size:
        if pos >= block:
            for i, r in enumerate(rows):
                noise[i] = noise_rngs[r].random(block) if binary[r] else sd[r] * noise_rngs[r].standard_normal(block)
                if draw_unif:
                    unif[i] = choice_rngs[r].random(block)
            pos = 0
        Xl, Ul, Fl = st["X"], st["U"], st["F"]
        k = np.arange(rows.size)
        # --- choose (Table D.2 rule within the pool)
        u01 = unif[:, pos]
        P = None if pool == "all" else (Ul if pool == "uncertain" else Fl & st["nz"])
        if rule == "uniform":
            if P is None:
                arm = np.minimum((u01 * n).astype(np.int64), n - 1)
            else:
                cnt = P.sum(1)
                kth = np.minimum((u01 * cnt).astype(np.int64), np.maximum(cnt - 1, 0))
                arm = (P.cumsum(1) > kth[:, None]).argmax(1)
        else:
            score = st["var"] if rule in ("max_var", "max_var_reduction") else st["rew"]
            arm = (score if P is None else np.where(P, score, -np.inf)).argmax(1)
            if rule == "max_var_reduction":  # query the arm that most reduces x_u's variance
                xu = Xl[k, arm]  # [l, d]
                w_ = (st["ainv"] @ xu[:, :, None])[:, :, 0]  # [l, d] A^-1 x_u
                uu = (Xl @ w_[:, :, None])[:, :, 0]  # [l, n] a^T A^-1 x_u
                arm = (uu**2 / (1.0 + st["var"])).argmax(1)
        if pool == "feasible":
            empty = ~P.any(1)
            if empty.any():
                arm = np.where(empty, np.minimum((u01 * n).astype(np.int64), n - 1), arm)
        # --- answer
        z = noise[:, pos]
        pos += 1
        ca = st["c"][k, arm]
        y = np.where(st["bin"], np.where(z < (ca + 1.0) / 2.0, 1.0, -1.0), ca + z)
        # --- rank-one update
        xa = Xl[k, arm]  # [l, d]
        ai = st["ainv"]
        v = (ai @ xa[:, :, None])[:, :, 0]
        s = 1.0 + (xa * v).sum(1)
        xv = (Xl @ v[:, :, None])[:, :, 0]  # [l, n]
        resid = y - st["mean"][k, arm]
        st["var"] -= xv**2 / s[:, None]
        st["mean"] += xv * (resid / s)[:, None]
        ai -= v[:, :, None] * (v / s[:, None])[:, None, :]
        st["a"] += xa[:, :, None] * xa[:, None, :]
        st["b"] += y[:, None] * xa
        st["t"] += 1
        tl = st["t"]
        if tl[0] % 2000 == 0:  # refresh against round-off drift (live rows step together)
            inv = np.linalg.inv(st["a"])
            st["ainv"] = inv
            st["var"] = ((Xl @ inv) * Xl).sum(-1)
            st["mean"] = (Xl @ (inv @ st["b"][:, :, None]))[:, :, 0]
        # --- intervals and sets (Algorithm 2, lines 7-11)
        if beta == "theory":
            mult = noise_scale * np.sqrt(d * np.log((1.0 + tl * st["L2"] / ridge) / delta)) + sqrt_ridge * st["S"]
            width = mult[:, None] * np.sqrt(np.maximum(st["var"], 0.0))
        else:
            width = math.sqrt(beta) * np.sqrt(np.maximum(st["var"], 0.0))
        lo = st["mean"] - width
        hi = st["mean"] + width
        st["lo"], st["hi"] = lo, hi
        new_f = Ul & (hi <= st["tau"])
        new_inf = Ul & (lo > st["tau"])
        if new_f.any() or new_inf.any():
            new_inf &= ~new_f
            Fl |= new_f
            st["INF"] |= new_inf
            Ul &= ~(new_f | new_inf)
            best = np.where(Fl, st["rew"], -np.inf).max(1)
            Ul &= st["rew"] > best[:, None]
            going = Ul.any(1) & (tl < max_queries)
        else:
            going = tl < max_queries
        if not going.all():
            store(rows, np.ones(rows.size, bool))
            rows = rows[going]
            for key in list(st):
                st[key] = st[key][going]
            noise, unif = noise[going], unif[going]
    results = []
    for r, p in enumerate(problems):
        idx = np.flatnonzero(F[r])
        rec = None if idx.size == 0 else int(idx[np.argmax(rew[r, idx])])
        done = not U[r].any()
        results.append(IdentificationResult(rec, int(t[r]), done, done and p.is_correct(rec)))
    if learners is not None:
        for r, lr in enumerate(learners):
            lr._ainv, lr._a, lr._b, lr._var, lr._mean = ainv[r], amat[r], bvec[r], var[r], mean[r]
            lr._u, lr._f, lr._inf, lr.num_queries = U[r], F[r], INF[r], int(t[r])
            lr.lower, lr.upper = lower[r], upper[r]
            lr._next = None
    return results


def simulate(learner: ConstraintLearner, problem: CBAIProblem, seed: int = 0,
             max_queries: int = 10**9) -> IdentificationResult:
    """Run ``learner`` on ``problem`` with simulated answers until ``U`` is empty or the budget ends.

    Round-based learners are fed whole rounds through exact sums of the answers
    (``CBAIProblem.sample_sums``), so rounds of millions of pulls are cheap; a round that
    would exceed ``max_queries`` is not started. Greedy learners answer step by step.

    Args:
        seed: seeds the answers' noise (the learner has its own seed).
    """
    rng = np.random.default_rng(seed)
    if isinstance(learner, RoundBased):
        while not learner.done:
            counts = learner.pending_counts()
            if learner.num_queries + int(counts.sum()) > max_queries:
                break
            learner.observe_round(problem.sample_sums(counts, rng))
    elif isinstance(learner, Greedy):
        learner.simulate(problem, rng, max_queries)
    else:  # a user-defined learner: the step interface
        learner.run(lambda arm: problem.sample(arm, rng), max_queries)
    return learner.result(problem)
