"""Issue 41 item 6: a log's propensities in batched calls (``Policy.row_probabilities``).

``DecisionLog.target_probabilities`` and the decision-log tuner asked ``action_probabilities`` one
logged row at a time. Models of one stream that draw rows independently (conjugate, NUTS / SVI
``BayesianLinear`` without a batch shape or with ``[1]``) now answer many rows per call, each row
with its own draws: the law of the per-row call (checked here against it, within Monte-Carlo
error, and for independence across rows). Chain engines (Gibbs) keep the per-row path.
"""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.envs import Constraint
from bayes_safe.models import BayesianLinear
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.policies import TSASC, ThompsonSampling
from bayes_safe.random import DrawBatch

F64 = torch.float64
D, K = 4, 6


def _model(batch_shape=(), noise="known", seed=0, n=30):
    prior = dist.Normal(torch.zeros(D, dtype=F64), 1.0).to_event(1)
    if noise == "nig":
        m = BayesianLinear(prior, noise_prior=dist.InverseGamma(3.0, 0.5), batch_shape=batch_shape)
    elif noise == "gibbs":
        m = BayesianLinear(dist.Laplace(torch.zeros(D, dtype=F64), 1.0).to_event(1), noise_std=0.5,
                           inference="gibbs", batch_shape=batch_shape)
    else:
        m = BayesianLinear(prior, noise_std=0.5, batch_shape=batch_shape)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, D, generator=g, dtype=F64)
    y = X @ torch.tensor([0.5, -0.3, 0.2, 0.1], dtype=F64) + 0.5 * torch.randn(n, generator=g, dtype=F64)
    m.update(X[None] if batch_shape else X, y[None] if batch_shape else y)
    return m


def _rows(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n, K, D, generator=g, dtype=F64)
    sizes = torch.tensor([K if i % 3 else K - 2 for i in range(n)])
    return features, sizes, torch.zeros(n, dtype=torch.long)


def _within_mc_error(a, b, S_a, S_b, z=5.0):
    p = (a + b) / 2
    se = (p * (1 - p) * (1 / S_a + 1 / S_b)).sqrt()
    return bool(((a - b).abs() <= z * se + 1e-9).all()), float(((a - b).abs() / (se + 1e-12)).max())


@pytest.mark.parametrize("kind", ["alpha", "declared", "batch1", "nig", "thompson"])
def test_batched_rows_have_the_law_of_the_per_row_calls(kind):
    shape = [1] if kind == "batch1" else []
    reward = _model(shape, "nig" if kind == "nig" else "known", seed=1)
    if kind == "thompson":
        policy = ThompsonSampling(reward)
    elif kind == "declared":  # TS-ASC off the paper path: a chance cap (closed form), the fallback
        policy = TSASC(reward, [_model(shape, seed=2)], metric_names=["r", "c"],
                       constraints=[Constraint.absolute("c", at_most=0.2, confidence=0.7)])
    else:
        policy = TSASC(reward, [_model(shape, seed=2)], alpha=0.1)
    assert policy.row_draws()
    features, sizes, base = _rows()
    S = 3000
    fast, se = policy.row_probabilities(features, base, num_actions=sizes, num_draws=S, seed=0)
    slow, _ = policy.row_probabilities(features, base, num_actions=sizes, num_draws=S, seed=1, batched=False)
    pad = torch.arange(K)[None] >= sizes[:, None]
    assert bool((fast[pad] == 0).all()) and bool((slow[pad] == 0).all())
    assert torch.allclose(fast.sum(1), torch.ones(len(sizes), dtype=F64))
    assert torch.equal(se, (fast * (1 - fast) / S).sqrt())
    ok, worst = _within_mc_error(fast, slow, S, S)
    assert ok, worst
    # reproducible given the seed, and the rows per call do not change the law
    again, _ = policy.row_probabilities(features, base, num_actions=sizes, num_draws=S, seed=0)
    assert torch.equal(fast, again)
    small, _ = policy.row_probabilities(features, base, num_actions=sizes, num_draws=S, seed=2, rows_per_call=5)
    assert _within_mc_error(small, slow, S, S)[0]


def test_each_row_draws_on_its_own():
    """One draw per row at 400 copies of one decision: the rows' choices spread as that decision's
    probabilities (draws shared by the rows would make every row choose alike)."""
    policy = TSASC(_model(seed=1), [_model(seed=2)], alpha=0.1)
    features, _, _ = _rows(1)
    n = 400
    p, _ = policy.action_probabilities(features, torch.tensor([0]), num_draws=20_000, seed=0)
    assert float(p.max()) < 0.9  # a decision the posterior is unsure of
    rows, _ = policy.row_probabilities(features.expand(n, K, D), torch.zeros(n, dtype=torch.long), num_draws=1, seed=0)
    share = rows.mean(0)
    assert bool(((share - p[0]).abs() <= 5 * (p[0] * (1 - p[0]) / n).sqrt() + 1e-9).all()), (share, p[0])
    # the model's own draws: [S, n, K], independent across rows, and [S, K] per row of sample_at's law
    m = policy.reward_model
    draws = m.sample_at(features.expand(n, K, D), DrawBatch(2, n, seed=0, independent_rows=True))
    assert tuple(draws.shape) == (2, n, K) and float(draws[0].std(0).min()) > 0


def test_the_log_propensities_of_a_gibbs_model_keep_the_per_row_path(tmp_path):
    reward = _model(noise="gibbs", seed=1, n=20)
    policy = TSASC(reward, [_model(seed=2)], alpha=0.1)
    assert not policy.row_draws()
    log = DecisionLog(tmp_path / "log.sqlite")
    decider = Decider(policy, log=log, num_draws=30, update_every=50, seed=0)
    rng = np.random.default_rng(0)
    for i in range(6):
        d = decider.decide(rng.normal(size=(K if i % 2 else K - 2, D)), baseline=0)
        decider.feedback(d.decision_id, float(rng.normal()), [float(rng.normal())])
    state = (reward.engine.state.w.clone(), reward.engine.n)
    probs = log.target_probabilities(policy, num_draws=30, seed=0)
    assert torch.equal(probs, log.target_probabilities(policy, num_draws=30, seed=0, batched=False))
    data = log.to_logged_data()
    assert bool((probs[~data.action_mask] == 0).all()) and torch.allclose(probs.sum(1), torch.ones(6, dtype=F64))
    assert torch.equal(reward.engine.state.w, state[0]) and reward.engine.n == state[1]  # a query: the chain did not move
    features, sizes, base = _rows(3)
    with pytest.raises(ValueError, match="row_draws"):
        policy.row_probabilities(features, base, num_actions=sizes, num_draws=10, batched=True)
    log.close()


def test_bad_rows_are_refused_with_the_argument_named():
    policy = TSASC(_model(seed=1), [_model(seed=2)], alpha=0.1)
    features, _, base = _rows(3)
    with pytest.raises(ValueError, match="num_actions"):
        policy.row_probabilities(features, base, num_actions=[K + 1, 2, 2], num_draws=5)
    with pytest.raises(ValueError, match="baseline: row 0"):
        policy.row_probabilities(features, torch.tensor([5, 0, 0]), num_actions=[3, K, K], num_draws=5)
    with pytest.raises(ValueError, match="features"):
        policy.row_probabilities(features[0], base, num_draws=5)


@pytest.mark.slow  # a NUTS and an SVI fit (5-6 s each)
@pytest.mark.parametrize("inference", ["svi", "nuts"])
def test_stored_draws_engines_answer_many_rows_with_the_law_of_the_per_row_calls(inference):
    model = BayesianLinear(dist.Laplace(torch.zeros(D, dtype=F64), 1.0).to_event(1), noise_std=0.5,
                           inference=inference)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, D, generator=g, dtype=F64)
    model.update(X, X @ torch.tensor([0.5, -0.3, 0.2, 0.1], dtype=F64) + 0.5 * torch.randn(30, generator=g, dtype=F64))
    policy = ThompsonSampling(model)
    assert policy.row_draws()
    features, sizes, base = _rows()
    fast, _ = policy.row_probabilities(features, base, num_actions=sizes, num_draws=3000, seed=0)
    slow, _ = policy.row_probabilities(features, base, num_actions=sizes, num_draws=3000, seed=1, batched=False)
    assert bool((fast[torch.arange(K)[None] >= sizes[:, None]] == 0).all())
    ok, worst = _within_mc_error(fast, slow, 3000, 3000)
    assert ok, worst
