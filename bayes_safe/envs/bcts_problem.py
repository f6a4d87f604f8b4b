"""The problem of behaviour-constrained bandit experiments (Balakrishnan et al. 2018, s.5).

A ``BCTSProblem`` is a finite table of contexts (movies, patients) with each arm's reward and
whether the behaviour constraint allows the arm there. ``folds`` splits the contexts into a
teaching fold and an online fold per replication (the paper's cross-validation: "5 cross
validations using a different subset of 200 movies to train mu^e each time").

The tables of the paper are built by ``bayes_safe.envs.movies.movie_recommendation`` and
``bayes_safe.envs.warfarin.warfarin``; ``bayes_safe.experiments.run_bcts`` runs BCTS on one.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["BCTSProblem"]


@dataclass
class BCTSProblem:
    """A finite behaviour-constrained contextual bandit problem.

    Attributes:
        name: short name (``"movie-recommendation"``, ``"warfarin"``).
        contexts: ``[n, d]`` float64 context of each of the ``n`` items (movies, patients).
        rewards: ``[n, K]`` float64 reward of each arm in each context (in ``[0, 1]``).
        allowed: ``[n, K]`` bool: whether the behaviour constraint allows the arm.
        feature_names, arm_names: labels of the ``d`` features and ``K`` arms.
        teaching_size: contexts per teaching fold (the rest are recommended on).
        info: free-form description (data source, marginals, constraint matrix ...).
    """

    name: str
    contexts: torch.Tensor
    rewards: torch.Tensor
    allowed: torch.Tensor
    feature_names: list[str]
    arm_names: list[str]
    teaching_size: int = 200
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.contexts = torch.as_tensor(self.contexts, dtype=torch.float64)
        self.rewards = torch.as_tensor(self.rewards, dtype=torch.float64)
        self.allowed = torch.as_tensor(self.allowed, dtype=torch.bool)
        if self.contexts.dim() != 2:
            raise ValueError(f"contexts: expected shape [n, d], got {list(self.contexts.shape)}")
        n, d = self.contexts.shape
        if self.rewards.dim() != 2 or self.rewards.shape[0] != n:
            raise ValueError(f"rewards: expected shape [{n}, K], got {list(self.rewards.shape)}")
        K = self.rewards.shape[1]
        if tuple(self.allowed.shape) != (n, K):
            raise ValueError(f"allowed: expected shape [{n}, {K}], got {list(self.allowed.shape)}")
        for name in ("contexts", "rewards"):
            if not bool(torch.isfinite(getattr(self, name)).all()):
                raise ValueError(f"{name}: expected finite values")
        if len(self.feature_names) != d or len(self.arm_names) != K:
            raise ValueError(f"feature_names, arm_names: expected {d} and {K} names, got {len(self.feature_names)} "
                             f"and {len(self.arm_names)}")
        if not 1 <= int(self.teaching_size) < n:
            raise ValueError(f"teaching_size: expected an int in [1, {n - 1}] (n = {n} contexts), got {self.teaching_size!r}")
        self.teaching_size = int(self.teaching_size)
        self.best_reward = self.rewards.max(-1).values
        self.best_allowed_reward = self.rewards.masked_fill(~self.allowed, float("-inf")).max(-1).values
        self.best_allowed_reward = torch.where(torch.isfinite(self.best_allowed_reward), self.best_allowed_reward,
                                               self.best_reward)

    @property
    def num_contexts(self) -> int:
        return self.contexts.shape[0]

    @property
    def num_arms(self) -> int:
        return self.rewards.shape[1]

    @property
    def dim(self) -> int:
        return self.contexts.shape[1]

    def folds(self, replications: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Teaching and online context indices of each replication, ``([R, s], [R, n - s])``.

        The contexts are shuffled once (``seed``); replication ``r`` teaches on positions
        ``r s, ..., r s + s - 1`` (mod ``n``) of the shuffle and recommends on the others, so
        the teaching folds are disjoint while ``R s <= n`` (cross-validation folds).
        """
        n, s = self.num_contexts, self.teaching_size
        perm = np.random.Generator(np.random.PCG64([int(seed), zlib.crc32(b"folds")])).permutation(n)
        teach, online = [], []
        for r in range(int(replications)):
            pos = (r * s + np.arange(s)) % n
            mask = np.zeros(n, dtype=bool)
            mask[pos] = True
            teach.append(perm[pos])
            online.append(perm[~mask])
        return torch.as_tensor(np.stack(teach)), torch.as_tensor(np.stack(online))

