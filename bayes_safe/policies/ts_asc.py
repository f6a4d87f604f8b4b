"""Thompson Sampling with Auxiliary Safety Constraints (TS-ASC).

Daulton, Singh, Avadhanula, Dimmery & Bakshy (2019), section 3.2 and Algorithm 1. Each step:

1. draw one joint model sample ``f~_t`` (reward and every constraint metric);
2. the feasible set ``A_feas = {a : f~^(c)(x, a) >= (1 - alpha) f~^(c)(x, b_t)}`` for every
   constraint metric (several metrics: the paper's footnote 1 / section 5.3, an action must
   satisfy all of them);
3. play ``argmax_{a in A_feas} f~^(r)(x, a)``.

Choice where the paper is silent: the baseline action ``b_t`` is always feasible. When a
sampled ``f~^(c)(x, b_t)`` is negative, ``(1 - alpha) f~^(c)(x, b_t) > f~^(c)(x, b_t)`` and the
baseline would fail its own check; we add it to the feasible set unconditionally, as
Algorithm 2 (CLUCB2-ASC) does explicitly.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from .._validation import check_in_range
from ..random import Generator
from .base import Policy, check_model, check_select_inputs, check_update_inputs, masked_argmax

__all__ = ["TSASC"]


class TSASC(Policy):
    """TS-ASC (Daulton et al. 2019, Algorithm 1).

    Args:
        reward_model: posterior over the reward metric (``sample_at``, ``update``).
        constraint_models: one posterior per constraint metric (a single model is accepted).
        alpha: the tolerated relative decrease of each constraint metric, in ``[0, 1)``; a
            scalar or one value per constraint metric.

    Shapes: as ``Policy``; ``constraints [R, C]`` in ``update``.
    """

    def __init__(self, reward_model, constraint_models, alpha: float | Sequence[float] = 0.01):
        if not isinstance(constraint_models, (list, tuple)):
            constraint_models = [constraint_models]
        if len(constraint_models) == 0:
            raise ValueError("constraint_models: expected at least one constraint model")
        self.reward_model = check_model(reward_model, "reward_model", "sample_at")
        self.constraint_models = [check_model(m, f"constraint_models[{j}]", "sample_at")
                                  for j, m in enumerate(constraint_models)]
        self.num_constraints = len(self.constraint_models)
        if isinstance(alpha, torch.Tensor):
            alpha = alpha.tolist()  # a 0-d tensor becomes a float, a 1-d one a list
        if isinstance(alpha, numbers.Real):
            alphas = [alpha] * self.num_constraints
        elif isinstance(alpha, (list, tuple)) or type(alpha).__name__ == "ndarray":
            alphas = list(alpha)
        else:
            raise TypeError(f"alpha: expected a number in [0, 1) or one per constraint model, got {type(alpha).__name__}")
        if len(alphas) != self.num_constraints:
            raise ValueError(f"alpha: expected a scalar or {self.num_constraints} values (one per constraint model), got {len(alphas)}")
        self.alpha = torch.tensor([check_in_range(a, "alpha", 0.0, 1.0) for a in alphas], dtype=torch.float64)

    def feasible(self, features, baseline, generator: Generator = None) -> torch.Tensor:
        """The sampled feasible set ``[R, K]`` (bool), baseline included."""
        # an out-of-range baseline would raise IndexError, and a negative one would silently
        # index from the end: checked (outside the library's own loops)
        features, baseline, _ = self._check(features, baseline, None)
        return self._feasible(features, baseline, generator)

    def _feasible(self, features, baseline, generator: Generator = None) -> torch.Tensor:
        R = features.shape[0]
        rows = torch.arange(R)
        ok = torch.ones(features.shape[:2], dtype=torch.bool)
        for j, model in enumerate(self.constraint_models):
            fc = model.sample_at(features, generator, key=f"constraint{j}")
            ok &= fc >= ((1 - self.alpha[j]) * fc[rows, baseline])[:, None]
        ok[rows, baseline] = True
        return ok

    def _check(self, features, baseline, valid):
        return check_select_inputs(features, baseline, valid, require_baseline="TS-ASC", empty_rows_ok=True,
                                   models=(self.reward_model, *self.constraint_models))

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        features, baseline, valid = self._check(features, baseline, valid)
        fr = self.reward_model.sample_at(features, generator, key="reward")
        ok = self._feasible(features, baseline, generator)
        if valid is not None:
            ok &= valid
            ok[torch.arange(features.shape[0]), baseline] = True
        return masked_argmax(fr, ok)

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        features_chosen, reward, constraints = check_update_inputs(
            features_chosen, reward, constraints, num_constraints=self.num_constraints, models=(self.reward_model,))
        self.reward_model.update(features_chosen, reward, actions=actions)
        for j, model in enumerate(self.constraint_models):
            model.update(features_chosen, constraints[:, j], actions=actions)

    def models(self):
        out = {"reward": self.reward_model}
        out.update({f"constraint{j}": m for j, m in enumerate(self.constraint_models)})
        return out
