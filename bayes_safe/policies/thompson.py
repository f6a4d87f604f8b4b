"""Thompson sampling: play the action that is best under one posterior draw."""

from __future__ import annotations

import torch

from ..random import Generator, ReplicationRNG, check_generator
from . import _fast
from .base import (
    Policy,
    _model_dims,
    check_model,
    check_select_inputs,
    check_update_inputs,
    masked_argmax,
)

__all__ = ["ThompsonSampling"]


class ThompsonSampling(Policy):
    """Vanilla Thompson sampling (Thompson 1933; Agrawal & Goyal 2013 for linear models).

    Each step draws one joint sample ``f~`` of the reward function at all candidates and
    plays ``argmax_a f~(x, a)``. Works with any model that has ``sample_at`` and ``update``.

    Args:
        model: posterior over the reward function, batch shape ``[R]`` (or ``[R, K]`` per-arm).

    Example:
        >>> import pyro.distributions as dist
        >>> from bayes_safe.models import BayesianLinear
        >>> from bayes_safe.envs import daulton2019
        >>> env = daulton2019(replications=8, seed=0)
        >>> prior = dist.Normal(0.0, 1.0).expand([4]).to_event(1)
        >>> ts = ThompsonSampling(BayesianLinear(prior, noise_std=0.1, batch_shape=[8]))
        >>> ts.select(env.step(0).features).shape
        torch.Size([8])
    """

    #: the rows of one call are separate decisions (``Policy.row_probabilities``)
    batched_rows = True

    def __init__(self, model):
        self.model = check_model(model, "model", "sample_at")

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        if generator is not None and not isinstance(generator, (torch.Generator, ReplicationRNG)):
            check_generator(generator)
        # the common case (float64 tensors of the model's shapes) in a few comparisons, else the general check
        checked = _fast.select_inputs(features, baseline, valid, _model_dims(self.model))
        if checked is None:
            checked = check_select_inputs(features, baseline, valid, models=(self.model,))
        features, baseline, valid = checked
        if valid is None:
            # a conjugate model's own decision in buffers (``BayesianLinear._thompson_argmax``: the numbers
            # of sample_at and the argmax below), when it has one for these inputs
            fast = getattr(self.model, "_thompson_argmax", None)
            actions = None if fast is None else fast(features, generator)
            if actions is not None:
                return actions
        scores = self.model.sample_at(features, generator, key="reward")
        if valid is None and scores.numel() <= 1024:
            # the same first maximal index as masked_argmax's max, at half the call cost on small tables
            return scores.argmax(-1)
        return masked_argmax(scores, valid)

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        model = self.model
        checked = _fast.update_inputs(features_chosen, reward, None, _model_dims(model))
        if checked is not None:
            fast = getattr(model, "_update_checked", None)  # _fast.update_model, inline
            if fast is not None:
                fast(checked[0], checked[1])
            else:
                model.update(checked[0], checked[1], actions=actions)
            return
        features_chosen, reward, _ = check_update_inputs(features_chosen, reward, models=(model,))
        model.update(features_chosen, reward, actions=actions)

    def models(self):
        return {"reward": self.model}
