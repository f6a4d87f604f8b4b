"""The driving application (Lindner et al. 2022, appendix C)."""

import math

import numpy as np
import pytest

from bayes_safe.identification import driving as drv


def test_dynamics_euler_step():
    a = np.zeros((1, 2))
    s = drv.rollout(np.zeros((1, 2)))[0]  # one step from the start, no action
    x, y, h, v = drv.START
    assert s[0] == pytest.approx(x + 0.2 * v * math.cos(h))
    assert s[1] == pytest.approx(y + 0.2 * v * math.sin(h))
    assert s[3] == pytest.approx(v + 0.2 * (0 - v))
    assert a.shape == (1, 2)


def test_velocity_is_clipped_and_actions_clipped():
    acts = np.zeros((20, 2))
    acts[:, 1] = 50.0  # clipped to 1
    states = drv.rollout(acts)
    assert states[:, 3].max() <= 1.0 + 1e-12
    np.testing.assert_allclose(states, drv.rollout(np.clip(acts, -1, 1)))


def test_other_car_changes_lane():
    traj = drv.other_car_trajectory()
    assert traj.shape == (20, 2)
    assert traj[0, 0] == pytest.approx(0.17)
    assert abs(traj[-1, 0]) < 0.05  # ends near the middle lane
    assert np.all(np.diff(traj[:, 1]) > 0)


def test_features_of_straight_driving():
    acts = np.zeros((20, 2))
    acts[:, 1] = 0.4  # keeps v = 0.4 after the first steps
    f = drv.features(acts, "different environment")
    assert f.shape == (8,)
    assert f[2] == 0 and f[5] == 0 and f[6] == 0  # on street, forward, below 0.6
    assert f[3] < 1e-3  # x stays exactly 0: in lane
    assert f[4] < 1e-9  # heading pi/2: aligned
    assert f[7] > 0  # drives into the blocking cars
    # keep-speed feature is a negated square
    assert f[0] <= 0


def test_car_distance_uses_ten_in_x():
    # a single state right beside the other car: exp(-30 (10 dx^2 + dy^2) + 0.3)
    states = np.zeros((1, 20, 4))
    traj = drv.other_car_trajectory()
    dx, dy = 0.1, 0.0
    expect = math.exp(-30 * (10 * dx**2 + dy**2) + 30 * 0.01)
    val = math.exp(-drv.CAR_B * (drv.CAR_CX * dx**2 + drv.CAR_CY * dy**2) + drv.CAR_B * drv.CAR_A)
    assert val == pytest.approx(expect)
    assert states.shape[1] == traj.shape[0]


def test_cem_constrained_is_feasible_and_deterministic():
    theta = np.array(drv.SCENARIOS["base"].theta, float)
    kw = {"iterations": 15, "samples": 30, "elites": 5}
    a = drv.cross_entropy_method(theta, "base", constraint=True, seed=0, **kw)
    b = drv.cross_entropy_method(theta, "base", constraint=True, seed=0, **kw)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (20, 2) and np.abs(a).max() <= 1
    f = drv.features(a, "base")
    assert f @ drv.PHI <= drv.TAU + 1e-6
    with pytest.raises(ValueError, match="theta"):
        drv.cross_entropy_method(np.ones(3))


@pytest.mark.parametrize("scenario", list(drv.SCENARIOS))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kw", [{}, {"iterations": 15, "samples": 30, "elites": 5}], ids=["default", "short"])
def test_cem_constrained_solution_satisfies_the_constraint(scenario, seed, kw):
    # the constraint itself, phi^T f <= tau, not a looser bound (issue 16, item 4)
    theta = np.array(drv.SCENARIOS[scenario].theta, float)
    c = drv.cross_entropy_method(theta, scenario, constraint=True, seed=seed, **kw)
    assert np.abs(c).max() <= 1
    assert drv.features(c, scenario) @ drv.PHI <= drv.TAU + 1e-6


def test_cem_refits_on_the_clipped_samples_issue16_reproduction():
    # issue 16, item 4: refitting the Gaussian on the unclipped samples while scoring the clipped
    # ones returned phi^T f = 1.945 here, although all-zero actions are feasible
    sc = "different environment"
    theta = np.array(drv.SCENARIOS[sc].theta, float)
    assert drv.features(np.zeros((20, 2)), sc) @ drv.PHI < 1e-3
    c = drv.cross_entropy_method(theta, sc, constraint=True, seed=0)
    assert drv.features(c, sc) @ drv.PHI <= drv.TAU + 1e-6


def test_driving_problem_binary_normalised():
    ctrl = drv.handmade_controllers()
    p = drv.driving_problem("base", controllers=ctrl)
    c = p.constraint_values
    assert p.feedback == "binary" and p.dim == 9
    assert np.abs(c).max() <= 1 + 1e-12 and np.abs(c).min() >= 0.05 - 1e-12
    assert p.feasible.any() and (~p.feasible).any()
    raw = p.info["features"] @ drv.PHI - drv.TAU
    np.testing.assert_allclose(c, raw / p.info["scale"])
