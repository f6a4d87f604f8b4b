"""Greedy and uniformly random reference policies."""

from __future__ import annotations

import torch

from ..random import Generator, standard_uniform
from .base import Policy, check_model, check_select_inputs, check_update_inputs, masked_argmax

__all__ = ["Greedy", "Random"]


class Greedy(Policy):
    """Play the action of largest posterior mean (no exploration)."""

    def __init__(self, model):
        self.model = check_model(model, "model", "predict")

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        features, baseline, valid = check_select_inputs(features, baseline, valid, models=(self.model,))
        mean, _ = self.model.predict(features)
        return masked_argmax(mean, valid)

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        features_chosen, reward, _ = check_update_inputs(features_chosen, reward, models=(self.model,))
        self.model.update(features_chosen, reward, actions=actions)

    def models(self):
        return {"reward": self.model}


class Random(Policy):
    """Play a uniformly random (valid) action."""

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        features, baseline, valid = check_select_inputs(features, baseline, valid)
        R, K = features.shape[:2]
        u = standard_uniform((R, K), generator, key="random", device=features.device)
        return masked_argmax(u, valid)
