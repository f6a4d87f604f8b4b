"""Property tests (hypothesis): shapes, batch equivalence and closed forms over generated inputs.

Each property is one a user relies on when they batch replications: a batch of R models is R
independent models, the order of observations does not matter to a conjugate posterior,
replication r of a batched random stream is the one-replication stream, and a safe policy
never leaves the set it was allowed to choose from.
"""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bayes_safe import TSASC, BayesianLinear, ReplicationRNG, ThompsonSampling, replication_seeds

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)
finite = st.floats(min_value=-5.0, max_value=5.0, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def regression_data(draw):
    """``(R, d, X [R, n, d], y [R, n], noise_std, prior_scale)`` as numpy arrays."""
    R = draw(st.integers(1, 4))
    d = draw(st.integers(1, 5))
    n = draw(st.integers(1, 12))
    X = draw(hnp.arrays(np.float64, (R, n, d), elements=finite))
    y = draw(hnp.arrays(np.float64, (R, n), elements=finite))
    noise = draw(st.floats(0.05, 3.0))
    scale = draw(st.floats(0.1, 10.0))
    return R, d, X, y, noise, scale


def _prior(d: int, scale: float):
    return dist.Normal(torch.zeros((), dtype=torch.float64), torch.tensor(scale, dtype=torch.float64)).expand([d]).to_event(1)


@SETTINGS
@given(regression_data())
def test_a_batch_of_models_equals_separate_models(data):
    R, d, X, y, noise, scale = data
    batched = BayesianLinear(_prior(d, scale), noise_std=noise, batch_shape=[R])
    batched.update(X, y)  # numpy in: converted at the boundary
    for r in range(R):
        alone = BayesianLinear(_prior(d, scale), noise_std=noise)
        alone.update(X[r], y[r])
        torch.testing.assert_close(batched.posterior_mean[r], alone.posterior_mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(batched.posterior_covariance[r], alone.posterior_covariance, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(regression_data())
def test_conjugate_posterior_is_the_closed_form_in_any_order(data):
    R, d, X, y, noise, scale = data
    one_by_one = BayesianLinear(_prior(d, scale), noise_std=noise, batch_shape=[R])
    order = np.random.default_rng(0).permutation(X.shape[1])
    for i in order:
        one_by_one.update(torch.from_numpy(X[:, i]), torch.from_numpy(y[:, i]))
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    precision = torch.eye(d, dtype=torch.float64) / scale**2 + Xt.mT @ Xt / noise**2
    mean = torch.linalg.solve(precision, (Xt.mT @ yt[..., None])[..., 0] / noise**2)
    torch.testing.assert_close(one_by_one.posterior_mean, mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(one_by_one.posterior_covariance, torch.linalg.inv(precision), rtol=1e-7, atol=1e-9)


@SETTINGS
@given(regression_data(), st.integers(1, 6))
def test_predict_and_sample_shapes(data, k):
    R, d, X, y, noise, scale = data
    m = BayesianLinear(_prior(d, scale), noise_std=noise, batch_shape=[R])
    m.update(X, y)
    cand = torch.randn(R, k, d, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    mean, var = m.predict(cand)
    assert mean.shape == var.shape == (R, k)
    assert (var >= 0).all()
    assert m.sample(torch.Generator().manual_seed(0)).shape == (R, d)
    assert m.sample_at(cand, torch.Generator().manual_seed(0)).shape == (R, k)


@SETTINGS
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 4), st.integers(1, 40))
def test_replication_r_of_a_batch_is_the_single_stream(seed, R, d, steps):
    seeds = replication_seeds(seed, R)
    batch = ReplicationRNG(seeds)
    singles = [ReplicationRNG([s]) for s in seeds]
    for _ in range(steps):
        drawn = batch.normal((d,), key="weights")
        assert drawn.shape == (R, d)
        for r in range(R):
            assert torch.equal(drawn[r], singles[r].normal((d,), key="weights")[0])


@st.composite
def decision_step(draw):
    R = draw(st.integers(1, 4))
    K = draw(st.integers(1, 7))
    d = draw(st.integers(1, 4))
    feats = draw(hnp.arrays(np.float64, (R, K, d), elements=finite))
    baseline = draw(hnp.arrays(np.int64, (R,), elements=st.integers(0, K - 1)))
    valid = draw(hnp.arrays(np.bool_, (R, K)))
    alpha = draw(st.floats(0.0, 0.99))
    return R, K, d, torch.from_numpy(feats), torch.from_numpy(baseline), torch.from_numpy(valid), alpha


@SETTINGS
@given(decision_step(), st.integers(0, 1000))
def test_tsasc_chooses_within_the_valid_set_or_the_baseline(step, seed):
    R, _, d, feats, baseline, valid, alpha = step
    models = [BayesianLinear(_prior(d, 1.0), noise_std=0.5, batch_shape=[R]) for _ in range(2)]
    policy = TSASC(models[0], [models[1]], alpha=alpha)
    action = policy.select(feats, baseline, generator=torch.Generator().manual_seed(seed), valid=valid)
    assert action.shape == (R,) and action.dtype == torch.long
    rows = torch.arange(R)
    assert (valid[rows, action] | (action == baseline)).all()


@SETTINGS
@given(decision_step(), st.integers(0, 1000))
def test_thompson_sampling_respects_the_valid_mask(step, seed):
    R, _, d, feats, _, valid, _ = step
    valid[:, 0] = True  # at least one valid action per replication
    policy = ThompsonSampling(BayesianLinear(_prior(d, 1.0), noise_std=0.5, batch_shape=[R]))
    action = policy.select(feats, generator=torch.Generator().manual_seed(seed), valid=valid)
    assert action.shape == (R,)
    assert valid[torch.arange(R), action].all()
