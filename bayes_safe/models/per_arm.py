"""Disjoint per-arm linear models over a shared context (Contextual Thompson Sampling).

Agrawal & Goyal (2013), the CTS of Balakrishnan et al. (2018, bcts_balakrishnan2018.txt,
Algorithm 1): arm ``k`` has its own weights ``w_k`` and the mean outcome of playing ``k`` in
context ``c`` is ``c^T w_k``. Implemented as one ``BayesianLinear`` with an extra batch
dimension of size ``num_arms``; an observation updates only the arm that was played.

Example:
    >>> import torch, pyro.distributions as dist
    >>> m = PerArmLinear(dist.Normal(0.0, 1.0).expand([5]).to_event(1), num_arms=3, noise_std=0.5)
    >>> m.update(torch.randn(5), torch.tensor(1.0), actions=torch.tensor(2))
    >>> m.sample().shape
    torch.Size([3, 5])
"""

from __future__ import annotations

from collections.abc import Sequence

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

    Shapes: contexts ``[*batch, d]``, ``actions [*batch]`` (long), outcomes ``[*batch]``;
    ``sample() -> [*batch, K, d]``; ``sample_at(features [*batch, K, d]) -> [*batch, K]``
    where row ``k`` of ``features`` is the context arm ``k`` is scored on.
    """

    def __init__(self, prior, num_arms: int, noise_std=None, noise_prior=None, *, batch_shape: Sequence[int] = (),
                 feature_names: Sequence[str] | None = None, forgetting=None, forgetting_rule: str = "stabilized"):
        feature_names = check_feature_names(feature_names)
        self.num_arms = check_positive_int(num_arms, "num_arms")
        self.batch_shape = check_batch_shape(batch_shape, "batch_shape")
        self.arms = BayesianLinear(
            prior, noise_std=noise_std, noise_prior=noise_prior,
            batch_shape=(*self.batch_shape, self.num_arms), inference="conjugate", feature_names=feature_names,
            forgetting=forgetting, forgetting_rule=forgetting_rule,
        )
        self.dim = self.arms.dim

    @property
    def forgetting(self):
        """The arms' forgetting: a factor, ``"adaptive"``, or None (see the class docstring)."""
        return self.arms.forgetting

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
                f"observations per arm={per_arm})")

    def update(self, contexts, y, actions) -> None:
        """Update the played arms: ``contexts [*batch, d]``, ``y [*batch]``, ``actions [*batch]``."""
        c = check_finite(as_tensor(contexts, "contexts"), "contexts")
        y = check_finite(as_tensor(y, "y"), "y")
        if actions is None:
            raise ValueError("actions: per-arm models need the index of the played arm")
        if isinstance(actions, bool) or (isinstance(actions, torch.Tensor) and (
                actions.dtype.is_floating_point or actions.dtype == torch.bool)):
            raise TypeError(f"actions: expected integer arm indices (shape {list(self.batch_shape)}), got {actions!r}")
        try:
            a = torch.as_tensor(actions, dtype=torch.long)
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
        if self.arms.forgetting is not None:
            # forgetting: the masked update, in which only the played arm forgets (or tests for a change)
            K = self.num_arms
            weight = torch.nn.functional.one_hot(a, K).to(torch.float64)  # [*b, K]
            X = c.to(torch.float64).unsqueeze(-2) * weight[..., None]  # [*b, K, d]: zero rows for the others
            Y = y.to(torch.float64).unsqueeze(-1) * weight  # [*b, K]
            self.arms._update_rows(X, Y, True, weight)
            return
        # only the played arm of each batch element learns: flat index b * K + a into [*b, K]
        n = self.batch_shape.numel()
        index = torch.arange(n) * self.num_arms + a.reshape(-1)
        self.arms._update_elements(index, c.reshape(n, self.dim).to(torch.float64), y.reshape(n).to(torch.float64))

    def predict(self, features) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of each arm's linear function at ``features [*batch, K, d]`` -> ``[*batch, K]``."""
        return self.arms.predict(self._features(features))

    def sample(self, sample_shape=(), generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """Joint draws of every arm's weights, ``[*sample_shape, *batch, K, d]`` (``BayesianLinear.sample``:
        ``sample()`` one draw, ``sample((100,))`` 100, ``sample(generator)`` one)."""
        return self.arms.sample(sample_shape, generator, key=key)

    def sample_at(self, features, generator: Generator = None, key: str = "weights") -> torch.Tensor:
        features = self._features(features)
        w = self.sample(generator, key=key)
        extra = features.dim() - 2 - len(self.batch_shape)
        if extra > 0 and w.dim() > len(self.batch_shape) + 2:
            # S draws (a DrawBatch: propensities) of a model with fewer batch axes than the features
            # (no batch shape, features [1, K, d]): [S, 1, K, d], so the result keeps the features' axes
            lead = w.dim() - len(self.batch_shape) - 2
            w = w.reshape(*w.shape[:lead], *(1,) * extra, *w.shape[lead:])
        return (features * w).sum(-1)

    def _features(self, features) -> torch.Tensor:
        if not isinstance(features, torch.Tensor) or features.dtype != torch.float64:
            features = as_tensor(features, "features")
        if features.dim() < 2 or tuple(features.shape[-2:]) != (self.num_arms, self.dim):
            raise ValueError(f"features: expected shape {[*self.batch_shape, self.num_arms, self.dim]} (one row per arm), "
                             f"got {list(features.shape)}")
        return features

    @property
    def binary_outcomes(self) -> bool:
        """Whether the outcomes are 0 / 1 (the arms' likelihood is probit or logistic)."""
        return self.arms.binary_outcomes

    @property
    def posterior_mean(self) -> torch.Tensor:
        return self.arms.posterior_mean

    @property
    def posterior_covariance(self) -> torch.Tensor:
        return self.arms.posterior_covariance
