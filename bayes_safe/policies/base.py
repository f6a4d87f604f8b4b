"""What every policy answers, and helpers shared by the policies.

A policy acts on a batch of ``R`` replications at once:

* ``select(features [R, K, d], baseline [R] | None, generator=None, valid=None) -> actions [R]``
* ``update(features_chosen [R, d], reward [R], constraints [R, C] | None, actions [R] | None)``

Policies depend only on the posterior interface of their models (``update``, ``predict``,
``sample_at``), never on a model class.
"""

from __future__ import annotations

import torch

from ..random import Generator

__all__ = ["Policy", "check_step_inputs", "masked_argmax"]


def masked_argmax(scores: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """``argmax`` over the last dimension of ``scores [R, K]`` among ``valid [R, K]`` entries."""
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    # ``max`` returns the first maximal index like ``argmax`` and ran 2x faster here
    # (103 us vs 230 us on [1000, 100] float64)
    return scores.max(-1).indices


def check_step_inputs(features: torch.Tensor, baseline: torch.Tensor | None, dim: int | None = None) -> None:
    if features.dim() != 3:
        raise ValueError(f"features: expected shape [R, K, d], got {list(features.shape)}")
    if dim is not None and features.shape[-1] != dim:
        raise ValueError(f"features: expected width d={dim}, got {features.shape[-1]}")
    if baseline is not None:
        if baseline.shape != features.shape[:1]:
            raise ValueError(f"baseline: expected shape [{features.shape[0]}], got {list(baseline.shape)}")
        if bool(((baseline < 0) | (baseline >= features.shape[1])).any()):
            raise ValueError(f"baseline: expected action indices in [0, {features.shape[1]}), got out-of-range values")


class Policy:
    """Base class: subclasses implement ``select`` and, if they learn, ``update``."""

    #: names of the metrics the policy consumes: 0 = reward only; C = reward plus C constraints
    num_constraints: int = 0

    def select(self, features: torch.Tensor, baseline: torch.Tensor | None = None, generator: Generator = None,
               valid: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def update(self, features_chosen: torch.Tensor, reward: torch.Tensor, constraints: torch.Tensor | None = None,
               actions: torch.Tensor | None = None) -> None:
        return None

    def models(self) -> dict[str, object]:
        """The posterior models this policy keeps, by role (for saving and diagnostics)."""
        return {}
