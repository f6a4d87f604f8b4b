"""Thompson Sampling with Auxiliary Safety Constraints (TS-ASC).

Daulton, Singh, Avadhanula, Dimmery & Bakshy (2019), section 3.2 and Algorithm 1. Each step:

1. draw one joint model sample ``f~_t`` (reward and every constraint metric);
2. the feasible set ``A_feas = {a : f~^(c)(x, a) >= (1 - alpha) f~^(c)(x, b_t)}`` for every
   constraint metric (several metrics: the paper's footnote 1 / section 5.3, an action must
   satisfy all of them);
3. play ``argmax_{a in A_feas} f~^(r)(x, a)``.

Constraint forms beyond the paper's (``constraints=``, one ``bayes_safe.envs.Constraint`` per
constraint model): the feasibility test of step 2 becomes ``Constraint.satisfied(f~_k, f~_b)``
of the sampled constraint values ``f~_k = f~^(c)(x, a_k)`` and ``f~_b = f~^(c)(x, b_t)``:

* ``relative(m, at_least=c)``: ``f~_k >= c f~_b`` (with ``c = 1 - alpha`` the paper's test,
  section 3.1's ``E[c_t | x_t, a_t] >= (1 - alpha) E[c_t | x_t, b_t]`` and section 3.2's
  ``A_feas``);
* ``relative(m, at_most=c)``: ``f~_k <= c f~_b``, for a lower-is-better metric
  (unsubscribes at most ``c`` times the baseline's);
* ``absolute(m, at_least=l)`` / ``absolute(m, at_most=l)``: ``f~_k >= l`` / ``f~_k <= l``.

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
            scalar or one value per constraint metric (Daulton et al. 2019, section 3.1:
            ``E[c | x, a] >= (1 - alpha) E[c | x, b]``).
        constraints: instead of ``alpha``, one ``Constraint`` per constraint model, in order
            (direction and form of each metric, see the module docstring);
            ``Constraint.from_alpha(m, a)`` gives exactly the ``alpha=a`` policy. Give exactly
            one of ``alpha`` and ``constraints``. With constraints, ``alpha`` holds
            ``1 - bound`` when every constraint is of the paper's form (relative,
            ``at_least``), else None.

    Shapes: as ``Policy``; ``constraints [R, C]`` in ``update``.
    """

    def __init__(self, reward_model, constraint_models, alpha: float | Sequence[float] | None = None,
                 constraints: Sequence | None = None):
        if not isinstance(constraint_models, (list, tuple)):
            constraint_models = [constraint_models]
        if len(constraint_models) == 0:
            raise ValueError("constraint_models: expected at least one constraint model")
        self.reward_model = check_model(reward_model, "reward_model", "sample_at")
        self.constraint_models = [check_model(m, f"constraint_models[{j}]", "sample_at")
                                  for j, m in enumerate(constraint_models)]
        self.num_constraints = len(self.constraint_models)
        self.constraints: tuple | None = None
        if constraints is not None:
            if alpha is not None:
                raise ValueError("TSASC: give exactly one of alpha= and constraints=, not both")
            self.constraints = _check_constraints(constraints, self.num_constraints)
            paper = all(c.versus_baseline and not c.at_most for c in self.constraints)
            self.alpha = (torch.tensor([1.0 - c.bound for c in self.constraints], dtype=torch.float64)
                          if paper else None)
            return
        if alpha is None:
            alpha = 0.01
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
        # shapes broadcast over leading sample dimensions (``[S, R, K]`` under a DrawBatch)
        R = features.shape[0]
        rows = torch.arange(R)
        ok = torch.ones(features.shape[:2], dtype=torch.bool)
        for j, model in enumerate(self.constraint_models):
            fc = model.sample_at(features, generator, key=f"constraint{j}")
            base = fc[..., rows, baseline]
            if self.constraints is None:
                ok = ok & (fc >= ((1 - self.alpha[j]) * base)[..., None])
            else:
                ok = ok & self.constraints[j].satisfied(fc, base)
        ok[..., rows, baseline] = True
        return ok

    def _check(self, features, baseline, valid):
        return check_select_inputs(features, baseline, valid, require_baseline="TS-ASC", empty_rows_ok=True,
                                   models=(self.reward_model, *self.constraint_models))

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        features, baseline, valid = self._check(features, baseline, valid)
        fr = self.reward_model.sample_at(features, generator, key="reward")
        ok = self._feasible(features, baseline, generator)
        if valid is not None:
            ok = ok & valid
            ok[..., torch.arange(features.shape[0]), baseline] = True
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


def _is_constraint(c) -> bool:
    """A ``bayes_safe.envs.Constraint`` (duck-typed: policies do not import ``envs``)."""
    return all(hasattr(c, a) for a in ("metric", "bound", "at_most", "versus_baseline")) and callable(
        getattr(c, "satisfied", None))


def _check_constraints(constraints, count: int) -> tuple:
    """One ``Constraint`` per constraint model, as a tuple; clear errors otherwise."""
    if _is_constraint(constraints):
        constraints = [constraints]
    if not isinstance(constraints, (list, tuple)):
        raise TypeError(f"constraints: expected a sequence of bayes_safe.envs.Constraint, got {type(constraints).__name__}")
    for j, c in enumerate(constraints):
        if not _is_constraint(c):
            raise TypeError(f"constraints[{j}]: expected a bayes_safe.envs.Constraint (e.g. "
                            f"Constraint.relative('unsubscribe', at_most=1.02)), got {type(c).__name__}")
    if len(constraints) != count:
        raise ValueError(f"constraints: expected one per constraint model ({count}), got {len(constraints)}")
    return tuple(constraints)
