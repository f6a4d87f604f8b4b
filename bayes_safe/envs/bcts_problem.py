"""The problem of behaviour-constrained bandit experiments (Balakrishnan et al. 2018, s.5).

A ``BCTSProblem`` is a finite table of contexts (movies, patients) with each arm's reward and
whether the behaviour constraint allows the arm there. ``folds`` splits the contexts into a
teaching fold and an online fold per replication (the paper's cross-validation: "5 cross
validations using a different subset of 200 movies to train mu^e each time").

The tables of the paper are built by ``bayes_safe.envs.movies.movie_recommendation`` and
``bayes_safe.envs.warfarin.warfarin``; ``bayes_safe.experiments.run_bcts`` runs BCTS on one.

Online, the table is a ``bayes_safe.envs.Problem`` (``BCTSProblem.online``): each step every
row recommends on one context of its online fold, drawn uniformly with replacement; the
metrics are the reward and whether the behaviour rule allows the arm, declared as
``Constraint.absolute("allowed", at_least=1)``. ``simulate`` then measures the regret against
the best *allowed* arm and counts a violation for every arm the rule forbids (the paper's
behavioural errors ``E(T)``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from .problem import Constraint, Problem, Units

__all__ = ["BCTSOnline", "BCTSProblem"]


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
        device: where the tables live (None: the device of ``contexts`` when it is a tensor, else
            the CPU); the online phase's tensors follow it.
    """

    name: str
    contexts: torch.Tensor
    rewards: torch.Tensor
    allowed: torch.Tensor
    feature_names: list[str]
    arm_names: list[str]
    teaching_size: int = 200
    info: dict = field(default_factory=dict)
    device: torch.device | str | None = None

    def __post_init__(self):
        device = torch.device(self.device) if self.device is not None else (
            self.contexts.device if isinstance(self.contexts, torch.Tensor) else torch.device("cpu"))
        self.device = device
        self.contexts = torch.as_tensor(self.contexts, dtype=torch.float64, device=device)
        self.rewards = torch.as_tensor(self.rewards, dtype=torch.float64, device=device)
        self.allowed = torch.as_tensor(self.allowed, dtype=torch.bool, device=device)
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
        return (torch.as_tensor(np.stack(teach), device=self.contexts.device),
                torch.as_tensor(np.stack(online), device=self.contexts.device))


    def online(self, contexts: torch.Tensor, rows: torch.Tensor | None = None, *, mask: bool = False) -> BCTSOnline:
        """The online phase as a ``Problem``: row ``b`` sees context ``contexts[t, rows[b]]`` at step ``t``.

        Args:
            contexts: ``[T, R]`` long, the context index each replication recommends on at each step.
            rows: ``[B]`` replication of each row (default: one row per replication).
            mask: give the behaviour rule as ``valid`` (the Constraint Mask baseline knows it).
        """
        return BCTSOnline(self, contexts, rows, mask)


class BCTSOnline(Problem):
    """The online phase of a ``BCTSProblem`` as a ``Problem`` (``BCTSProblem.online``).

    Step ``t`` (the ``t``-th ``draw``): row ``b`` gets the context ``i = contexts[t, rows[b]]``,
    as candidates ``[B, K, d]`` (the context repeated for every arm: the per-arm posteriors of
    BCTS read one context), its baseline is the best allowed arm (the comparator of the
    constrained regret), and ``outcomes`` are ``(reward, allowed)`` of the played arm.
    ``units.context`` holds the context indices ``[B]``.
    """

    metric_names = ("reward", "allowed")
    constraints = (Constraint.absolute("allowed", at_least=1.0),)
    _trusted_outputs = True  # built from the validated table

    def __init__(self, problem: BCTSProblem, contexts: torch.Tensor, rows: torch.Tensor | None, mask: bool):
        self.table = problem
        self.name = problem.name
        device = problem.contexts.device
        self.contexts = torch.as_tensor(contexts, dtype=torch.long, device=device)
        if self.contexts.dim() != 2:
            raise ValueError(f"contexts: expected [T, R] context indices, got shape {list(self.contexts.shape)}")
        R = self.contexts.shape[1]
        self.rows = torch.arange(R, device=device) if rows is None else torch.as_tensor(rows, dtype=torch.long, device=device)
        self.replications = int(self.rows.numel())
        self.mask = bool(mask)
        allowed_reward = problem.rewards.masked_fill(~problem.allowed, float("-inf"))
        self._best_allowed_arm = torch.where(problem.allowed.any(-1), allowed_reward.argmax(-1), problem.rewards.argmax(-1))
        self._table = torch.stack([problem.rewards, problem.allowed.to(torch.float64)], -1)  # [n, K, 2]
        self._index = torch.arange(self.replications, device=device)
        self.steps = 0

    def draw(self, n: int, generator=None) -> Units:
        if n != self.replications:
            raise ValueError(f"n: expected {self.replications} rows, got {n!r}")
        if self.steps >= self.contexts.shape[0]:
            raise ValueError(f"draw: the online phase has {self.contexts.shape[0]} steps; all were drawn")
        i = self.contexts[self.steps][self.rows]
        self.steps += 1
        p = self.table
        features = p.contexts[i][:, None, :].expand(n, p.num_arms, p.dim)
        return Units(features, self._best_allowed_arm[i], p.allowed[i] if self.mask else None, i)

    def outcomes(self, units: Units, actions: torch.Tensor) -> torch.Tensor:
        return self._table[units.context, actions]

    def expected_all(self, units: Units) -> torch.Tensor:
        return self._table[units.context]
