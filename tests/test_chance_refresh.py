"""Chance constraints from a refreshed bank of draws (issue 42, item 2: ``TSASC(chance_refresh=m)``).

* the bank is drawn when due (no bank, ``m`` rows learnt, or the rows doubled) and not before;
* right after a refresh its probabilities are the fresh draws' (the same numbers under an ordinary
  generator; within Monte-Carlo error under the Decider's draw batch);
* a query (``action_probabilities``) never refreshes it; models without weights draw fresh;
* it runs in ``simulate`` (a bank per replication), in a ``Decider`` and through a state round trip
  (the option and the bank are saved: the copy's probabilities are the original's);
* bad values are refused by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, simulate
from bayes_safe.policies.ts_asc import CHANCE_REFRESH_DEFAULT
from bayes_safe.random import DrawBatch

sys.path.insert(0, str(Path(__file__).parent))
from test_chance_calibration import Binary

F64 = torch.float64


def _prior():
    return dist.Normal(torch.zeros(2, dtype=F64), 1.0).to_event(1)


def _constraint_model(kind, shape):
    if kind == "nig":  # conjugate, but drawn (its predictive is Student-t)
        return BayesianLinear(_prior(), noise_prior=dist.InverseGamma(2.0, 0.5), batch_shape=shape)
    return BayesianLinear(_prior(), likelihood="logistic", batch_shape=shape)


def _policy(kind, R=2, **options):
    problem = Binary(R)
    shape = () if R is None else (R,)
    reward = BayesianLinear(_prior(), noise_std=1.0, batch_shape=shape)
    policy = TSASC(reward, [_constraint_model(kind, shape)], constraints=problem.constraints,
                   metric_names=problem.metric_names, **options)
    return problem, policy


def _step(problem, policy, g, R=2):
    units = problem.draw(R, g)
    a = policy.select(units.features, units.baseline, generator=g)
    out = problem.outcomes(units, a)
    policy.update(units.features[torch.arange(R), a], out[:, 0], out[:, 1:])
    return units


@pytest.mark.parametrize("kind", ["nig", "logistic"])
def test_bank_refreshes_when_due_and_not_before(kind):
    problem, policy = _policy(kind, chance_refresh=4)
    g = torch.Generator().manual_seed(0)
    counts = []
    for _ in range(14):
        units = _step(problem, policy, g)
        counts.append(policy.chance_refreshes)
    # decision t (0-based) sees t rows: due with no bank (t = 0), then when the rows since the refresh reach
    # min(4, rows at the refresh): refreshes at t = 0, 1, 2, 4, 8, 12
    assert counts == [1, 2, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6]
    # decisions without new rows reuse the bank: the same probabilities
    p = policy.constraint_probabilities(units.features, units.baseline, generator=g)
    q = policy.constraint_probabilities(units.features, units.baseline, generator=g)
    assert policy.chance_refreshes == 6 and torch.equal(p, q)  # 14 rows: 2 since the refresh at 12


@pytest.mark.parametrize("kind", ["nig", "logistic"])
def test_right_after_a_refresh_the_bank_is_the_fresh_draws(kind):
    """Under an ordinary generator the bank's draws are made from the same streams as the fresh draws: at a
    refresh the probabilities are equal, not only in law."""
    out = []
    for refresh in (None, 1):
        problem, policy = _policy(kind, chance_refresh=refresh)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            _step(problem, policy, g)
        units = problem.draw(2, g)
        out.append(policy.constraint_probabilities(units.features, units.baseline, generator=g))
        assert policy.chance_refreshes == (0 if refresh is None else 4)  # at 0, 1, 2 and 3 rows: this query's
    assert torch.allclose(out[0], out[1], atol=1e-12)


def test_decider_batch_agrees_within_monte_carlo_error():
    """Under a played ``DrawBatch`` (the Decider) the bank's draws are ordinary draws, the fresh ones come
    from the batch: the same law. Conjugate NIG (independent draws), S = 1000: within 4 standard errors."""
    S = 1000
    probs = []
    for refresh in (None, 1):
        problem, policy = _policy("nig", R=None, confidence_draws=S, chance_refresh=refresh)
        g = torch.Generator().manual_seed(2)
        units = problem.draw(6, g)
        a = torch.randint(0, 3, (6,), generator=g)
        out = problem.outcomes(units, a)
        policy.update(units.features[torch.arange(6), a], out[:, 0], out[:, 1:])  # learnt without decisions
        units = problem.draw(1, torch.Generator().manual_seed(9))
        policy.select(units.features, units.baseline, generator=DrawBatch(5, 1, torch.Generator().manual_seed(3),
                                                                          played=True))
        assert policy.chance_refreshes == (refresh or 0)
        probs.append(policy.last_chance_claims[0][0, 0])
    se = (probs[0] * (1 - probs[0]) / S).sqrt() * 2 ** 0.5
    assert bool(((probs[0] - probs[1]).abs() <= 4 * se + 1e-9).all())


def test_a_query_never_refreshes_the_bank():
    problem, policy = _policy("logistic", chance_refresh=2)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        _step(problem, policy, g)
    before = policy.chance_refreshes
    state = policy.constraint_models[0].engine.state.w.clone()
    units = problem.draw(2, g)
    policy.action_probabilities(units.features, units.baseline, num_draws=20, generator=g)
    assert policy.chance_refreshes == before
    assert torch.equal(policy.constraint_models[0].engine.state.w, state)


def test_simulate_keeps_one_bank_per_replication():
    R = 3
    problem, policy = _policy("logistic", R=R, chance_refresh=4, confidence_draws=8)
    trace = simulate(policy, problem, 10, seed=0, progress=False)
    (model, weights, rows) = policy._bank[1]
    assert model is policy.constraint_models[0] and weights.shape == (8, R, 2) and rows == 8
    assert policy.chance_refreshes == 5  # t = 0, 1, 2, 4, 8
    assert trace.chance_claims["claimed"].shape == (10, R, 1)


def test_decider_and_state_round_trip(tmp_path):
    from bayes_safe.online.decider import Decider

    problem, policy = _policy("logistic", R=None, chance_refresh=5, confidence_draws=16)
    decider = Decider(policy, seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        units = problem.draw(1, g)
        d = decider.decide(units.features[0].numpy(), 0)
        out = problem.outcomes(units, torch.tensor([d.action]))
        decider.feedback(d.decision_id, float(out[0, 0]), [float(out[0, 1])])
    assert policy.chance_refreshes == 3  # 0, 1 and 2 rows (4 rows: 4 - 2 >= min(5, 2) is due at the next)
    decider.save(tmp_path / "state")
    loaded = Decider.load(tmp_path / "state")
    # the option and the bank are saved: the copy's probabilities are the original's
    assert loaded.policy.chance_refresh == 5 and loaded.policy.chance_refreshes == 0
    (model, weights, rows) = loaded.policy._bank[1]
    assert model is loaded.policy.constraint_models[0] and rows == 2 and torch.equal(weights, policy._bank[1][1])
    units = problem.draw(1, g)
    x = units.features[0].numpy()
    again, _ = loaded.policy.action_probabilities(x[None], baseline=0, num_draws=32, seed=3)
    torch.testing.assert_close(again, policy.action_probabilities(x[None], baseline=0, num_draws=32, seed=3)[0])
    assert loaded.policy.chance_refreshes == 0  # a query: the bank is due (4 rows) but not drawn
    loaded.decide(x, 0)
    assert loaded.policy.chance_refreshes == 1 and loaded.policy._bank[1][2] == 4


def test_models_without_weights_draw_fresh():
    from bayes_safe.models import PerArmLinear

    problem = Binary(2)
    reward = BayesianLinear(_prior(), noise_std=1.0, batch_shape=(2,))
    per_arm = PerArmLinear(_prior(), 3, noise_std=0.5, batch_shape=(2,))
    policy = TSASC(reward, [per_arm], constraints=problem.constraints, metric_names=problem.metric_names,
                   confidence_draws=8, chance_refresh=4)
    simulate(policy, problem, 4, seed=0, progress=False)
    assert policy.chance_refreshes == 0 and policy._bank == {}


def test_default_and_fresh_option():
    assert _policy("nig")[1].chance_refresh == CHANCE_REFRESH_DEFAULT
    assert _policy("nig", chance_refresh=None)[1].chance_refresh is None


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "16"])
def test_bad_values_are_refused_by_name(value):
    with pytest.raises(ValueError, match="chance_refresh"):
        _policy("nig", chance_refresh=value)
