"""One-stream Thompson sampling over per-arm linear models, in numpy: the fast path.

```python
from bayes_safe.models import calibrated_per_arm
from bayes_safe.policies import StreamingPerArmTS

ts = StreamingPerArmTS.from_calibrated(calibrated_per_arm(X_warm, labels=y_warm, num_arms=K), seed=0)
for x in stream:                     # x: one context [d] (numpy), shared by every arm
    a = ts.select(x)
    ts.update(x, reward, a)
```

The same posterior as ``ThompsonSampling(PerArmLinear(N(mu, tau^2 I), K, noise_std=sigma))`` and
the same law of decisions, for one stream whose arms share one context: arm ``k``'s weights have
the Gaussian posterior ``N(m_k, S_k)``, and a joint draw of every arm's weights scores arm ``k`` at
``x`` with ``x^T w_k ~ N(x^T m_k, x^T S_k x)``, independently across arms (the arms' posteriors
are independent). So a decision is ``K`` univariate normals, not ``K`` draws of ``d`` weights: one
``[K, d]`` product for the means, one ``[K, d, d]`` contraction for the variances. An update
touches the played arm only: a Sherman-Morrison rank-one update of its covariance, ``S <- S -
S x x^T S / (sigma^2 + x^T S x)``, and of its mean, ``m <- m + S x (y - x^T m) / (sigma^2 + x^T S
x)`` (``O(d^2)``, no factorisation). The random numbers differ from ``ThompsonSampling``'s (a
numpy generator); the decisions' distribution does not.

Numerical care: with millions of updates at large ``d`` rebuild the covariances from the
precisions (``refresh``) now and then (the precisions are kept alongside, as sufficient
statistics). ``select`` keeps ``S_k x`` of its context, so the ``update`` at the same array
object after it skips that product.

``StreamingConservativeTS`` is the same fast path for ``ConservativeTS(budget="realised")``.

Per-arm rows: ``select``, ``scores`` and ``update`` also take ``x [K, d]``, row ``k`` the features arm
``k`` is scored on (``bayes_safe.models.baseline_residual``: the context and the baseline's
probability of arm ``k``); the update learns the played arm's row.

What it does not do: batches of replications, the ``Decider``'s propensities, saving. For those use ``ThompsonSampling`` over ``PerArmLinear``
(``to_model`` hands over this posterior).
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import check_exploration
from .thompson import rows_shrink

__all__ = ["StreamingConservativeTS", "StreamingPerArmTS"]


class StreamingPerArmTS:
    """Thompson sampling over ``num_arms`` Gaussian linear models of one shared context (module docstring).

    Args:
        prior_mean: ``[d]`` (shared by the arms).
        prior_scale: the prior sd of every weight (> 0), or a numpy array of one sd per weight ``[d]``.
        num_arms: ``K >= 2``.
        noise_std: the observation noise sd (> 0).
        temperature: multiplies the posterior covariance of the draws (> 0; 1: the posterior).
        seed: an int or a ``numpy.random.Generator``.
        exploration: ``"posterior"`` (default here: draws at ``temperature``) or ``"rows"``: arm ``k``'s draw
            at temperature ``temperature / max(1, n_k)``, ``n_k = sigma^2 / (x^T S_k x)`` its effective rows at
            ``x`` (``ThompsonSampling``'s docstring, "Exploration"; the same law). ``from_calibrated`` takes the
            calibrated model's (``"rows"`` by default).
    """

    exploration = "posterior"  # a class default: an instance pickled before issue 44 draws as it did

    def __init__(self, prior_mean, prior_scale: float, num_arms: int, noise_std: float, *, temperature: float = 1.0,
                 seed=None, exploration: str = "posterior"):
        mu = np.asarray(prior_mean, dtype=np.float64)
        if mu.ndim != 1 or not np.isfinite(mu).all():
            raise ValueError(f"prior_mean: expected a finite vector [d], got shape {list(mu.shape)}")
        if isinstance(prior_scale, np.ndarray):  # one sd per weight
            if prior_scale.shape != mu.shape or not (np.isfinite(prior_scale) & (prior_scale > 0)).all():
                raise ValueError(f"prior_scale: expected a positive number or positive sds [{mu.shape[0]}]")
            prior_scale = prior_scale.astype(np.float64)
            scale_sq = prior_scale**2
        else:
            scale_sq = None
        for name, v in (("prior_scale", 1.0 if scale_sq is not None else prior_scale), ("noise_std", noise_std),
                        ("temperature", temperature)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ValueError(f"{name}: expected a positive number, got {v!r}")
        if isinstance(num_arms, bool) or not isinstance(num_arms, int) or num_arms < 2:
            raise ValueError(f"num_arms: expected an int >= 2, got {num_arms!r}")
        self.exploration = check_exploration(exploration)
        d, K = mu.shape[0], num_arms
        self.dim, self.num_arms = d, K
        self.noise_var = float(noise_std) ** 2
        self.temperature = float(temperature)
        self.prior_mean = mu.copy()
        self.prior_scale = prior_scale.copy() if scale_sq is not None else float(prior_scale)
        sq = scale_sq if scale_sq is not None else np.full(d, float(prior_scale) ** 2)
        self.mean = np.tile(mu, (K, 1))                                     # m_k [K, d]
        self.covariance = np.repeat(np.diag(sq)[None], K, axis=0)          # S_k [K, d, d]
        self.precision = np.repeat(np.diag(1.0 / sq)[None], K, axis=0)     # S_k^-1, sufficient statistics
        self.counts = np.zeros(K, dtype=np.int64)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self._scale = math.sqrt(self.temperature)
        self._last = None

    @classmethod
    def from_calibrated(cls, calibrated, seed=None) -> StreamingPerArmTS:
        """From a ``CalibratedPerArm`` (``bayes_safe.models.calibrated_per_arm``): its prior mean,
        prior scale, noise and temperature."""
        return cls(calibrated.prior_mean.numpy(), calibrated.prior_scale, calibrated.model.num_arms,
                   calibrated.noise_std, temperature=calibrated.temperature, seed=seed,
                   exploration=getattr(calibrated, "exploration", "posterior"))

    @classmethod
    def from_residual(cls, residual, seed=None) -> StreamingPerArmTS:
        """From a ``BaselineResidual`` (``bayes_safe.models.baseline_residual``): the numpy one-stream fast
        path over its per-arm features with its posterior, drawing at its temperature (the same law of
        decisions as ``ThompsonSampling(residual.model())``)."""
        ts = cls(residual.prior_mean, residual.prior_scale, residual.num_arms, residual.noise_std,
                 temperature=residual.temperature, seed=seed)
        ts.set_posterior(residual.precision, residual.eta)
        return ts

    def scores(self, x) -> np.ndarray:
        """One Thompson draw of every arm's reward at context ``x [d]`` (shared), or at per-arm rows
        ``x [K, d]`` (row ``k`` the features arm ``k`` is scored on): ``[K]``."""
        if x.ndim == 2:
            Sx = np.einsum("kij,kj->ki", self.covariance, x)                # S_k x_k [K, d]
            var, mean = (Sx * x).sum(-1), (self.mean * x).sum(-1)
        else:
            Sx = self.covariance @ x                                         # [K, d]
            var, mean = Sx @ x, self.mean @ x
        self._last = (x, Sx)                                                 # reused by the update at this x
        var = np.maximum(var, 0.0)
        sd = np.sqrt(var)
        if self.exploration == "rows":  # temperature / max(1, effective rows): sd times sqrt(min(1, var / sigma^2))
            sd = sd * rows_shrink(var, self.noise_var)
        return mean + self._scale * sd * self.rng.standard_normal(self.num_arms)

    def set_posterior(self, precision, eta) -> None:
        """Set every arm's posterior from its natural parameters: ``precision [K, d, d]`` and ``eta [K, d]``
        (precision times mean), e.g. a warm start's (``bayes_safe.models.baseline_residual``)."""
        P = np.array(precision, dtype=np.float64)
        e = np.array(eta, dtype=np.float64)
        if P.shape != self.precision.shape or e.shape != self.mean.shape:
            raise ValueError(f"precision, eta: expected shapes {list(self.precision.shape)} and {list(self.mean.shape)}")
        self.precision = P
        self.mean = np.linalg.solve(P, e[:, :, None])[:, :, 0]
        self.refresh()

    def learn_batch(self, X, rewards, actions) -> None:
        """Learn many rows at once: ``X [N, d]`` (or per-arm rows ``[N, K, d]``), ``rewards [N]``, ``actions [N]``
        (the played arms), by the natural parameters and one refresh (the same posterior as ``N`` updates)."""
        X = np.asarray(X, dtype=np.float64)
        r = np.asarray(rewards, dtype=np.float64)
        a = np.asarray(actions, dtype=np.int64)
        if X.ndim == 3:
            X = X[np.arange(len(a)), a]
        eta = np.einsum("kij,kj->ki", self.precision, self.mean)
        for k in np.unique(a):
            rows = a == k
            self.precision[k] += X[rows].T @ X[rows] / self.noise_var
            eta[k] += X[rows].T @ r[rows] / self.noise_var
            self.counts[k] += int(rows.sum())
        self.mean = np.linalg.solve(self.precision, eta[:, :, None])[:, :, 0]
        self.refresh()

    def select(self, x) -> int:
        """The arm with the highest draw at context ``x [d]`` (numpy float64)."""
        if not (isinstance(x, np.ndarray) and x.dtype == np.float64):
            x = np.asarray(x, dtype=np.float64)
        return int(np.argmax(self.scores(x)))

    def update(self, x, reward: float, action: int) -> None:
        """The played arm learns ``(x, reward)``: rank-one updates of its covariance and mean."""
        a = int(action)
        last = self._last
        if last is not None and last[0] is x:
            Sx = last[1][a]
            if x.ndim == 2:
                x = x[a]
        else:
            x = np.asarray(x, dtype=np.float64)
            if x.ndim == 2:  # per-arm rows: the played arm's
                x = x[a]
            Sx = self.covariance[a] @ x
        self._last = None
        S = self.covariance[a]
        denom = self.noise_var + x @ Sx
        self.mean[a] += Sx * ((float(reward) - x @ self.mean[a]) / denom)
        S -= np.multiply.outer(Sx, Sx / denom)   # S stays symmetric to rounding: refresh() resets it
        self.precision[a] += np.multiply.outer(x, x / self.noise_var)
        self.counts[a] += 1

    def refresh(self) -> None:
        """Rebuild every covariance from the precision (rounding accumulated by many rank-one updates)."""
        eta = np.einsum("kij,kj->ki", self.precision, self.mean)
        self.covariance = np.linalg.inv(self.precision)
        self.covariance = 0.5 * (self.covariance + self.covariance.transpose(0, 2, 1))
        self.mean = np.einsum("kij,kj->ki", self.covariance, eta)

    def to_model(self):
        """A ``PerArmLinear`` holding this posterior (each arm's ``N(m_k, S_k)`` as a prior, noise sd
        ``sigma``), for ``ThompsonSampling``, saving or ``Decider``."""
        import pyro.distributions as dist
        import torch

        from ..models import PerArmLinear

        scale = torch.as_tensor(self.prior_scale, dtype=torch.float64)  # a number, or one sd per weight
        m = PerArmLinear(dist.Normal(torch.as_tensor(self.prior_mean), scale).to_event(1), self.num_arms,
                         noise_std=math.sqrt(self.noise_var))
        m.thompson_exploration = self.exploration  # ThompsonSampling(m) draws by this rule
        arms = m.arms
        arms.precision.copy_(torch.as_tensor(self.precision))
        arms.eta.copy_(torch.as_tensor(np.einsum("kij,kj->ki", self.precision, self.mean)))
        arms._invalidate(None)
        return m


class StreamingConservativeTS:
    """``ConservativeTS(model, alpha, confidence, budget="realised")`` on a ``StreamingPerArmTS``:
    the one-stream fast path of the safe learner (``bayes_safe.policies.conservative``'s module
    docstring has the check; Kazerouni et al. 2017, constraint (3) and the condition of s.4, with a
    Thompson draw as the proposal and the realised budget).

    The proposal is the fast path's Thompson draw (at its temperature, by its ``exploration`` rule); the budget is checked on
    its untempered posterior (the fast path keeps the calibrated posterior and scales only the
    draws), so no ``variance_scale`` is needed. Rewards settle decisions first in, first out:
    call ``update`` after each ``select``, in order.

    ``min_win_probability`` ``q`` (default None: off) adds ``ConservativeTS``'s second check: a proposal
    ``a`` other than the baseline ``b`` is played only if the calibrated posterior gives ``P(r_a(x) >
    r_b(x)) >= q`` (``ConservativeTS``'s docstring).

    ``exclusive_rewards=True``: rewards in ``[0, 1]`` of which at most one action earns at each step (a class
    label): the baseline's reward at a deviation is at most ``1 - r``, and the deviations' term is the known
    ``(1 - alpha) sum (1 - r)`` over them in place of the model's and the success rate's bound
    (``ConservativeTS``'s docstring, "Exclusive rewards").

    Args:
        ts: a ``StreamingPerArmTS`` (it learns from every play, the baseline's included).
        alpha: the budget, in ``[0, 1)``; confidence: in ``(0.5, 1)`` (default 0.95).
        min_win_probability: None, or ``q`` in ``(0, 1)``.
        exclusive_rewards: False (default) or True (above).
    """

    def __init__(self, ts: StreamingPerArmTS, alpha: float = 0.1, confidence: float = 0.95,
                 min_win_probability: float | None = None, exclusive_rewards: bool = False):
        if not isinstance(ts, StreamingPerArmTS):
            raise TypeError(f"ts: expected a StreamingPerArmTS, got {type(ts).__name__}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < 1:
            raise ValueError(f"alpha: expected a number in [0, 1), got {alpha!r}")
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 < confidence < 1:
            raise ValueError(f"confidence: expected a probability in (0.5, 1), got {confidence!r}")
        from statistics import NormalDist

        self.ts, self.alpha, self.confidence = ts, float(alpha), float(confidence)
        self._z = NormalDist().inv_cdf(self.confidence)
        if min_win_probability is not None and (isinstance(min_win_probability, bool) or not isinstance(
                min_win_probability, (int, float)) or not 0 < min_win_probability < 1):
            raise ValueError(f"min_win_probability: expected None or a probability in (0, 1), got {min_win_probability!r}")
        self.min_win_probability = min_win_probability
        if not isinstance(exclusive_rewards, bool):
            raise TypeError(f"exclusive_rewards: expected True or False, got {exclusive_rewards!r}")
        self.exclusive_rewards = exclusive_rewards
        self.deviation_rewards = 0.0            # the rewards earned at the deviations
        self._win_z = None if min_win_probability is None else NormalDist().inv_cdf(float(min_win_probability))
        self.vetoes = 0                         # proposals the win check turned down
        K, d = ts.num_arms, ts.dim
        self.known = 0.0                       # K_t: the rewards settled, less (1 - alpha) of the baseline's plays'
        self.counterfactual = np.zeros((K, d))  # c_dev: -(1 - alpha) x_b at the deviations
        self.pending_terms = np.zeros((K, d))   # the expected terms of decisions whose reward is pending
        self.deviations = self.baseline_plays = 0
        self.baseline_successes = 0.0
        self.explored = self.fallbacks = 0
        self._pending: list[tuple[bool, int, np.ndarray]] = []

    def _counterfactual_cost(self) -> float:
        ts, b = self.ts, (1 - self.alpha) ** 2
        if self.deviations == 0:
            return 0.0
        if self.exclusive_rewards:  # the baseline earned at most 1 - r where the learner deviated and earned r
            return (1 - self.alpha) * (self.deviations - self.deviation_rewards)
        cf = self.counterfactual
        m = float((cf * ts.mean).sum())
        v = float((cf * (ts.covariance @ cf[:, :, None])[:, :, 0]).sum()) + ts.noise_var * b * self.deviations
        model = -m + self._z * math.sqrt(max(v, 0.0))
        n = self.baseline_plays
        p = (self.baseline_successes + 1) / (n + 2)
        rate = (1 - self.alpha) * self.deviations * (p + self._z * math.sqrt(p * (1 - p) / (n + 3)))
        return max(model, rate)

    def select(self, x, baseline: int) -> int:
        """The Thompson proposal at context ``x [d]`` if the realised budget's lower bound keeps
        with it, else ``baseline``."""
        ts = self.ts
        if not (isinstance(x, np.ndarray) and x.dtype == np.float64):
            x = np.asarray(x, dtype=np.float64)
        b = int(baseline)
        if not 0 <= b < ts.num_arms:
            raise ValueError(f"baseline: expected an arm in [0, {ts.num_arms}), got {baseline!r}")
        scores = ts.scores(x)
        a = int(np.argmax(scores))
        per_arm = x.ndim == 2
        xa, xb = (x[a], x[b]) if per_arm else (x, x)
        if a != b:
            keep = 1 - self.alpha
            Sx = ts._last[1]
            ma, mb, va, vb = ts.mean[a] @ xa, ts.mean[b] @ xb, Sx[a] @ xa, Sx[b] @ xb
            mean = ma - keep * mb
            var = va + keep * keep * vb
            if self._pending:  # decisions without their reward yet: their expected terms, jointly
                c = self.pending_terms.copy()
                c[a] += xa
                c[b] -= keep * xb
                mean = float((c * ts.mean).sum())
                var = float((c * (ts.covariance @ c[:, :, None])[:, :, 0]).sum())
            noise = ts.noise_var * ((len(self._pending) + 1) * (1 + keep * keep))
            lower = self.known + mean - self._z * math.sqrt(max(var + noise, 0.0)) - self._counterfactual_cost()
            if lower < 0:
                a = b
                self.fallbacks += 1
            elif self._win_z is not None and ma - mb < self._win_z * math.sqrt(max(va + vb, 0.0)):
                a = b
                self.vetoes += 1
        moved = a != b
        term = np.zeros_like(self.pending_terms)
        if moved:
            term[a] += xa
            term[b] -= (1 - self.alpha) * xb
            self.explored += 1
        else:
            term[b] += self.alpha * xb
        self.pending_terms += term
        self._pending.append((moved, b, term, xb))
        return a

    def update(self, x, reward: float, action: int) -> None:
        """The model learns ``(x, reward)`` at ``action``; the reward settles the oldest pending decision."""
        self.ts.update(x, reward, action)
        if not self._pending:
            return
        moved, b, term, x_decided = self._pending.pop(0)
        r = float(reward)
        self.pending_terms -= term
        if moved:
            self.known += r
            self.deviations += 1
            self.deviation_rewards += r
            self.counterfactual[b] -= (1 - self.alpha) * x_decided
        else:
            self.known += self.alpha * r
            self.baseline_plays += 1
            self.baseline_successes += r
