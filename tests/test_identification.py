"""Constrained linear best-arm identification (Lindner et al. 2022): designs, rounding, learners."""

import numpy as np
import pytest

from bayes_safe.identification import (
    ACOL,
    ALGORITHMS,
    GACOL,
    CBAIProblem,
    GAllocation,
    Greedy,
    Oracle,
    Uniform,
    connected_1d,
    design_value,
    irrelevant_dimensions,
    make_learner,
    optimal_design,
    round_design,
    rounding_min_samples,
    simulate,
    unit_sphere,
)
from bayes_safe.identification.algorithms import simulate_greedy_batch


# ----------------------------------------------------------------------------- designs
def test_design_orthonormal_basis_is_uniform():
    r = optimal_design(np.eye(5))
    np.testing.assert_allclose(r.weights, 0.2, atol=1e-6)
    assert r.value == pytest.approx(5.0, rel=1e-6)


def test_design_kiefer_wolfowitz_value_is_dimension():
    x = np.random.default_rng(0).standard_normal((40, 4))
    r = optimal_design(x, tol=1e-3)
    assert 4.0 <= r.value <= 4.0 * 1.001 + 1e-9
    assert r.lower_bound == pytest.approx(4.0)
    # the general (primal-dual) route finds the same optimum within its certified gap
    g = optimal_design(x, targets=x, target_weights=np.ones(40), tol=1e-2)
    assert g.lower_bound <= 4.0 + 1e-9 and g.value <= 4.0 * 1.011


def test_design_c_optimal_two_arms():
    # min_lambda 1/l1 + 1/l2 = 4 at (1/2, 1/2) (Elfving)
    r = optimal_design(np.eye(2), targets=np.array([[1.0, 1.0]]))
    np.testing.assert_allclose(r.weights, [0.5, 0.5], atol=1e-3)
    assert r.value == pytest.approx(4.0, rel=1e-3)


def test_design_subset_of_basis_ignores_other_arms():
    r = optimal_design(np.eye(5), targets=np.eye(5)[:3])
    np.testing.assert_allclose(r.weights, [1 / 3, 1 / 3, 1 / 3, 0, 0], atol=1e-3)
    assert r.value == pytest.approx(3.0, rel=1e-2)


def test_design_irrelevant_dimensions_puts_mass_on_the_long_arm():
    p = irrelevant_dimensions(10, 0.05)
    r = optimal_design(p.arms, targets=p.arms[-2:], tol=1e-3)
    assert r.weights[-1] > 0.95 and r.value == pytest.approx(1.0, rel=2e-2)
    assert r.lower_bound <= 1.0 + 1e-9


def test_design_value_and_certificate_are_consistent():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 6))
    r = optimal_design(x, targets=x[:10], tol=1e-2)
    assert design_value(x, r.weights, x[:10]) == pytest.approx(r.value, rel=1e-8)
    assert r.lower_bound <= r.value <= r.lower_bound * 1.0101
    # any other design is no better than the certified lower bound
    for _ in range(5):
        w = rng.dirichlet(np.ones(60))
        assert design_value(x, w, x[:10]) >= r.lower_bound


def test_design_fewer_arms_than_dimensions():
    p = unit_sphere(10, 30, seed=0)
    r = optimal_design(p.arms, targets=p.arms[:3])
    assert np.isfinite(r.value) and r.value > 0


def test_rounding_sums_and_efficiency():
    rng = np.random.default_rng(2)
    for _ in range(50):
        p = int(rng.integers(1, 12))
        w = rng.dirichlet(np.ones(p))
        n = int(rng.integers(p, 200))
        c = round_design(w, n)
        assert c.sum() == n and (c >= 0).all()
        assert np.all(c >= (n - p) * w - 1e-9)  # the bound behind rounding_min_samples
    assert rounding_min_samples(10, 0.1) == 110
    c = round_design([0.5, 0.5, 0.0], 3)
    assert c.sum() == 3 and c[2] == 0
    assert round_design(np.full(100, 0.01), 7).sum() == 7  # fewer pulls than support points


# ----------------------------------------------------------------------------- bad input
def test_bad_input_is_named():
    arms = np.eye(3)
    with pytest.raises(ValueError, match="theta"):
        ACOL(arms, np.ones(2))
    with pytest.raises(ValueError, match="arms"):
        GACOL(np.zeros((0, 3)), np.ones(3))
    with pytest.raises(ValueError, match="duplicates"):
        GACOL(np.vstack([arms, arms[:1]]), np.ones(3))
    for bad in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ValueError, match="delta"):
            GACOL(arms, np.ones(3), delta=bad)
    g = GACOL(arms, np.ones(3), feedback="binary")
    for bad in (2, -1, 0.5):
        with pytest.raises(ValueError, match="binary feedback"):
            g.observe(0, bad)
    with pytest.raises(ValueError, match="theta"):
        CBAIProblem(arms, np.ones(4), np.ones(3))
    with pytest.raises(ValueError, match="phi"):
        CBAIProblem(arms * 3, np.ones(3), np.ones(3), feedback="binary")
    with pytest.raises(ValueError, match="arm"):
        g.observe(7, 1)
    with pytest.raises(ValueError, match="name"):
        make_learner("ACOL-ish", arms, np.ones(3))
    with pytest.raises(ValueError, match="Oracle"):
        make_learner("Oracle", arms, np.ones(3))


# ----------------------------------------------------------------------------- problems
def test_instances():
    p = irrelevant_dimensions(6, 0.1)
    assert p.arms.shape == (7, 6) and list(p.optimal_arms) == [5] and p.c_min == pytest.approx(0.1)
    s = unit_sphere(20, 5, seed=3)
    np.testing.assert_allclose(np.linalg.norm(s.arms, axis=1), 1.0)
    c = s.constraint_values
    assert (c > 0).any() and (c <= 0).any()
    one = connected_1d()  # the authors' grid 0.1, ..., 1.0 (issue 16, item 6)
    assert one.arms.shape == (10, 1) and list(one.optimal_arms) == [1] and one.c_min == pytest.approx(0.05)
    lin = connected_1d(grid="linspace")
    assert lin.arms[0, 0] == 0.0 and list(lin.optimal_arms) == [2]


def test_sample_sums_match_single_draws_in_mean():
    p = irrelevant_dimensions(3, 0.1)
    rng = np.random.default_rng(0)
    sums = p.sample_sums(np.full(4, 10_000), rng)
    np.testing.assert_allclose(sums / 10_000, p.constraint_values, atol=0.01)


# ----------------------------------------------------------------------------- learners
@pytest.mark.parametrize("name", [n for n in ALGORITHMS if "Max Rew-F" not in n and n not in
                                  ("Greedy Max Var", "Adaptive Uniform", "G-ACOL Uniform")])
def test_every_algorithm_finds_the_optimum(name):
    p = irrelevant_dimensions(4, 0.2)
    learner = make_learner(name, p.arms, p.theta, p.tau, phi=p.phi, seed=0)
    r = simulate(learner, p, seed=1, max_queries=300_000)
    assert r.finished and r.correct, (name, r)


@pytest.mark.parametrize("name", ["Max Rew-F (tuned)", "Max Rew-U (tuned)", "G-ACOL (tuned)"])
def test_regret_style_baselines_on_connected_instance(name):
    p = connected_1d()
    r = simulate(make_learner(name, p.arms, p.theta, p.tau, seed=0), p, seed=2, max_queries=100_000)
    assert r.finished and r.correct


def test_acol_round_lengths_follow_algorithm_1():
    p = irrelevant_dimensions(5, 0.1)
    a = ACOL(p.arms, p.theta, p.tau, seed=0)
    simulate(a, p, seed=0)
    t = 1
    dt = 0.05**2 / (t**2 * a.n)
    n1 = int(np.ceil(2 ** (2 * t + 3) * np.log(1 / dt) * 1.1 * a.design_values[0]))
    assert a.round_lengths[0] == max(n1, rounding_min_samples(6, 0.1))
    assert a.design_values[0] == pytest.approx(5.0, rel=1e-2)  # U_1 = X: G-optimal value d
    u = Uniform(p.arms, p.theta, p.tau)
    assert u.round_length(3) == int(np.ceil(2**3 * np.log(9 * 6 / 0.05**2)))


def test_step_interface_matches_simulation_for_greedy():
    """A person answering step by step gets the same queries as the batch engine (same answers)."""
    p = irrelevant_dimensions(4, 0.2)
    res = simulate_greedy_batch([p], rule="max_var", pool="uncertain", beta=0.25, seeds=[5])[0]
    noise = np.random.default_rng(np.random.SeedSequence(5).spawn(2)[0]).standard_normal(4096) * p.noise_sd
    g = GACOL(p.arms, p.theta, p.tau, beta=0.25)
    asked = 0
    while not g.done:
        arm = g.next_query()
        g.observe(arm, p.constraint_values[arm] + noise[asked])
        asked += 1
    assert asked == res.queries and g.recommendation == res.recommendation


def test_batch_results_do_not_depend_on_batch_size():
    probs = [unit_sphere(12, 4, seed=s) for s in range(4)]
    for rule, pool in (("uniform", "uncertain"), ("max_var", "all")):
        together = simulate_greedy_batch(probs, rule=rule, pool=pool, beta=0.25, seeds=[0, 1, 2, 3], max_queries=20_000)
        alone = [simulate_greedy_batch([q], rule=rule, pool=pool, beta=0.25, seeds=[s], max_queries=20_000)[0]
                 for q, s in zip(probs, range(4))]
        assert [r.queries for r in together] == [r.queries for r in alone]


def test_round_based_step_interface_and_round_feed_agree():
    p = irrelevant_dimensions(3, 0.3)
    a = GAllocation(p.arms, p.theta, p.tau, seed=0)
    counts = a.pending_counts()
    rng = np.random.default_rng(0)
    # answer the first round step by step, in the order asked
    while a.round == 0:
        arm = a.next_query()
        a.observe(arm, p.sample(arm, rng))
    assert a.num_queries == counts.sum() and a.round == 1
    with pytest.raises(ValueError, match="asked for arm"):
        other = (a.next_query() + 1) % a.n
        a.observe(other, 0.0)


def test_binary_feedback_and_person_loop():
    p = CBAIProblem(np.array([[0.2, 1.0], [0.6, 1.0], [-0.5, 1.0]]) / 2, np.array([1.0, 0.0]), np.array([1.0, -0.1]),
                    tau=0.0, feedback="binary")
    rng = np.random.default_rng(3)
    g = GACOL(p.arms, p.theta, p.tau, feedback="binary", beta=4.0, seed=0)
    r = g.run(lambda arm: p.sample(arm, rng), max_queries=50_000)
    assert r.finished and p.is_correct(r.recommendation)
    with pytest.raises(RuntimeError, match="U is empty"):
        g.next_query()


def test_oracle_design_targets_higher_reward_arms():
    p = irrelevant_dimensions(5, 0.1)
    o = Oracle(p.arms, p.theta, p.tau, phi=p.phi)
    lam = o.allocation(1)
    assert lam[:4].sum() < 1e-6  # arms e_1..e_4 have lower reward than x*


def test_greedy_theory_multiplier_is_proposition_3():
    p = irrelevant_dimensions(3, 0.1)
    g = Greedy(p.arms, p.theta, p.tau, beta="theory", phi_norm_bound=1.0)
    t = 100
    expect = np.sqrt(3 * np.log((1 + t * 1.1**2 / 0.1) / 0.05)) + np.sqrt(0.1)
    assert g.multiplier(t) == pytest.approx(expect)
    assert Greedy(p.arms, p.theta, beta=0.25).multiplier(5) == 0.5
