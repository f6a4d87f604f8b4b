"""Disjoint per-arm linear models over a shared context (Contextual Thompson Sampling).

Agrawal & Goyal (2013), the CTS of Balakrishnan et al. (2018, bcts_balakrishnan2018.txt,
Algorithm 1): arm ``k`` has its own weights ``w_k`` and the mean outcome of playing ``k`` in
context ``c`` is ``c^T w_k``. Implemented as one ``BayesianLinear`` with an extra batch
dimension of size ``num_arms``; an observation updates only the arm that was played.

One stream (no batch shape, known noise, no forgetting) has a fast path (issue 32): the model keeps
each arm's posterior covariance ``S_k [d, d]`` and mean ``m_k [d]`` beside the sufficient statistics
and updates the played arm by Sherman-Morrison, ``S <- S - S x x^T S / (sigma^2 + x^T S x)``, ``m <- m
+ S x (y - x^T m) / (sigma^2 + x^T S x)`` (``O(d^2)``, no factorisation); ``sample_at`` then draws
each arm's score at its row ``x_k`` as ``x_k^T m_k + sqrt(x_k^T S_k x_k) z_k`` (``K`` normals
instead of ``K d``). The arms' posteriors are independent and a score depends on its own arm's
weights only, so the scores have the law of a joint weight draw's (Agrawal & Goyal 2013's
decisions, exactly); the random numbers differ. The covariances are rebuilt from the
precisions every ``REFRESH_EVERY`` updates and whenever anything else changed the arms.

Example:
    >>> import torch, pyro.distributions as dist
    >>> m = PerArmLinear(dist.Normal(0.0, 1.0).expand([5]).to_event(1), num_arms=3, noise_std=0.5)
    >>> m.update(torch.randn(5), torch.tensor(1.0), actions=torch.tensor(2))
    >>> m.sample().shape
    torch.Size([3, 5])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import (
    as_tensor,
    check_batch_shape,
    check_feature_names,
    check_finite,
    check_positive_int,
)
from ..random import Generator
from .linear import BayesianLinear

__all__ = ["PerArmLinear"]

#: one-stream fast path: rebuild the covariances from the precisions after this many rank-one updates
REFRESH_EVERY = 1000
_F64 = torch.float64


@dataclass(eq=False)
class _Kept:
    """The one-stream fast path's state: the arms' covariances and means, numpy views for the
    in-place updates, and what they were computed from (they are valid while ``describes`` the arms)."""

    cov: np.ndarray  # [K, d, d], a view of ``cov_t``
    cov_t: torch.Tensor  # the same memory, for torch's fused rank-one update
    mean: np.ndarray  # [K, d]
    eta: np.ndarray  # a view of the arms' ``eta``
    counts: np.ndarray  # a view of the arms' ``_masked_count``
    source: tuple  # (arms, precision, eta, _count, _masked_count) they were computed from
    updates: int = 0  # rank-one updates since

    def describes(self, arms) -> bool:
        arms_then, precision, eta, count, masked = self.source
        return (arms_then is arms and precision is arms.precision and eta is arms.eta and count == arms._count
                and masked is arms._masked_count and self.updates < REFRESH_EVERY)


class PerArmLinear:
    """``num_arms`` independent conjugate linear models sharing a context of width ``d``.

    Args:
        prior: Gaussian prior with event shape ``[d]`` (conjugate only: the masked updates
            that skip unplayed arms are exact for Gaussian and Normal-Inverse-Gamma models).
        num_arms: number of arms ``K``.
        noise_std / noise_prior: as for ``BayesianLinear``.
        batch_shape: leading batch (replications).
        feature_names: names of the ``d`` context features, or None (as for ``BayesianLinear``:
            saved with the model and used by ``to_inference_data`` and ``bayes-safe diagnose``).
        forgetting / forgetting_rule: as for ``BayesianLinear`` (issue 30): a factor in (0, 1],
            ``"adaptive"`` or an ``AdaptiveForgetting``, or None. Each arm forgets at *its own*
            observations: when arm ``k`` is played and learns, what arm ``k`` learned before weighs
            ``forgetting`` (or, adaptively, arm ``k``'s change test sees the residual); arms not
            played keep what they know (bayesianbandits' per-learner rule). An arm left unplayed
            through a change is still corrected at its next plays.
        decay: in (0, 1), or None (default): decay on the clock (issue 43). At every step (every
            ``update``), each arm *not* played forgets at ``decay`` toward the base prior, so the
            uncertainty about an arm the policy has abandoned grows back with time and exploration
            returns to it: after ``t`` unplayed steps what it learned weighs ``decay^t`` (a
            half-life of ``log(1/2) / log(decay)`` steps). As bayesianbandits' ``decay(...,
            steps=)``, under the stabilised rule (its variance never grows past the prior's).
            Composes with ``forgetting`` (which acts on the played arm).
        idle_after: a whole number >= 0, or None (default): with ``decay``, an arm decays only once it
            has gone ``idle_after`` steps unplayed (it waits for what matters: an arm the policy still
            plays now and then, as it does the runners-up, keeps what it learned, and a play resets the
            wait). None: every unplayed arm decays at every step (``decay`` alone, as before).
        max_sd: a positive number, or None (default): with ``decay``, a ceiling on an idle arm's
            uncertainty. Decay stops where one more step would take the sd of the arm's weights past
            ``max_sd`` along any direction (the largest eigenvalue of its posterior covariance; for an
            intercept-only arm, the sd of its mean outcome), so an abandoned arm's chance of being
            drawn by Thompson sampling comes back to at most that of a posterior of sd ``max_sd``
            (a Kalman random walk's process noise with a cap; with a ``noise_prior``, in units of the
            noise sd). None: the base prior is the ceiling.
        explore_rate: a number in (0, 0.5), or None (default): with ``decay``, an idle arm decays only
            while its chance to draw above the arm of the highest mean at the step's context,
            ``Phi((m_k - m_best) / sqrt(v_k + v_best))``, is under ``explore_rate`` (exploration of an
            abandoned arm comes back at a bounded rate; a ceiling measured in the arm's own gap).
        recall: a positive number (a z-score), or None (default): with ``decay``, an arm keeps what it
            knew when it began to decay, and its next plays are probes: while the sum of their
            standardised residuals under what it knew (a CUSUM, floored at 0) stays at or under
            ``recall``, the arm takes back what it knew (the decay undone, the probe learned); above
            it, the arm keeps the decayed posterior and re-learns fast (it looks improved). So a
            stable arm pays about one play per idle spell, and a changed one is re-learned from a
            wide posterior. Needs a known noise sd (``noise_std``).
            ``idle_after``, ``max_sd``, ``explore_rate`` and ``recall`` are batched (one idle count, and
            one kept posterior, per replication and arm) and saved with the model; without them,
            ``decay`` is the same computation as before. Measured on the drift benchmark's abandoned
            arm (``benchmarks/_drift_binary.py``; docs/reports/drift.md): ``decay=0.95, idle_after=300,
            explore_rate=0.02, recall=2.0``.
        base_prior: the Gaussian that forgetting and decay return to (default: ``prior``); name the
            weak prior a ``power_prior`` warm start was built on (``BayesianLinear``'s argument).

    Shapes: contexts ``[*batch, d]``, ``actions [*batch]`` (long), outcomes ``[*batch]``;
    ``sample() -> [*batch, K, d]``; ``sample_at(features [*batch, K, d]) -> [*batch, K]``
    where row ``k`` of ``features`` is the context arm ``k`` is scored on.
    """

    def __init__(self, prior, num_arms: int, noise_std=None, noise_prior=None, *, batch_shape: Sequence[int] = (),
                 feature_names: Sequence[str] | None = None, forgetting=None, forgetting_rule: str = "stabilized",
                 decay: float | None = None, base_prior=None, idle_after: int | None = None,
                 max_sd: float | None = None, explore_rate: float | None = None, recall: float | None = None):
        feature_names = check_feature_names(feature_names)
        self.num_arms = check_positive_int(num_arms, "num_arms")
        self.batch_shape = check_batch_shape(batch_shape, "batch_shape")
        self.arms = BayesianLinear(
            prior, noise_std=noise_std, noise_prior=noise_prior,
            batch_shape=(*self.batch_shape, self.num_arms), inference="conjugate", feature_names=feature_names,
            forgetting=forgetting, forgetting_rule=forgetting_rule, base_prior=base_prior,
        )
        if decay is not None:
            if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1:
                raise ValueError(f"decay: expected a number in (0, 1) (the weight an unplayed arm's learning keeps "
                                 f"per step), or None, got {decay!r}")
            if forgetting_rule != "stabilized":
                raise ValueError("forgetting_rule: decay pulls an unplayed arm toward its base prior (the stabilized "
                                 f"rule); expected 'stabilized', got {forgetting_rule!r}")
            self.arms.decay = float(decay)
        # the waiting / capped decay (issue 43): None unless ``idle_after`` or ``max_sd`` is given
        self._clock: _ClockDecay | None = None
        if idle_after is not None or max_sd is not None or explore_rate is not None or recall is not None:
            self._clock = _ClockDecay.make(decay, idle_after, max_sd, explore_rate, recall, self.arms,
                                           (*self.batch_shape, self.num_arms))
            self.arms.decay = None  # the arms' own (every-step) decay is replaced by the clock's
        self.dim = self.arms.dim
        # the one-stream fast path's covariances and means (see the module docstring), with what they describe
        self._marginal: _Kept | None = None
        self._select_kept: tuple | None = None  # (x, S_k x [K, d], update count) of the last shared context

    def __setstate__(self, state) -> None:
        # a copy (deepcopy, pickle) copies the kept moments' numpy views apart from the tensors they view:
        # view the copies' memory again (the same numbers; ``describes`` sees the copied tensors)
        self.__dict__.update(state)
        self.__dict__.setdefault("_clock", None)  # (a copy made before issue 43's decay options)
        kept = state.get("_marginal")
        if kept is not None:
            a = self.arms
            kept.cov = kept.cov_t.numpy()
            kept.eta = a.eta.numpy()
            if a._masked_count is not None:
                kept.counts = a._masked_count.numpy()

    @property
    def device(self) -> torch.device:
        """The device of the arms' tensors (the prior's); the one-stream numpy fast path is the CPU's."""
        return self.arms.device

    @property
    def forgetting(self):
        """The arms' forgetting: a factor, ``"adaptive"``, or None (see the class docstring)."""
        return self.arms.forgetting

    @property
    def decay(self) -> float | None:
        """The unplayed arms' decay per step, or None (see the class docstring)."""
        return self.arms.decay if self._clock is None else self._clock.decay

    @property
    def idle_after(self) -> int | None:
        """Steps an arm waits unplayed before it decays, or None (see the class docstring)."""
        return None if self._clock is None else self._clock.idle_after

    @property
    def max_sd(self) -> float | None:
        """The ceiling on an idle arm's weight sd, or None (see the class docstring)."""
        return None if self._clock is None else self._clock.max_sd

    @property
    def explore_rate(self) -> float | None:
        """The chance at which an idle arm stops decaying, or None (see the class docstring)."""
        return None if self._clock is None else self._clock.explore_rate

    @property
    def recall(self) -> float | None:
        """The probes' z-score sum over which a decayed arm keeps its decay, or None (class docstring)."""
        return None if self._clock is None else self._clock.recall

    @property
    def idle_steps(self) -> torch.Tensor | None:
        """Steps since each arm was last played, ``[*batch, K]`` (long; a copy), counted only with one of
        ``idle_after``, ``max_sd``, ``explore_rate`` or ``recall``; else None."""
        return None if self._clock is None else self._clock.idle.clone()

    @property
    def feature_names(self) -> list[str] | None:
        """Names of the ``d`` context features (``list[str]``), or None; kept by the arms' model."""
        return self.arms.feature_names

    def __repr__(self) -> str:
        a = self.arms
        noise = f"noise_std={a.noise_std}" if a.noise_std is not None else "noise_prior=InverseGamma"
        seen = a.num_observations.reshape(*self.batch_shape, self.num_arms)
        per_arm = seen.reshape(-1, self.num_arms).sum(0).tolist()
        return (f"PerArmLinear(dim={self.dim}, num_arms={self.num_arms}, {noise}, batch_shape={list(self.batch_shape)}, "
                f"{'' if a.forgetting is None else f'forgetting={a.adaptive or a.forgetting}, '}"
                f"{'' if self.decay is None else f'decay={self.decay}, '}"
                f"{'' if self.idle_after is None else f'idle_after={self.idle_after}, '}"
                f"{'' if self.max_sd is None else f'max_sd={self.max_sd}, '}"
                f"{'' if self.explore_rate is None else f'explore_rate={self.explore_rate}, '}"
                f"{'' if self.recall is None else f'recall={self.recall}, '}"
                f"observations per arm={per_arm})")

    # ------------------------------------------------------------------ the one-stream fast path
    def _marginal_fast(self) -> bool:
        """Whether the one-stream fast path applies: no batch shape, known noise, no forgetting, on the
        CPU (the path works in numpy on the tensors' memory; elsewhere the batched tensor path serves)."""
        a = self.arms
        return (not self.batch_shape and a.noise_prior is None and a.forgetting is None and a.decay is None
                and self._clock is None and a.precision.is_cpu)

    def _marginal_state(self) -> tuple[np.ndarray, np.ndarray]:
        """``(cov [K, d, d], mean [K, d])`` of the arms (numpy, float64), kept by ``_fast_update`` and
        rebuilt from the precisions when the arms changed otherwise (another update path, a load,
        new statistics) or after ``REFRESH_EVERY`` rank-one updates."""
        a, kept = self.arms, self._marginal
        if kept is not None and kept.describes(a):
            return kept.cov, kept.mean
        L = torch.linalg.cholesky(a.precision)
        cov_t = torch.cholesky_inverse(L).contiguous()  # (column-major per matrix as returned: one copy here,
        # not one per product below)
        mean = torch.cholesky_solve(a.eta.unsqueeze(-1), L).squeeze(-1).numpy()
        if a._masked_count is None:  # counted in place from here on (the source follows the tensor)
            a._masked_count = torch.zeros(self.num_arms, dtype=torch.long, device=a.precision.device)
        self._marginal = _Kept(cov_t.numpy(), cov_t, mean, a.eta.numpy(), a._masked_count.numpy(),
                               (a, a.precision, a.eta, a._count, a._masked_count))
        return self._marginal.cov, mean

    def _fast_update(self, x: np.ndarray, y: float, arm: int) -> None:
        """One observation ``y`` of arm ``arm`` at ``x [d]`` (float64, checked): Sherman-Morrison on the
        kept covariance and mean, and the sufficient statistics (``precision``, ``eta``) as ever.
        In numpy on the tensors' memory: a tenth of the cost of the same dozen torch calls."""
        cov, mean = self._marginal_state()
        kept, a = self._marginal, self.arms
        s = a._scale  # 1 / sigma^2
        sel = self._select_kept  # S_k x of the last select's shared context, when it is this one
        if sel is not None and sel[2] == kept.updates and np.array_equal(sel[0], x):
            Sx = sel[1][arm].copy()
        else:
            Sx = cov[arm] @ x
        self._select_kept = None
        denom = 1.0 / s + float(x @ Sx)
        resid = y - float(x @ mean[arm])
        mean[arm] += Sx * (resid / denom)
        # the two [d, d] rank-one updates in torch's fused addr_ (one pass over the matrix; numpy's outer
        # product and subtraction take three, which at d = 288 is most of an update)
        Sx_t, x_t = torch.from_numpy(Sx), torch.from_numpy(x)
        kept.cov_t[arm].addr_(Sx_t, Sx_t, alpha=-1.0 / denom)
        a.precision[arm].addr_(x_t, x_t, alpha=s)
        kept.eta[arm] += (s * y) * x
        kept.counts[arm] += 1
        kept.updates += 1
        a._invalidate_one(arm)  # the arm's factor is recomputed on its next use

    def update(self, contexts, y, actions) -> None:
        """Update the played arms: ``contexts [*batch, d]``, ``y [*batch]``, ``actions [*batch]``."""
        if (type(contexts) is torch.Tensor and contexts.dtype is _F64 and contexts.shape[-1] == self.dim
                and contexts.dim() <= 2 and contexts.numel() == self.dim and self._marginal_fast()):
            # one stream, one context [d] (or [1, d], as the policies pass it): the fast path, checked
            # here as below in fewer operations
            x = contexts.numpy().reshape(self.dim)
            arm = actions if type(actions) is int else actions.item() if (
                type(actions) is torch.Tensor and actions.numel() == 1 and actions.dtype is torch.long) else None
            value = y if type(y) is float else y.item() if (
                type(y) is torch.Tensor and y.numel() == 1 and y.dtype is _F64) else None
            if (arm is not None and 0 <= arm < self.num_arms and value is not None
                    and math.isfinite(value + float(x.sum()))):  # a finite sum: every entry finite
                self._fast_update(x, value, arm)
                return
        c = check_finite(as_tensor(contexts, "contexts"), "contexts")
        y = check_finite(as_tensor(y, "y"), "y")
        if actions is None:
            raise ValueError("actions: per-arm models need the index of the played arm")
        if isinstance(actions, bool) or (isinstance(actions, torch.Tensor) and (
                actions.dtype.is_floating_point or actions.dtype == torch.bool)):
            raise TypeError(f"actions: expected integer arm indices (shape {list(self.batch_shape)}), got {actions!r}")
        try:
            a = torch.as_tensor(actions, dtype=torch.long, device=c.device)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"actions: expected integer arm indices (shape {list(self.batch_shape)}), "
                            f"got {type(actions).__name__}") from None
        if not self.batch_shape and c.dim() == 2 and c.shape[0] == 1 and y.numel() == 1 and a.numel() == 1:
            c, y, a = c[0], y.reshape(()), a.reshape(())  # the one-stream case given a batch of one (a Decider)
        if tuple(c.shape) != (*self.batch_shape, self.dim):
            if c.dim() == len(self.batch_shape) + 2 and c.shape[-2] == self.num_arms:
                c = c[..., 0, :]  # all rows of per-arm features are the shared context
            else:
                raise ValueError(f"contexts: expected shape {[*self.batch_shape, self.dim]}, got {list(c.shape)}")
        if tuple(y.shape) != tuple(self.batch_shape) or tuple(a.shape) != tuple(self.batch_shape):
            raise ValueError(f"y, actions: expected shape {list(self.batch_shape)}, got {list(y.shape)} and {list(a.shape)}")
        if bool(((a < 0) | (a >= self.num_arms)).any()):
            raise ValueError(f"actions: expected indices in [0, {self.num_arms}), got {a.tolist()}")
        if self.arms.forgetting is not None or self.arms.decay is not None or self._clock is not None:
            # forgetting: the masked update, in which only the played arm forgets (or tests for a change)
            # and, under decay, the others decay
            K = self.num_arms
            weight = torch.nn.functional.one_hot(a, K).to(torch.float64)  # [*b, K]
            if self._clock is not None:
                self._clock.step(self.arms, weight, c, y)
            X = c.to(torch.float64).unsqueeze(-2) * weight[..., None]  # [*b, K, d]: zero rows for the others
            Y = y.to(torch.float64).unsqueeze(-1) * weight  # [*b, K]
            self.arms._update_rows(X, Y, True, weight)
            return
        # only the played arm of each batch element learns: flat index b * K + a into [*b, K]
        n = self.batch_shape.numel()
        index = torch.arange(n, device=a.device) * self.num_arms + a.reshape(-1)
        self.arms._update_elements(index, c.reshape(n, self.dim).to(torch.float64), y.reshape(n).to(torch.float64))

    def predict(self, features) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of each arm's linear function at ``features [*batch, K, d]`` -> ``[*batch, K]``
        (leading axes beyond the batch's, e.g. ``[1, K, d]`` of an unbatched model as the policies pass
        one stream, are kept: ``[1, K]``)."""
        features = self._features(features)
        if features.dim() > len(self.batch_shape) + 2:
            mean, var = self.arms.predict(features.unsqueeze(-2))  # one row per arm: [..., K, 1]
            return mean[..., 0], var[..., 0]
        return self.arms.predict(features)

    def sample(self, sample_shape=(), generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """Joint draws of every arm's weights, ``[*sample_shape, *batch, K, d]`` (``BayesianLinear.sample``:
        ``sample()`` one draw, ``sample((100,))`` 100, ``sample(generator)`` one)."""
        return self.arms.sample(sample_shape, generator, key=key)

    def sample_at(self, features, generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """One draw of every arm's score at its row of ``features [*batch, K, d]`` -> ``[*batch, K]``."""
        features = self._features(features)
        if ((features.dim() == 2 or (features.dim() == 3 and features.shape[0] == 1))
                and (generator is None or (type(generator) is torch.Generator and generator.device.type == "cpu"))
                and self._marginal_fast()):
            # one stream ([K, d], or [1, K, d] as the policies pass it): each arm's score from its
            # marginal N(x_k^T m_k, x_k^T S_k x_k) (module docstring)
            return torch.from_numpy(self._draw_one(features, generator)[0]).reshape(features.shape[:-1])
        w = self.sample(generator, key=key)
        extra = features.dim() - 2 - len(self.batch_shape)
        if extra > 0 and w.dim() > len(self.batch_shape) + 2:
            # S draws (a DrawBatch: propensities) of a model with fewer batch axes than the features
            # (no batch shape, features [1, K, d]): [S, 1, K, d], so the result keeps the features' axes
            lead = w.dim() - len(self.batch_shape) - 2
            w = w.reshape(*w.shape[:lead], *(1,) * extra, *w.shape[lead:])
        return (features * w).sum(-1)

    def _draw_one(self, features: torch.Tensor, generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``sample_at``'s one-stream draw (``features [K, d]`` or ``[1, K, d]``, checked, on the fast path):
        ``(scores, mu, var)`` ``[K]`` in numpy, every arm's score and the mean and variance it is drawn from."""
        cov, mean = self._marginal_state()
        K, d = self.num_arms, self.dim
        F = features.numpy()
        if features.stride(-2) == 0:
            # one context shared by every arm (an expanded row): S_k x for all arms in one product,
            # kept for the update of the arm that is played at this context
            x = F.reshape(-1, d)[0] if F.ndim == 2 else F[0, 0]
            Sx = (cov.reshape(K * d, d) @ x).reshape(K, d)
            mu, var = mean @ x, Sx @ x
            self._select_kept = (x.copy(), Sx, self._marginal.updates)
        else:
            F = F.reshape(K, d)
            mu = (F * mean).sum(-1)
            var = (F * (cov @ F[:, :, None])[:, :, 0]).sum(-1)
        z = torch.randn(features.shape[:-1], generator=generator, dtype=_F64, device="cpu")  # the CPU's path
        return mu + np.sqrt(np.maximum(var, 0.0)) * z.numpy().reshape(-1), mu, var

    def _features(self, features) -> torch.Tensor:
        if not isinstance(features, torch.Tensor) or features.dtype != torch.float64:
            features = as_tensor(features, "features")
        if features.dim() < 2 or tuple(features.shape[-2:]) != (self.num_arms, self.dim):
            raise ValueError(f"features: expected shape {[*self.batch_shape, self.num_arms, self.dim]} (one row per arm), "
                             f"got {list(features.shape)}")
        return features

    def predictive_residual(self, context, y, arm: int) -> torch.Tensor:
        """Arm ``arm``'s standardised one-step predictive residual of ``y [*batch]`` at ``context
        [*batch, d]`` (``BayesianLinear.predictive_residual``), ``[*batch]``."""
        if self._marginal_fast():  # one stream: the kept covariance and mean, no factorisation
            cov, mean = self._marginal_state()
            x = np.asarray(as_tensor(context, "context"), dtype=np.float64).reshape(self.dim)
            var = 1.0 / self.arms._scale + float(x @ cov[arm] @ x)
            return torch.tensor((float(y) - float(x @ mean[arm])) / math.sqrt(var), dtype=torch.float64, device="cpu")
        context = as_tensor(context, "context")
        X = context.unsqueeze(-2).expand(*context.shape[:-1], self.num_arms, self.dim)
        y = torch.as_tensor(y, dtype=torch.float64, device=context.device)
        return self.arms.predictive_residual(X, y.unsqueeze(-1).expand(X.shape[:-1]))[..., arm]

    @property
    def binary_outcomes(self) -> bool:
        """Whether the outcomes are 0 / 1 (the arms' likelihood is probit or logistic)."""
        return self.arms.binary_outcomes

    @property
    def posterior_mean(self) -> torch.Tensor:
        """Each arm's posterior mean, ``[*batch, K, d]`` (a new tensor)."""
        if self._marginal_fast():  # one stream: a copy of the kept mean, not a factorisation per arm
            return torch.from_numpy(self._marginal_state()[1].copy())
        return self.arms.posterior_mean

    @property
    def posterior_covariance(self) -> torch.Tensor:
        """Each arm's posterior covariance, ``[*batch, K, d, d]`` (a new tensor)."""
        if self._marginal_fast():
            return torch.from_numpy(self._marginal_state()[0].copy())
        return self.arms.posterior_covariance


@dataclass(eq=False)
class _ClockDecay:
    """Decay on the clock that waits (``idle_after``), stops at a ceiling (``max_sd``, ``explore_rate``)
    and is undone when a probe finds nothing new (``recall``), issue 43.

    At each step, before the played arms learn: a played arm that decayed while idle and has kept what
    it knew (``recall``) takes it back unless its outcome is more than ``recall`` predictive sd above
    what it knew; every arm that was not played and has now gone ``idle_after`` steps unplayed forgets at
    ``decay`` toward the base prior (the stabilised rule, as ``decay`` alone), unless that step would take
    the largest eigenvalue of its posterior covariance past ``max_sd^2``, or its chance to draw above the
    best arm is already ``explore_rate``. Batched: ``idle [*batch, K]`` counts each replication's arms."""

    decay: float
    idle_after: int | None
    max_sd: float | None
    explore_rate: float | None
    recall: float | None
    idle: torch.Tensor  # [*batch, K] long: steps since each arm was last played
    # ``recall``: what each arm knew when it began to decay (precision [*batch, K, d, d], eta [*batch, K, d]),
    # and whether it holds one (``held [*batch, K]``)
    held: torch.Tensor | None = None
    kept_precision: torch.Tensor | None = None
    kept_eta: torch.Tensor | None = None
    score: torch.Tensor | None = None  # [*batch, K]: the held arms' summed standardised probe residuals

    @staticmethod
    def make(decay, idle_after, max_sd, explore_rate, recall, arms: BayesianLinear, shape) -> _ClockDecay:
        if idle_after is not None and (isinstance(idle_after, bool) or not isinstance(idle_after, (int, np.integer))
                                       or idle_after < 0):
            raise ValueError(f"idle_after: expected a whole number of steps >= 0 (how long an arm goes unplayed "
                             f"before it decays), or None, got {idle_after!r}")
        for name, v in (("max_sd", max_sd), ("recall", recall)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.floating))
                                  or not math.isfinite(v) or v <= 0):
                what = ("the ceiling on an idle arm's weight sd" if name == "max_sd" else
                        "predictive sd above what an arm knew at which a probe keeps its decay")
                raise ValueError(f"{name}: expected a positive finite number ({what}), or None, got {v!r}")
        if explore_rate is not None and (isinstance(explore_rate, bool) or not isinstance(
                explore_rate, (int, float, np.floating)) or not 0 < explore_rate < 0.5):
            raise ValueError(f"explore_rate: expected a number in (0, 0.5) (the chance per step at which an idle "
                             f"arm stops decaying), or None, got {explore_rate!r}")
        if decay is None:
            which = next(n for n, v in (("idle_after", idle_after), ("max_sd", max_sd), ("explore_rate", explore_rate),
                                        ("recall", recall)) if v is not None)
            raise ValueError(f"{which}: shapes the decay of unplayed arms; give it with decay (a number in (0, 1)), "
                             "got decay=None")
        if recall is not None and arms.noise_prior is not None:
            raise ValueError("recall: tests a probe's outcome against a known noise sd; give noise_std, not noise_prior")
        device = arms.precision.device
        clock = _ClockDecay(float(decay), None if idle_after is None else int(idle_after),
                            None if max_sd is None else float(max_sd),
                            None if explore_rate is None else float(explore_rate),
                            None if recall is None else float(recall),
                            torch.zeros(shape, dtype=torch.long, device=device))
        if recall is not None:
            clock.held = torch.zeros(shape, dtype=torch.bool, device=device)
            clock.kept_precision = arms.precision.clone()
            clock.kept_eta = arms.eta.clone()
            clock.score = torch.zeros(shape, dtype=_F64, device=device)
        return clock

    def step(self, arms: BayesianLinear, weight: torch.Tensor, context: torch.Tensor, y: torch.Tensor) -> None:
        """One step of the arms ``[*batch, K]`` (``weight``: 1 for the played arm, else 0) at the shared
        ``context [*batch, d]`` with outcome ``y [*batch]``, before they learn."""
        played = weight > 0
        moved = False
        if self.recall is not None:
            probe = played & self.held
            if bool(probe.any()):
                # the probe's standardised residual under what the arm knew before it decayed
                x = context.to(_F64).unsqueeze(-2).expand(*weight.shape, context.shape[-1])  # [*b, K, d]
                L = torch.linalg.cholesky(self.kept_precision)
                mean = torch.cholesky_solve(self.kept_eta[..., None], L)[..., 0]
                v = torch.linalg.solve_triangular(L, x[..., None], upper=False)[..., 0]
                sd = (1.0 / arms._scale + (v * v).sum(-1)).sqrt()
                yy = y.to(_F64)[..., None].expand(weight.shape)
                z = (yy - (x * mean).sum(-1)) / sd
                # the probes' evidence of an improvement, summed while the arm holds what it knew (a CUSUM)
                self.score = torch.where(probe, (self.score + z).clamp_min(0.0), self.score)
                back = probe & (self.score <= self.recall)
                if bool(back.any()):
                    arms.precision = torch.where(back[..., None, None], self.kept_precision, arms.precision)
                    arms.eta = torch.where(back[..., None], self.kept_eta, arms.eta)
                    moved = True
                # what the arm knew learns the probe too (the played arm's update adds it to the arm)
                s = arms._scale
                w = probe.to(_F64)
                self.kept_precision = self.kept_precision + (s * w)[..., None, None] * x[..., :, None] * x[..., None, :]
                self.kept_eta = self.kept_eta + (s * w * yy)[..., None] * x
                self.held = self.held & ~back
                self.score = torch.where(back, torch.zeros_like(self.score), self.score)
        self.idle = torch.where(played, torch.zeros_like(self.idle), self.idle + 1)
        due = ~played if self.idle_after is None else (~played & (self.idle > self.idle_after))
        if bool(due.any()) and self.explore_rate is not None:
            # each arm's chance to draw above the arm of the highest mean at this context,
            # Phi((m_k - m_b) / sqrt(v_k + v_b)): an arm decays only while it is under ``explore_rate``
            if moved:
                arms._invalidate(None)
            X = context.to(_F64).unsqueeze(-2).expand(*weight.shape, context.shape[-1])
            mean, var = arms.predict(X)
            best = mean.argmax(-1, keepdim=True)
            gap = mean - mean.gather(-1, best)
            chance = torch.special.ndtr(gap / (var + var.gather(-1, best)).clamp_min(1e-300).sqrt())
            due = due & (chance < self.explore_rate)
        if bool(due.any()):
            f = torch.where(due, torch.tensor(self.decay, dtype=_F64, device=weight.device),
                            torch.ones((), dtype=_F64, device=weight.device))
            if self.max_sd is not None:
                # the precision one more step would leave: refuse the step where its smallest eigenvalue
                # falls under 1 / max_sd^2 (the covariance's largest over max_sd^2); a Cholesky factor of
                # ``Lambda' - I / max_sd^2`` exists exactly when it does not
                p0, _ = arms._anchor()
                new = p0 + f[..., None, None] * (arms.precision - p0)
                eye = torch.eye(new.shape[-1], dtype=_F64, device=new.device)
                info = torch.linalg.cholesky_ex(new - eye / self.max_sd**2).info
                f = torch.where(info > 0, torch.ones((), dtype=_F64, device=f.device), f)
                due = due & (info == 0)
            if self.recall is not None:
                # what an arm knew when it begins to decay, kept for its next play
                start = due & ~self.held
                if bool(start.any()):
                    self.kept_precision = torch.where(start[..., None, None], arms.precision, self.kept_precision)
                    self.kept_eta = torch.where(start[..., None], arms.eta, self.kept_eta)
                    self.held = self.held | start
            arms._pull_to_base(f, f[..., None], f[..., None, None])
            moved = True
        if moved:
            arms._invalidate(None)
