"""The driving application of Lindner et al. (2022), section 4.3 and appendix C.

A point-mass car (Sadigh et al. 2017's Driver, extended) on a three-lane highway. A controller
is a sequence of 20 actions ``(steer, accelerate)`` in ``[-1, 1]^2`` (the environment is
deterministic, appendix C); its arm is the sum of the eight features of Table C.1 over the 20
post-step states. Rewards are known (``theta``); the constraint ``phi^T f <= tau`` (``tau = 1``)
encodes driving rules a person judges.

Constants the paper leaves out follow the authors' public implementation (issue 7): Euler steps
``dt = 0.2``, friction 1, velocity clipped to ``[-1, 1]``, lane centres ``-0.17, 0, 0.17``,
road half-width 0.255, start ``(0, -0.1, pi/2, 0.41)`` (``v0 = 0.1`` in the blocked scenario),
the car-distance feature ``exp(-b (10 dx^2 + dy^2) + b a)`` with ``b = 30, a = 0.01`` (Table C.1
prints ``c1 = 4``; the code has 10), the "stay in lane" feature
``1 / (1 + exp(-b d^2 + a))`` of the *squared* distance ``d`` to the closest lane centre
(Table C.1 prints ``-b d``; ``features(..., lane_feature="absolute")`` gives the printed form,
issue 16 item 3), keep-speed and target-location as negated squares, the
other car's lane change ``(0, 0.328) x5, (1, 0.328) x6, (-1, 0.328) x6, (0, 0.328) x3`` from
``(0.17, 0, pi/2, 0.41)``, the blocked scenario's stationary cars at ``(-0.17, 0.6), (0, 0.65),
(0.17, 0.7)``, and the cross-entropy method's 50 iterations, 50 samples, 5 elites, initial sd 5.

Choices of ours (the paper and the issue are silent):

* with several other cars (blocked scenario) the car-distance feature is the sum over cars;
* the state vector is ``(x, y, heading, v)``; the dynamics update all four from the old state
  (Euler): ``x += dt v cos h; y += dt v sin h; h += dt v a1; v = clip(v + dt (a2 - v))``;
* the CBAI arms (``driving_problem``) are 69 simple hand-made controllers (straight at
  constant accelerations, lane changes) and the controllers the (un)constrained cross-entropy
  method finds for the scenario's reward, for penalised rewards ``theta - lambda phi`` and for
  random reward directions, less those within a margin of the boundary; binary feedback needs ``phi^T x in [-1, 1]``, so arms are ``z = (f, 1) / s`` with the
  constraint ``psi = (phi, -tau)``, threshold 0, and ``s = max_x |phi^T f(x) - tau|``
  (appendix C.2's normalisation; the constant feature carries ``tau``).

Shapes: a batch of controllers is ``[m, 20, 2]``; features ``[m, 8]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .problems import CBAIProblem

__all__ = [
    "DT",
    "FEATURE_NAMES",
    "HORIZON",
    "LANES",
    "LANE_FEATURES",
    "PHI",
    "SCENARIOS",
    "TAU",
    "Scenario",
    "candidate_controllers",
    "cross_entropy_method",
    "driving_problem",
    "features",
    "handmade_controllers",
    "other_car_trajectory",
    "rollout",
]

DT = 0.2
FRICTION = 1.0
HORIZON = 20
LANES = (-0.17, 0.0, 0.17)
HALF_WIDTH = 0.255
START = (0.0, -0.1, math.pi / 2, 0.41)
TARGET_SPEED = 0.4
RIGHT_LANE = 0.17
LANE_B, LANE_A = 10000.0, 10.0
#: the "stay in lane" feature's distance: ``"squared"`` (the authors' code, ``d^2``; default) or
#: ``"absolute"`` (Table C.1 as printed, ``|d|``)
LANE_FEATURES = ("squared", "absolute")
CAR_B, CAR_A, CAR_CX, CAR_CY = 30.0, 0.01, 10.0, 1.0
SPEED_LIMIT = 0.6

FEATURE_NAMES = ("target velocity", "target location", "off street", "out of lane", "not aligned", "backwards",
                 "speeding", "close to car")
#: Table C.1's constraint weights and threshold
PHI = np.array([0.0, 0.0, 0.3, 0.05, 0.02, 0.5, 0.3, 0.8])
TAU = 1.0

OTHER_CAR_START = (0.17, 0.0, math.pi / 2, 0.41)
OTHER_CAR_ACTIONS = np.array([(0.0, 0.328)] * 5 + [(1.0, 0.328)] * 6 + [(-1.0, 0.328)] * 6 + [(0.0, 0.328)] * 3)
BLOCKING_CARS = ((-0.17, 0.6), (0.0, 0.65), (0.17, 0.7))


def _step(state: np.ndarray, action: np.ndarray) -> np.ndarray:
    """One Euler step of appendix C's dynamics. ``state [..., 4]``, ``action [..., 2]``."""
    x, y, h, v = state[..., 0], state[..., 1], state[..., 2], state[..., 3]
    a1, a2 = action[..., 0], action[..., 1]
    return np.stack([x + DT * v * np.cos(h), y + DT * v * np.sin(h), h + DT * v * a1,
                     np.clip(v + DT * (a2 - FRICTION * v), -1.0, 1.0)], axis=-1)


def rollout(actions, start=START) -> np.ndarray:
    """States after each of the 20 steps: ``[m, 20, 2]`` actions -> ``[m, 20, 4]`` (actions clipped to [-1, 1])."""
    a = np.clip(np.asarray(actions, dtype=float), -1.0, 1.0)
    squeeze = a.ndim == 2
    if squeeze:
        a = a[None]
    if a.ndim != 3 or a.shape[2] != 2:
        raise ValueError(f"actions: expected shape [m, T, 2], got {list(a.shape)}")
    s = np.broadcast_to(np.asarray(start, dtype=float), (a.shape[0], 4)).copy()
    out = np.empty((a.shape[0], a.shape[1], 4))
    for k in range(a.shape[1]):
        s = _step(s, a[:, k])
        out[:, k] = s
    return out[0] if squeeze else out


def other_car_trajectory() -> np.ndarray:
    """``[20, 2]`` positions of the lane-changing car after each step (base / different-reward scenarios)."""
    return rollout(OTHER_CAR_ACTIONS, OTHER_CAR_START)[:, :2]


@dataclass(frozen=True)
class Scenario:
    """One of Figure 1's scenarios: reward weights (over the 8 features), other cars, start speed."""

    name: str
    theta: tuple
    blocked: bool = False

    @property
    def start(self) -> tuple:
        return (START[0], START[1], START[2], 0.1) if self.blocked else START

    def cars(self) -> np.ndarray:
        """``[c, 20, 2]`` positions of the other cars at each step."""
        if self.blocked:
            return np.repeat(np.array(BLOCKING_CARS)[:, None, :], HORIZON, 1)
        return other_car_trajectory()[None]


SCENARIOS = {
    "base": Scenario("base", (1, 0, 0, 0, 0, 0, 0, 0)),
    "different reward": Scenario("different reward", (0, 1, 0, 0, 0, 0, 0, 0)),
    "different environment": Scenario("different environment", (1, 0, 0, 0, 0, 0, 0, 0), blocked=True),
}


def _check_lane_feature(lane_feature: str) -> str:
    if lane_feature not in LANE_FEATURES:
        raise ValueError(f"lane_feature: expected one of {LANE_FEATURES}, got {lane_feature!r}")
    return lane_feature


def features(actions, scenario: Scenario | str = "base", *, lane_feature: str = "squared") -> np.ndarray:
    """Table C.1's features summed over the 20 post-step states: ``[m, 20, 2]`` -> ``[m, 8]``.

    Args:
        lane_feature: the "stay in lane" feature (f4) is ``1 / (1 + exp(-b D + a))`` with ``D``
            the squared distance to the closest lane centre (``"squared"``, the authors' code,
            default) or the distance itself (``"absolute"``, Table C.1 as printed). With
            ``b = 10^4, a = 10`` the printed form saturates 2 mm from a lane centre, the code's
            at 4.5 cm.
    """
    _check_lane_feature(lane_feature)
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    states = rollout(actions, sc.start)
    squeeze = states.ndim == 2
    if squeeze:
        states = states[None]
    x, y, h, v = (states[..., i] for i in range(4))  # [m, T]
    lane_d = np.min(np.abs(x[..., None] - np.array(LANES)), axis=-1)
    if lane_feature == "squared":
        lane_d = lane_d**2
    cars = sc.cars()  # [c, T, 2]
    dx = x[:, None, :] - cars[None, :, :, 0]
    dy = y[:, None, :] - cars[None, :, :, 1]
    close = np.exp(-CAR_B * (CAR_CX * dx**2 + CAR_CY * dy**2) + CAR_B * CAR_A).sum(1)
    f = np.stack([
        -((v - TARGET_SPEED) ** 2),
        -((x - RIGHT_LANE) ** 2),
        (np.abs(x) > HALF_WIDTH).astype(float),
        1.0 / (1.0 + np.exp(np.clip(-LANE_B * lane_d + LANE_A, -700, 700))),
        np.abs(np.cos(h)),
        (v < 0).astype(float),
        (v > SPEED_LIMIT).astype(float),
        close,
    ], axis=-1).sum(1)
    return f[0] if squeeze else f


def cross_entropy_method(theta, scenario: Scenario | str = "base", *, constraint: bool = False, phi=PHI, tau: float = TAU,
                         iterations: int = 50, samples: int = 50, elites: int = 5, init_sd: float = 5.0,
                         seed: int = 0, lane_feature: str = "squared") -> np.ndarray:
    """Algorithm 4: the (constrained) cross-entropy method over 20-step action sequences.

    Unconstrained: keep the ``elites`` samples of highest return ``theta^T f``. Constrained
    (Wen & Topcu 2020): sort by constraint value ``J = phi^T f - tau``; if at least ``elites``
    samples are feasible (``J <= 0``) keep the feasible ones of highest return, else the
    ``elites`` of lowest ``J``. The Gaussian (diagonal) is refit to the elites.

    The samples are clipped to the action box ``[-1, 1]`` before they are scored, and the
    Gaussian is refit to those clipped elites, the action sequences whose features were
    evaluated: the CEM update (Rubinstein & Kroese 2004; Algorithm 4's ``mu, sigma <- mean,
    std of the elite set``) fits the sampling distribution to the elite *samples*, and a raw
    sample outside the box is not the controller that was scored. Refitting to the unclipped
    samples (before issue 16) moves the mean by amounts the score never saw, so the constrained
    method could return an infeasible controller (``phi^T f = 1.945`` in the blocked scenario,
    seed 0) although all-zero actions are feasible.

    Args:
        theta: ``[8]`` reward weights.
        constraint: solve ``max theta^T f s.t. phi^T f <= tau`` instead of ``max theta^T f``.
        seed: seeds the samples.
        lane_feature: ``"squared"`` or ``"absolute"`` (see ``features``).

    Returns:
        ``[20, 2]`` the final mean, clipped to ``[-1, 1]`` (the controller).
    """
    theta = np.asarray(theta, dtype=float)
    if theta.shape != (8,):
        raise ValueError(f"theta: expected 8 reward weights (Table C.1), got shape {list(theta.shape)}")
    rng = np.random.default_rng(seed)
    mu = np.zeros((HORIZON, 2))
    sd = np.full((HORIZON, 2), float(init_sd))
    phi = np.asarray(phi, dtype=float)
    for _ in range(iterations):
        w = np.clip(mu + sd * rng.standard_normal((samples, HORIZON, 2)), -1.0, 1.0)  # the scored samples
        f = features(w, scenario, lane_feature=lane_feature)
        ret = f @ theta
        if constraint:
            j = f @ phi - tau
            order = np.argsort(j, kind="stable")
            if j[order[elites - 1]] <= 0:
                feas = np.flatnonzero(j <= 0)
                order = feas[np.argsort(-ret[feas], kind="stable")]
            elite = w[order[:elites]]
        else:
            elite = w[np.argsort(-ret, kind="stable")[:elites]]
        mu = elite.mean(0)
        sd = elite.std(0)
    return np.clip(mu, -1.0, 1.0)


def handmade_controllers() -> np.ndarray:
    """``[69, 20, 2]`` simple controllers: straight at 21 constant accelerations in ``[-1, 1]``, and
    left/right lane changes (3 steps of steering, 3 back) starting at steps 0, 3, 6 for 4
    accelerations, and the same changes without the steer back (``[69 = 21 + 24 + 24]``)."""
    acts = []
    for acc in np.linspace(-1.0, 1.0, 21):
        a = np.zeros((HORIZON, 2))
        a[:, 1] = acc
        acts.append(a)
    for back in (True, False):
        for acc in (0.2, 0.41, 0.6, 1.0):
            for start in (0, 3, 6):
                for side in (-1.0, 1.0):
                    a = np.zeros((HORIZON, 2))
                    a[:, 1] = acc
                    a[start:start + 3, 0] = side
                    if back:
                        a[start + 3:start + 6, 0] = -side
                    acts.append(a)
    return np.stack(acts)


def candidate_controllers(scenario: Scenario | str = "base", *, penalties=(0.0, 0.5, 1.0, 2.0),
                          random_rewards: int = 10, seed: int = 0, cem_kwargs: dict | None = None,
                          lane_feature: str = "squared") -> np.ndarray:
    """``[m, 20, 2]`` the precomputed controllers of a driving CBAI problem (our choice; the paper
    does not list its set): ``handmade_controllers``, the constrained CEM solution, CEM
    solutions for ``theta - lambda phi`` per penalty, and CEM solutions for ``random_rewards``
    random reward vectors (``theta`` plus Gaussian weights scaled like ``phi``)."""
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    theta = np.asarray(sc.theta, dtype=float)
    kw = {**dict(cem_kwargs or {}), "lane_feature": _check_lane_feature(lane_feature)}
    rng = np.random.default_rng(seed)
    out = [cross_entropy_method(theta, sc, constraint=True, seed=seed, **kw)]
    for i, lam in enumerate(penalties):
        out.append(cross_entropy_method(theta - lam * PHI, sc, seed=seed + 1 + i, **kw))
    for i in range(random_rewards):
        direction = theta + rng.standard_normal(8) * np.array([1, 1, 0.3, 0.05, 0.05, 0.5, 0.3, 0.8])
        out.append(cross_entropy_method(direction, sc, seed=seed + 100 + i, **kw))
    return np.concatenate([handmade_controllers(), np.stack(out)])


def driving_problem(scenario: Scenario | str = "base", *, controllers=None, seed: int = 0, random_rewards: int = 10,
                    margin: float = 0.05, cem_kwargs: dict | None = None, lane_feature: str = "squared") -> CBAIProblem:
    """The CBAI problem of section 4.3 with binary feedback (appendix C.2).

    Arms ``z = (f(pi), 1) / s`` (9 features), reward ``(theta, 0)``, constraint ``psi = (phi, -tau)``,
    threshold 0, ``s = max |phi^T f - tau|``, so every ``psi^T z`` is in ``[-1, 1]`` and a query
    answers 1 with probability ``(psi^T z + 1) / 2``.

    Args:
        controllers: ``[m, 20, 2]`` (default: ``candidate_controllers``).
        margin: controllers with ``|psi^T z| < margin`` are left out (our choice: the constrained
            optimum of a continuous search sits on the boundary, and a gap ``C_min`` of 10^-4
            would need ~10^9 queries; the paper's ~10^5 queries for ACOL imply a gap of a few
            hundredths). ``0`` keeps every controller.
        lane_feature: ``"squared"`` (default, the authors' code) or ``"absolute"`` (Table C.1),
            for the features and the cross-entropy searches (see ``features``).
    """
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    _check_lane_feature(lane_feature)
    if controllers is None:
        controllers = candidate_controllers(sc, seed=seed, random_rewards=random_rewards, cem_kwargs=cem_kwargs,
                                            lane_feature=lane_feature)
    f = features(controllers, sc, lane_feature=lane_feature)
    _, keep = np.unique(np.round(f, 10), axis=0, return_index=True)
    keep = np.sort(keep)
    f, controllers = f[keep], np.asarray(controllers)[keep]
    cons = f @ PHI - TAU
    s = float(np.abs(cons).max())
    ok = np.abs(cons) >= margin * s
    f, controllers, cons = f[ok], controllers[ok], cons[ok]
    z = np.concatenate([f, np.ones((f.shape[0], 1))], axis=1) / s
    psi = np.concatenate([PHI, [-TAU]])
    theta = np.concatenate([np.asarray(sc.theta, float), [0.0]])
    return CBAIProblem(z, theta, psi, tau=0.0, feedback="binary", name=f"driving({sc.name})",
                       info={"scale": s, "controllers": controllers, "features": f, "margin": margin,
                             "lane_feature": lane_feature})
