"""Drifting linear bandits: the fixed-arm problems of ``linear.py`` whose parameters change with the step.

Two kinds of drift (issue 30), each applied to the metrics named by ``drifting`` (``"reward"``,
``"constraint"`` or ``"all"``; the others stay fixed):

* **abrupt**: at step ``change_step`` the drifting parameters are replaced by a fresh draw from
  the problem's own prior ``N(0, s^2 I)`` (``s = parameter_std``). Steps ``t < change_step`` see
  ``theta``, steps ``t >= change_step`` see ``theta'``. The redraw is repeated (at most 10,000
  times) until the change matters: the action that was optimal before the change is not
  optimal after it, and when a constraint metric drifts, it breaks a constraint after the change
  (unless it is the baseline action, which cannot: a policy that does not notice the change then
  loses reward and breaks the guardrail), while
  the baseline's drifting metrics stay positive (a relative guardrail ``>= (1 - alpha) x`` the
  baseline keeps its meaning).
* **rotation**: every step each drifting parameter turns by ``angle`` radians in a plane of its
  own, spanned by ``theta_m`` and a unit direction ``u_m`` orthogonal to it (drawn once per
  replication): ``theta_m(t) = cos(t angle) theta_m + sin(t angle) |theta_m| u_m``. Its norm is
  preserved and the angle between ``theta_m(t)`` and ``theta_m(t + 1)`` is ``angle``.

How the problem learns the step: its ``draw(n, generator, *, step)`` takes the step as a
keyword, which ``simulate`` passes to every problem whose ``draw`` has a parameter named ``step``
(the Problem protocol's note on time-varying problems, ``problem.py``). The step's mean table
``[R, K, M]`` travels in the units' ``context`` with the noise, so ``outcomes`` and
``expected_all`` answer for the step the units were drawn at. Before an abrupt change and after
it the same table object is returned every step (``simulate`` judges a table once per run of
identical tables); a rotation returns a new table each step.

Randomness: the instances are those of the stationary presets built from the same seeds (so
the problem before any drift is exactly ``kazerouni2017_neurips`` / ``daulton2019``); the new
parameters and the planes of rotation come from a generator seeded from each replication's seed
and a fixed salt, and the step's noise from the run's ``ReplicationRNG`` (``"env/noise"``), so
replication ``r`` of a batch equals the one-replication problem of its seed, bit for bit.

The attributes ``expected``, ``feasible``, ``optimal_action``, ``optimal_reward`` and
``baseline_expected`` inherited from ``LinearBandit`` describe step 0 (what a policy that needs
a known baseline reward, such as CLUCB, is built from); ``expected_at(t)`` gives step ``t``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_positive_int
from ..random import Generator, standard_normal
from .linear import LinearBandit, daulton2019, kazerouni2017_neurips
from .problem import Units, chosen_rows

__all__ = [
    "DriftingLinearBandit",
    "abrupt_change",
    "daulton2019_abrupt",
    "daulton2019_rotating",
    "kazerouni2017_neurips_abrupt",
    "kazerouni2017_neurips_rotating",
    "rotation",
]

#: salt of the per-replication generator of the drift (new parameters, planes of rotation)
_DRIFT_SALT = 0x64726966  # "drif"
_MAX_REDRAWS = 10_000


@dataclass
class _StepContext:
    """What ``draw`` hands to ``outcomes`` and ``expected_all``: the step's noise ``[R, M]`` and mean
    table ``[R, K, M]``."""

    noise: torch.Tensor
    means: torch.Tensor
    step: int


def _drift_generator(seed: int) -> torch.Generator:
    """A generator for replication ``seed``'s drift, independent of the one its instance was drawn from."""
    state = np.random.SeedSequence([int(seed), _DRIFT_SALT]).generate_state(2, np.uint32)
    return torch.Generator(device="cpu").manual_seed((int(state[0]) | (int(state[1]) << 32)) >> 1)


def _check_step(step, name: str) -> int:
    if step is None:
        raise ValueError(f"step: problem {name!r} drifts, so draw needs the step: draw(n, generator, step=t) "
                         "(simulate passes it)")
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step: expected a non-negative int, got {step!r}")
    return int(step)


def _drifting_metrics(drifting: str, num_metrics: int) -> tuple[int, ...]:
    choices = {"reward": (0,), "constraint": tuple(range(1, num_metrics)), "all": tuple(range(num_metrics))}
    if drifting not in choices:
        raise ValueError(f"drifting: expected 'reward', 'constraint' or 'all', got {drifting!r}")
    if not choices[drifting]:
        raise ValueError(f"drifting: {drifting!r} names no metric of a problem with {num_metrics} metric(s) "
                         "(a constraint metric drifts only in a problem that has one)")
    return choices[drifting]


def _table(arm_features: torch.Tensor, parameters: torch.Tensor) -> torch.Tensor:
    """Mean outcomes ``[R, K, M]`` of arms ``[R, K, d]`` under parameters ``[R, M, d]``: an elementwise
    product and sum, as ``LinearBandit`` computes it (the rounding does not depend on ``R``)."""
    return (arm_features[:, :, None, :] * parameters[:, None, :, :]).sum(-1)


@dataclass(repr=False)
class DriftingLinearBandit(LinearBandit):
    """A ``LinearBandit`` whose parameters ``[R, M, d]`` depend on the step (module docstring).

    Attributes (beyond ``LinearBandit``'s, which describe step 0):
        kind: ``"abrupt"`` or ``"rotation"``.
        drifting_metrics: the indices of the metrics whose parameters drift (0: the reward).
        change_step: abrupt: the first step with the new parameters.
        changed_parameters: abrupt: ``[R, M, d]``, the parameters from ``change_step`` on.
        angle: rotation: radians turned per step.
        directions: rotation: ``[R, M, d]`` unit vectors, ``directions[r, m]`` orthogonal to
            ``parameters[r, m]`` (zero for metrics that do not drift).
    """

    kind: str = "abrupt"
    drifting_metrics: tuple[int, ...] = (0,)
    change_step: int | None = None
    changed_parameters: torch.Tensor | None = None
    angle: float | None = None
    directions: torch.Tensor | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.kind == "abrupt":
            if self.changed_parameters is None or self.change_step is None:
                raise ValueError("changed_parameters, change_step: an abrupt change needs both")
            if tuple(self.changed_parameters.shape) != tuple(self.parameters.shape):
                raise ValueError(f"changed_parameters: expected shape {list(self.parameters.shape)}, got "
                                 f"{list(self.changed_parameters.shape)}")
            self._after = _table(self.arm_features, self.changed_parameters)
        elif self.kind == "rotation":
            if self.angle is None or self.directions is None:
                raise ValueError("angle, directions: a rotation needs both")
            if tuple(self.directions.shape) != tuple(self.parameters.shape):
                raise ValueError(f"directions: expected shape {list(self.parameters.shape)}, got "
                                 f"{list(self.directions.shape)}")
            # |theta_m| u_m: the second axis of each plane, scaled once
            self._turned = self.parameters.norm(dim=-1, keepdim=True) * self.directions
            mask = torch.zeros(self.parameters.shape[1], dtype=torch.bool, device=self.parameters.device)
            mask[list(self.drifting_metrics)] = True
            self._moving = mask[None, :, None]
        else:
            raise ValueError(f"kind: expected 'abrupt' or 'rotation', got {self.kind!r}")
        self._last = (None, None)  # (step, table) of the last rotation step asked

    def __repr__(self) -> str:
        names = [self.metric_names[m] for m in self.drifting_metrics]
        drift = (f"change_step={self.change_step}" if self.kind == "abrupt" else f"angle={self.angle:g}")
        return (f"DriftingLinearBandit(name={self.name!r}, kind={self.kind!r}, drifting={names}, {drift}, "
                f"replications={self.replications}, num_arms={self.num_arms}, dim={self.dim}, alpha={self.alpha})")

    def parameters_at(self, step: int) -> torch.Tensor:
        """The parameters ``[R, M, d]`` in force at ``step``."""
        step = _check_step(step, self.name)
        if self.kind == "abrupt":
            return self.parameters if step < self.change_step else self.changed_parameters
        c, s = math.cos(step * self.angle), math.sin(step * self.angle)
        turned = self.parameters * c + self._turned * s
        return torch.where(self._moving, turned, self.parameters)

    def expected_at(self, step: int) -> torch.Tensor:
        """The mean outcomes ``[R, K, M]`` of every arm at ``step`` (the same tensor object for every
        step of one abrupt regime)."""
        step = _check_step(step, self.name)
        if self.kind == "abrupt":
            return self.expected if step < self.change_step else self._after
        if self._last[0] != step:
            self._last = (step, _table(self.arm_features, self.parameters_at(step)))
        return self._last[1]

    def draw(self, n: int, generator: Generator = None, *, step: int | None = None) -> Units:
        """The ``n = R`` units of ``step``: the fixed arms, with the step's noise ``[R, M]`` and mean
        table ``[R, K, M]`` in ``context``."""
        if n != self.replications:
            raise ValueError(f"n: problem {self.name!r} has {self.replications} replications; draw(n) needs n = "
                             f"{self.replications}, got {n!r}")
        means = self.expected_at(step)
        noise = standard_normal((self.replications, self.num_metrics), generator, key="env/noise",
                                device=self.arm_features.device)
        return Units(self.arm_features, self.baseline_action, None, _StepContext(noise, means, int(step)))

    def outcomes(self, units: Units, actions: torch.Tensor) -> torch.Tensor:
        """Observed metrics ``[R, M]`` of ``actions [R]`` at the units' step: mean plus ``noise_std`` x noise."""
        ctx = units.context
        return torch.addcmul(chosen_rows(ctx.means, self._rows, actions), ctx.noise, self.noise_std)

    def expected_all(self, units: Units) -> torch.Tensor:
        """The mean outcomes ``[R, K, M]`` of every arm at the units' step."""
        return units.context.means


def _optimum(means: torch.Tensor, baseline: int, alpha: float | None) -> tuple[int, torch.Tensor]:
    """One instance's best feasible action under ``means [K, M]`` and its feasibility ``[K]`` (bool):
    ``E[c | a] >= (1 - alpha) E[c | b]`` for every constraint metric (``LinearBandit``'s rule)."""
    if alpha is None or means.shape[1] == 1:
        feasible = torch.ones(means.shape[0], dtype=torch.bool, device=means.device)
    else:
        feasible = (means[:, 1:] >= (1 - alpha) * means[baseline, 1:]).all(-1)
    return int(means[:, 0].masked_fill(~feasible, float("-inf")).argmax()), feasible


def abrupt_change(base: LinearBandit, change_step: int = 2000, drifting: str = "reward",
                  name: str | None = None) -> DriftingLinearBandit:
    """``base`` with the ``drifting`` metrics' parameters redrawn at ``change_step`` (module docstring).

    Args:
        base: a fixed-arm problem with ``seeds`` and ``parameter_std`` (a built-in preset).
        change_step: the first step that sees the new parameters (>= 1).
        drifting: ``"reward"``, ``"constraint"`` or ``"all"``.
        name: the problem's name (default ``base.name + "-abrupt"``).

    Returns:
        A ``DriftingLinearBandit`` with ``changed_parameters [R, M, d]``, on ``base``'s device (the
        redraws are made on the CPU, the same numbers on every device).
    """
    change_step = check_positive_int(change_step, "change_step")
    metrics = _drifting_metrics(drifting, base.num_metrics)
    if base.parameter_std is None or len(base.seeds) != base.replications:
        raise ValueError("base: expected a built-in linear problem with its seeds and parameter_std")
    # the redraws on the CPU (per-replication generators; ``.cpu()`` of a CPU tensor is the tensor itself)
    before, parameters, arm_features = base.expected.cpu(), base.parameters.cpu(), base.arm_features.cpu()
    baseline_action = base.baseline_action.cpu()
    changed = []
    for r, seed in enumerate(base.seeds):
        gen = _drift_generator(seed)
        b = int(baseline_action[r])
        best, _ = _optimum(before[r], b, base.alpha)
        for _attempt in range(_MAX_REDRAWS):
            theta = parameters[r].clone()
            fresh = torch.randn(parameters.shape[1:], generator=gen, dtype=torch.float64, device=gen.device) * base.parameter_std
            theta[list(metrics)] = fresh[list(metrics)]
            after = _table(arm_features[r:r + 1], theta[None])[0]  # [K, M]
            if (after[b, list(metrics)] <= 0).any():
                continue  # the baseline's drifting metrics stay positive
            new_best, feasible = _optimum(after, b, base.alpha)
            if new_best == best:
                continue
            if any(m > 0 for m in metrics) and best != b and bool(feasible[best]):
                continue  # a drifting constraint: the old optimum breaks it after the change
            changed.append(theta)
            break
        else:
            raise ValueError(f"drifting: no redraw of {drifting!r} in {_MAX_REDRAWS} changed the optimum of "
                             f"replication {r} (seed {seed})")
    return DriftingLinearBandit(
        name=name or f"{base.name}-abrupt", arm_features=base.arm_features, parameters=base.parameters,
        noise_std=base.noise_std, baseline_action=base.baseline_action, alpha=base.alpha,
        metric_names=list(base.metric_names), seeds=list(base.seeds), parameter_std=base.parameter_std,
        kind="abrupt", drifting_metrics=metrics, change_step=change_step,
        changed_parameters=torch.stack(changed).to(base.parameters.device),
    )


def rotation(base: LinearBandit, angle: float = 1e-3, drifting: str = "reward",
             name: str | None = None) -> DriftingLinearBandit:
    """``base`` with the ``drifting`` metrics' parameters turning by ``angle`` radians per step (module
    docstring).

    Args:
        base: a fixed-arm problem with ``seeds`` (a built-in preset).
        angle: radians per step, a finite number in ``(0, pi]``.
        drifting: ``"reward"``, ``"constraint"`` or ``"all"``.
        name: the problem's name (default ``base.name + "-rotating"``).

    Returns:
        A ``DriftingLinearBandit`` with ``directions [R, M, d]``.
    """
    if isinstance(angle, bool) or not isinstance(angle, numbers.Real) or not 0 < float(angle) <= math.pi:
        raise ValueError(f"angle: expected radians per step in (0, pi] (e.g. 1e-3), got {angle!r}")
    metrics = _drifting_metrics(drifting, base.num_metrics)
    if len(base.seeds) != base.replications:
        raise ValueError("base: expected a built-in linear problem with its seeds")
    if base.dim < 2:
        raise ValueError(f"base: a rotation needs dim >= 2, got {base.dim}")
    parameters = base.parameters.cpu()  # the directions are drawn on the CPU (the same on every device)
    directions = torch.zeros_like(parameters)
    for r, seed in enumerate(base.seeds):
        gen = _drift_generator(seed)
        for m in metrics:
            theta = parameters[r, m]
            unit = theta / theta.norm()
            while True:  # a random direction, made orthogonal to theta (Gram-Schmidt)
                v = torch.randn(base.dim, generator=gen, dtype=torch.float64, device=gen.device)
                v = v - (v @ unit) * unit
                if float(v.norm()) > 1e-6:
                    break
            directions[r, m] = v / v.norm()
    return DriftingLinearBandit(
        name=name or f"{base.name}-rotating", arm_features=base.arm_features, parameters=base.parameters,
        noise_std=base.noise_std, baseline_action=base.baseline_action, alpha=base.alpha,
        metric_names=list(base.metric_names), seeds=list(base.seeds), parameter_std=base.parameter_std,
        kind="rotation", drifting_metrics=metrics, angle=float(angle), directions=directions.to(base.parameters.device),
    )


def kazerouni2017_neurips_abrupt(replications: int = 1, seed: int | list[int] = 0, change_step: int = 2000,
                                 **kwargs) -> DriftingLinearBandit:
    """``kazerouni2017_neurips`` (100 arms in ``R^4``, ``N(0, 1)`` noise) whose reward parameter is
    redrawn from ``N(0, I)`` at ``change_step`` (2,000 by default). ``kwargs``: the preset's options."""
    return abrupt_change(kazerouni2017_neurips(replications, seed, **kwargs), change_step, "reward",
                         "kazerouni2017-neurips-abrupt")


def kazerouni2017_neurips_rotating(replications: int = 1, seed: int | list[int] = 0, angle: float = 1e-3,
                                   **kwargs) -> DriftingLinearBandit:
    """``kazerouni2017_neurips`` whose reward parameter turns by ``angle`` radians per step (1e-3 by
    default: a quarter turn in about 1,571 steps). ``kwargs``: the preset's options."""
    return rotation(kazerouni2017_neurips(replications, seed, **kwargs), angle, "reward",
                    "kazerouni2017-neurips-rotating")


def daulton2019_abrupt(replications: int = 1, seed: int | list[int] = 0, alpha: float = 0.01,
                       change_step: int = 2000, drifting: str = "constraint", **kwargs) -> DriftingLinearBandit:
    """``daulton2019`` (a reward and a constraint metric, 100 arms in ``R^4``, noise 0.1) whose
    ``drifting`` parameters (the constraint's by default: the guardrail's metric drifts) are
    redrawn from ``N(0, I)`` at ``change_step``. ``kwargs``: the preset's options."""
    return abrupt_change(daulton2019(replications, seed, alpha, **kwargs), change_step, drifting,
                         "daulton2019-abrupt")


def daulton2019_rotating(replications: int = 1, seed: int | list[int] = 0, alpha: float = 0.01,
                         angle: float = 1e-3, drifting: str = "all", **kwargs) -> DriftingLinearBandit:
    """``daulton2019`` whose ``drifting`` parameters (both by default) turn by ``angle`` radians per
    step, each in its own plane. ``kwargs``: the preset's options."""
    return rotation(daulton2019(replications, seed, alpha, **kwargs), angle, drifting, "daulton2019-rotating")
