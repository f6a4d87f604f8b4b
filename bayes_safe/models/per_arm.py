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
        base_prior: the Gaussian that forgetting and decay return to (default: ``prior``); name the
            weak prior a ``power_prior`` warm start was built on (``BayesianLinear``'s argument).

    Shapes: contexts ``[*batch, d]``, ``actions [*batch]`` (long), outcomes ``[*batch]``;
    ``sample() -> [*batch, K, d]``; ``sample_at(features [*batch, K, d]) -> [*batch, K]``
    where row ``k`` of ``features`` is the context arm ``k`` is scored on.
    """

    def __init__(self, prior, num_arms: int, noise_std=None, noise_prior=None, *, batch_shape: Sequence[int] = (),
                 feature_names: Sequence[str] | None = None, forgetting=None, forgetting_rule: str = "stabilized",
                 decay: float | None = None, base_prior=None):
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
        self.dim = self.arms.dim
        # the one-stream fast path's covariances and means (see the module docstring), with what they describe
        self._marginal: _Kept | None = None
        self._select_kept: tuple | None = None  # (x, S_k x [K, d], update count) of the last shared context

    def __setstate__(self, state) -> None:
        # a copy (deepcopy, pickle) copies the kept moments' numpy views apart from the tensors they view:
        # view the copies' memory again (the same numbers; ``describes`` sees the copied tensors)
        self.__dict__.update(state)
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
        return self.arms.decay

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
                f"{'' if a.decay is None else f'decay={a.decay}, '}"
                f"observations per arm={per_arm})")

    # ------------------------------------------------------------------ the one-stream fast path
    def _marginal_fast(self) -> bool:
        """Whether the one-stream fast path applies: no batch shape, known noise, no forgetting, on the
        CPU (the path works in numpy on the tensors' memory; elsewhere the batched tensor path serves)."""
        a = self.arms
        return (not self.batch_shape and a.noise_prior is None and a.forgetting is None and a.decay is None
                and a.precision.is_cpu)

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
        if self.arms.forgetting is not None or self.arms.decay is not None:
            # forgetting: the masked update, in which only the played arm forgets (or tests for a change)
            # and, under decay, the others decay
            K = self.num_arms
            weight = torch.nn.functional.one_hot(a, K).to(torch.float64)  # [*b, K]
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
