"""The quick paths of one stream (issue 27, item 3) give the general paths' numbers and errors.

``ThompsonSampling.select``'s buffered decision (``BayesianLinear._thompson_argmax``), TS-ASC's
stacked propensity draws (``BayesianLinear._stacked_draws_at``, ``TSASC._select_stacked``), the
one-row updates that share their views, the batched factorisation, the Decider's numpy-built
outcome rows, and the quick checks' errors. No timing here: ``benchmarks/single_stream.py``
measures the speed.
"""

from __future__ import annotations

import threading

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling
from bayes_safe.online import Decider
from bayes_safe.random import DrawBatch


def _model(d: int = 4, noise: float = 0.5, batch=(1,)) -> BayesianLinear:
    return BayesianLinear(dist.Normal(torch.zeros(d, dtype=torch.float64), 1.0).to_event(1), noise_std=noise,
                          batch_shape=list(batch))


def _taught(model: BayesianLinear, rows: int = 6, seed: int = 0) -> BayesianLinear:
    g = torch.Generator().manual_seed(seed)
    R = model.batch_shape[0] if len(model.batch_shape) else 1
    for _ in range(rows):
        x = torch.randn(R, model.dim, generator=g, dtype=torch.float64)
        model.update(x if len(model.batch_shape) else x[0], torch.randn(R, generator=g, dtype=torch.float64)
                     if len(model.batch_shape) else torch.randn((), generator=g, dtype=torch.float64))
    return model


@pytest.mark.parametrize("R", [1, 3])
@pytest.mark.parametrize("inference", [False, True])
def test_buffered_thompson_decision_is_sample_ats_argmax(R, inference):
    """Step by step (an update between decisions), the buffered decision equals the argmax of
    ``sample_at`` drawn from an identically seeded generator, and select's general path
    (a ``valid`` mask) plays the same actions."""
    X = torch.randn(R, 30, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b, c = (_model(batch=(R,)) for _ in range(3))
    g1, g2, g3 = (torch.Generator().manual_seed(7) for _ in range(3))
    allowed = torch.ones(R, 30, dtype=torch.bool)
    with torch.inference_mode(inference):
        for t in range(40):
            taken = a.__dict__.pop("_argmax_buffers", None)
            fast = ThompsonSampling(a).select(X, generator=g1)  # the buffered decision where it applies
            ref = b.sample_at(X, g2, key="reward").argmax(-1)
            general = ThompsonSampling(c).select(X, generator=g3, valid=allowed)
            assert torch.equal(fast, ref) and torch.equal(fast, general)
            # it applies after the first observation (before it, a batch shares one prior factor)
            assert t == 0 or "_argmax_buffers" in a.__dict__
            if taken is not None and t > 1:
                a._argmax_buffers = taken
            rows = X[torch.arange(R), fast]
            y = torch.full((R,), 0.1 * t, dtype=torch.float64)
            for m in (a, b, c):
                m.update(rows, y)
    assert torch.equal(a.precision, b.precision) and torch.equal(a.eta, c.eta)


def test_buffered_scores_are_sample_ats_scores_and_buffers_are_reused():
    X = torch.randn(1, 12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    m = _taught(_model())
    g = torch.Generator().manual_seed(3)
    m._thompson_argmax(X, g)
    first = m._argmax_buffers
    state = g.get_state()
    for _ in range(5):
        state = g.get_state()
        m._thompson_argmax(X, g)
        scores = m._argmax_buffers[5].clone()
        again = m.sample_at(X, torch.Generator().set_state(state))
        assert torch.equal(scores, again)
    assert m._argmax_buffers is first  # the same buffers, written in place
    assert m._argmax_buffers[3].data_ptr() == m._argmax_buffers[2].data_ptr()
    # another thread gets buffers of its own
    seen = []
    threading.Thread(target=lambda: (m._thompson_argmax(X, g), seen.append(m._argmax_buffers))).start()
    while not seen:
        pass
    assert seen[0] is not first and seen[0][2].data_ptr() != first[2].data_ptr()


def test_buffered_decision_declines_what_it_does_not_cover():
    X = torch.randn(1, 5, 4, dtype=torch.float64)
    assert _model()._thompson_argmax(X, DrawBatch(10)) is None  # propensity draws: sample_at's
    nig = BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1),
                         noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=[1])
    assert nig._thompson_argmax(X, None) is None
    assert _model(batch=())._thompson_argmax(X, None) is None
    assert _model(batch=(1,))._thompson_argmax(torch.randn(1, 2000, 4, dtype=torch.float64), None) is None


def test_quick_select_and_update_errors_name_the_argument():
    policy = ThompsonSampling(_model())
    X = torch.randn(1, 6, 4, dtype=torch.float64)
    bad = X.clone()
    bad[0, 2, 1] = float("inf")
    g = torch.Generator().manual_seed(0)
    before = g.get_state()
    with pytest.raises(ValueError, match="features: expected finite values, found 1 NaN or inf"):
        policy.select(bad, torch.tensor([0]), generator=g)
    assert torch.equal(g.get_state(), before)  # refused before any draw
    with pytest.raises(ValueError, match=r"baseline: expected action indices in \[0, 6\), got values \[6\]"):
        policy.select(X, torch.tensor([6]), generator=g)
    precision = policy.model.precision.clone()
    with pytest.raises(ValueError, match="reward: expected finite values"):
        policy.update(X[:, 0], torch.tensor([float("nan")], dtype=torch.float64))
    with pytest.raises(ValueError, match="features_chosen: expected finite values"):
        policy.update(torch.full((1, 4), float("nan"), dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    big = torch.full((1, 4), 1e308, dtype=torch.float64)  # a sum that overflows: finite entries, accepted
    policy.update(big / 1e300, torch.zeros(1, dtype=torch.float64))
    assert not torch.equal(policy.model.precision, precision)
    ts_asc = TSASC(_model(), [_model()], alpha=0.1)
    with pytest.raises(ValueError, match="constraints: expected finite values"):
        ts_asc.update(X[:, 0], torch.zeros(1, dtype=torch.float64), torch.full((1, 1), float("inf"), dtype=torch.float64))


def test_one_row_update_views_give_the_general_updates_numbers():
    """``_update_checked`` (x^T and x broadcast) and TS-ASC's shared views: bit for bit ``update``."""
    g = torch.Generator().manual_seed(4)
    quick, general = TSASC(_model(), [_model(), _model(noise=2.0)], alpha=0.1), TSASC(
        _model(), [_model(), _model(noise=2.0)], alpha=0.1)
    for _ in range(25):
        x = torch.randn(1, 4, generator=g, dtype=torch.float64)
        y = torch.randn(1, generator=g, dtype=torch.float64)
        c = torch.randn(1, 2, generator=g, dtype=torch.float64)
        quick.update(x, y, c)
        general.reward_model.update(x.tolist(), y.tolist())
        for j, m in enumerate(general.constraint_models):
            m.update(x.tolist(), c[:, j].tolist())
    for a, b in zip(quick.models().values(), general.models().values()):
        assert torch.equal(a.precision, b.precision) and torch.equal(a.eta, b.eta)
        assert int(a.num_observations) == int(b.num_observations) == 25
    one = _model()
    one._update_checked(x, y)
    ref = _model()
    ref._update_rows(x, y, True)
    assert torch.equal(one.precision, ref.precision) and torch.equal(one.eta, ref.eta)


@pytest.mark.parametrize("S", [64, 63])  # S d a multiple of 16 (one draw of the normals) or not (one per model)
@pytest.mark.parametrize("batch", [(1,), ()])
def test_stacked_draws_match_each_models_draws_and_the_batched_factor_is_each_models(batch, S):
    models = [_taught(_model(noise=s, batch=batch), seed=i) for i, s in enumerate((0.5, 1.0, 2.0))]
    singles = [_taught(_model(noise=s, batch=batch), seed=i) for i, s in enumerate((0.5, 1.0, 2.0))]
    X = torch.randn(1, 7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    f = BayesianLinear._stacked_draws_at(models, X, DrawBatch(S, 1, seed=9))  # [M, S, K]
    assert f.shape == (3, S, 7)
    for m, one in zip(models, singles):  # the batched factorisation: each model's own numbers
        one._factorize()
        assert torch.equal(m._factor, one._factor) and torch.equal(m._u, one._u)
    # the draws: model m's normals are the generator's m-th draw of S d float32 normals (as one model at a time)
    g = torch.Generator().manual_seed(9)
    z = torch.stack([torch.randn((S, 4), generator=g, dtype=torch.float32) for _ in range(3)]).double()
    for k, one in enumerate(singles):
        w = torch.linalg.solve_triangular(one._factor.reshape(4, 4).mT, (z[k] + one._u.reshape(1, 4)).mT, upper=True)
        torch.testing.assert_close(f[k], (X[0] @ w).mT, rtol=1e-12, atol=1e-12)
    # cached factors are reused (no refactorisation) and give the same draws again
    again = BayesianLinear._stacked_draws_at(models, X, DrawBatch(S, 1, seed=9))
    assert torch.equal(again, f)


@pytest.mark.parametrize("use_valid", [False, True])
def test_stacked_ts_asc_select_applies_algorithm_one_to_the_stacked_draws(use_valid):
    policy = TSASC(_taught(_model()), [_taught(_model(), seed=1), _taught(_model(noise=1.0), seed=2)], alpha=[0.1, 0.3])
    X = torch.randn(1, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    valid = torch.tensor([[True, False, True, True, False, True]]) if use_valid else None
    b, S = 4, 300
    actions = policy.select(X, torch.tensor([b]), generator=DrawBatch(S, 1, seed=11), valid=valid)
    assert actions.shape == (S, 1)
    f = BayesianLinear._stacked_draws_at(list(policy.models().values()), X, DrawBatch(S, 1, seed=11))
    ok = torch.ones(S, 6, dtype=torch.bool)
    for j, alpha in enumerate((0.1, 0.3)):
        ok &= f[j + 1] >= (1 - alpha) * f[j + 1][:, b:b + 1]
    if use_valid:
        ok &= valid
    ok[:, b] = True
    expected = torch.where(ok, f[0], float("-inf")).argmax(-1)
    assert torch.equal(actions[:, 0], expected)
    assert len(set(actions[:, 0].tolist())) > 1  # the draws differ
    probs, _ = policy.action_probabilities(X, baseline=b, valid=valid, num_draws=500, seed=1)
    assert abs(float(probs.sum()) - 1) < 1e-12
    if use_valid:  # masked out: never played, the baseline (4) excepted, which stays a candidate
        assert float(probs[0, 1]) == 0.0


def test_a_model_without_a_stack_key_takes_the_general_path():
    gibbs = BayesianLinear(dist.Laplace(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5,
                           batch_shape=[1])
    policy = TSASC(_model(), [gibbs], alpha=0.1)
    assert policy._select_stacked(torch.randn(1, 5, 4, dtype=torch.float64), torch.tensor([0]), DrawBatch(8), None) is None
    forgetful = BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5,
                               batch_shape=[1], forgetting=0.9)
    ref = BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5,
                         batch_shape=[1], forgetting=0.9)
    policy = TSASC(_model(), [forgetful], alpha=0.1)
    x = torch.randn(1, 4, dtype=torch.float64)
    for _ in range(3):
        policy.update(x, torch.ones(1, dtype=torch.float64), torch.full((1, 1), 2.0, dtype=torch.float64))
        ref.update(x, torch.full((1,), 2.0, dtype=torch.float64))
    assert torch.equal(forgetful.precision, ref.precision) and torch.equal(forgetful.eta, ref.eta)


def test_normal32_is_the_widened_draw():
    a, b = DrawBatch(50, 1, seed=3), DrawBatch(50, 1, seed=3)
    assert torch.equal(a._full("normal", (1, 4), torch.float64), b._normal32((1, 4)).double())


def test_the_kept_eta_view_follows_a_new_eta():
    m = _taught(_model())
    m._factorize()
    m.eta = m.eta * 2  # a new tensor (as a loaded state assigns)
    m._factor = None
    m._factorize()
    expected = torch.linalg.solve_triangular(m._factor, (m.eta)[..., None], upper=False)
    assert torch.equal(m._u, expected)


def test_decider_feedback_rows_give_the_policys_numbers():
    """The Decider's outcome rows (numpy-built tensors) teach the posterior what ``policy.update``
    with tensors teaches; the counts behind the probabilities are the draws'."""
    rng = np.random.default_rng(2)
    decider = Decider(TSASC(_model(), [_model()], alpha=0.1), num_draws=40, seed=1)
    twin = TSASC(_model(), [_model()], alpha=0.1)
    for i in range(30):
        x = rng.normal(size=(5, 4))
        d = decider.decide(x, baseline=0)
        r, c = float(rng.normal()), float(rng.normal())
        decider.feedback(d.decision_id, r, [c])
        twin.update(torch.tensor(x[d.action][None]), torch.tensor([r], dtype=torch.float64),
                    torch.tensor([[c]], dtype=torch.float64))
        counts = [p * 40 for p in d.probabilities]
        assert all(abs(k - round(k)) < 1e-9 for k in counts) and round(sum(counts)) == 40
    for a, b in zip(decider.policy.models().values(), twin.models().values()):
        assert torch.equal(a.precision, b.precision) and torch.equal(a.eta, b.eta)


def test_stacked_propensity_draws_decide_as_one_model_at_a_time(monkeypatch):
    """The stacked draws use the generator as the per-model draws do: a seeded Decider keeps its
    decisions (actions of every draw equal to the per-model path's)."""
    policy = TSASC(_taught(_model()), [_taught(_model(noise=1.0), seed=1)], alpha=0.2)
    X = torch.randn(1, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    stacked = policy.select(X, torch.tensor([0]), generator=DrawBatch(300, 1, seed=4))
    monkeypatch.setattr(TSASC, "_select_stacked", lambda *args: None)
    one_at_a_time = policy.select(X, torch.tensor([0]), generator=DrawBatch(300, 1, seed=4))
    assert torch.equal(stacked, one_at_a_time)


def test_an_unbatched_models_one_row_updates_take_the_same_sums_as_the_general_path():
    """The one-stream case (no batch shape) told one row ``[1, d]`` at a time, as the Decider tells
    it, holds the posterior of the same rows given to ``update`` all at once."""


    from bayes_safe import TSASC, BayesianLinear

    def model():
        return BayesianLinear(dist.Normal(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5)

    policy = TSASC(model(), [model()], alpha=0.1)
    reference = (model(), model())
    g = torch.Generator().manual_seed(0)
    X = torch.randn(20, 3, generator=g, dtype=torch.float64)
    y = torch.randn(20, 2, generator=g, dtype=torch.float64)
    for i in range(20):
        policy.update(X[i:i + 1], y[i, :1], y[i:i + 1, 1:])
    reference[0].update(X, y[:, 0])
    reference[1].update(X, y[:, 1])
    for m, r in zip((policy.reward_model, *policy.constraint_models), reference):
        assert int(m.num_observations) == 20
        torch.testing.assert_close(m.posterior_mean, r.posterior_mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m.precision, r.precision, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------- the joint posterior (issue 42)
def _stream(monkeypatch, joint: bool, tamper=None, steps: int = 40, seed: int = 3):
    """A seeded Decider's actions and propensities over ``steps`` decisions with feedback, the
    models held jointly or not (``_JointPosterior.eligible`` patched off); ``tamper(policy, i)``
    runs before decision ``i`` (a user's own updates, a replaced tensor)."""
    from bayes_safe.models.linear import _JointPosterior

    if not joint:
        monkeypatch.setattr(_JointPosterior, "eligible", staticmethod(lambda models: False))
    rng = np.random.default_rng(seed)
    decider = Decider(TSASC(_model(), [_model(noise=1.0)], alpha=0.2), num_draws=64, seed=seed)
    out = []
    for i in range(steps):
        if tamper is not None:
            tamper(decider.policy, i)
        d = decider.decide(rng.normal(size=(5, 4)), baseline=0)
        out.append((d.action, d.probabilities))
        decider.feedback(d.decision_id, float(rng.normal()), [float(rng.normal())])
    monkeypatch.undo()
    return out, decider.policy


def _tamper(policy, i):
    if i == 10:  # a user's own rows, straight into one model (in place, on its view)
        policy.constraint_models[0].update(torch.ones(1, 4, dtype=torch.float64), torch.full((1,), 3.0, dtype=torch.float64))
    if i == 20:  # a replaced tensor (as a loaded state or a restart assigns): the joint buffers are rebuilt
        policy.reward_model.precision = policy.reward_model.precision.clone() * 1.5
        policy.reward_model._factor = None


@pytest.mark.parametrize("tamper", [None, _tamper])
def test_the_joint_posterior_decides_as_the_models_held_apart(monkeypatch, tamper):
    """TS-ASC's models held jointly (``models.linear._JointPosterior``: views of one buffer) give
    the same decisions, bit for bit, as the models joined anew at each decision, through a user's
    own updates of one model and a replaced tensor."""
    apart, _ = _stream(monkeypatch, False, tamper)
    together, policy = _stream(monkeypatch, True, tamper)
    assert together == apart
    joint = policy.__dict__.get("_joint")
    assert joint is not None and joint.holds(policy._stackable())
    base = joint.precision.untyped_storage().data_ptr()
    assert all(m.precision.untyped_storage().data_ptr() == base for m in policy.models().values())


def test_the_joint_posterior_is_left_alone_where_it_cannot_hold():
    """One model object in two roles is not held jointly (it would be one view, not two), and a copy
    of a policy holds its own buffers."""
    import copy

    from bayes_safe.models.linear import _JointPosterior

    m = _taught(_model())
    assert not _JointPosterior.eligible((m, m))
    policy = TSASC(_taught(_model()), [_taught(_model(), seed=1)], alpha=0.1)
    X = torch.randn(1, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    policy.select(X, torch.tensor([0]), generator=DrawBatch(32, 1, seed=1))
    twin = copy.deepcopy(policy)
    before = policy.reward_model.precision.clone()
    twin.update(X[:, 0], torch.ones(1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64))
    assert torch.equal(policy.reward_model.precision, before)
    assert not torch.equal(twin.reward_model.precision, before)


# --------------------------------------------------------------- the Decider's fast paths (issue 42, item 4)
@pytest.mark.parametrize("batch", [(1,), ()])
@pytest.mark.parametrize("noises", [(0.5, 0.5, 0.5), (0.5, 1.0, 0.3)], ids=["one-scale", "own-scales"])
def test_the_joint_update_is_each_models_own_update_bit_for_bit(batch, noises):
    """``_JointPosterior.learn`` (one row into every model, two operations) leaves every model's
    precision, eta and count exactly as its own ``_update_checked`` does, with one noise scale for all
    (``value=s``) and with each model's own (the scaled factors formed in numpy)."""
    from bayes_safe.models.linear import _JointPosterior

    together = [_taught(_model(noise=s, batch=batch), seed=i) for i, s in enumerate(noises)]
    apart = [_taught(_model(noise=s, batch=batch), seed=i) for i, s in enumerate(noises)]
    joint = _JointPosterior(together)
    rng = np.random.default_rng(4)
    with torch.inference_mode():
        for _ in range(30):
            row = rng.normal(size=(1, 4 + 3)) * np.exp(rng.normal(size=(1, 4 + 3)))
            x = torch.from_numpy(row[:, :4])
            joint.learn(x, row[:, :4], row[0, 4:])
            for m, model in enumerate(apart):  # as TSASC._update_stacked teaches each model (x [1, d], y [1])
                model._update_checked(x, torch.from_numpy(row[:, 4 + m]))
    assert joint.holds(together)
    for a, b in zip(together, apart):
        assert torch.equal(a.precision, b.precision) and torch.equal(a.eta, b.eta)
        assert int(a.num_observations) == int(b.num_observations) and a._factor is None


@pytest.mark.parametrize("noise", [0.5, 1.0])
def test_the_deciders_joint_feedback_keeps_the_decisions_and_the_posteriors(monkeypatch, noise):
    """A Decider whose TS-ASC models learn each feedback jointly (``TSASC._learn_values``) decides
    and ends as one whose models learn it one by one (the joint posterior patched off), bit for bit."""
    from bayes_safe.models.linear import _JointPosterior

    def run(joint: bool):
        if not joint:
            monkeypatch.setattr(_JointPosterior, "learn", lambda *a: pytest.fail("learned jointly"))
            monkeypatch.setattr(_JointPosterior, "eligible", staticmethod(lambda models: False))
        rng = np.random.default_rng(7)
        decider = Decider(TSASC(_model(), [_model(noise=noise), _model(noise=2.0)], alpha=0.2), num_draws=64, seed=5)
        out = []
        for _ in range(40):
            d = decider.decide(rng.normal(size=(5, 4)), baseline=1)
            out.append((d.action, d.probabilities))
            decider.feedback(d.decision_id, float(rng.normal()), [float(rng.normal()), float(rng.normal())])
        monkeypatch.undo()
        return out, [(m.precision.clone(), m.eta.clone()) for m in decider.policy.models().values()]

    calls = []
    learn = _JointPosterior.learn
    monkeypatch.setattr(_JointPosterior, "learn", lambda *a: calls.append(1) or learn(*a))
    together, states = run(True)
    assert len(calls) == 40  # every feedback learned jointly
    apart, states_apart = run(False)
    assert together == apart
    for (p, e), (q, f) in zip(states, states_apart):
        assert torch.equal(p, q) and torch.equal(e, f)


def test_the_guards_sums_in_order_are_numpys():
    """The outlier guard's ``x^T m`` and ``|L^-1 x|^2`` summed in Python (``decider._sums_in_order``, rows of
    fewer than 8 numbers) are numpy's ``(u * col).sum(1)`` and ``(col * col).sum(1)``, bit for bit (a row of
    -0.0 included)."""
    from bayes_safe.online.decider import _sums_in_order

    rng = np.random.default_rng(5)
    for t in range(3000):
        d, M = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        u = rng.normal(size=(M, d)) * np.exp(4 * rng.normal(size=(M, d)))
        col = rng.normal(size=(M, d)) * np.exp(4 * rng.normal(size=(M, d)))
        if t % 7 == 0:
            col[0] = -0.0
        means, spreads = _sums_in_order(u.tolist(), col.tolist())
        expected = (u * col).sum(1).tolist() + (col * col).sum(1).tolist()
        assert [np.float64(v).tobytes() for v in means + spreads] == [np.float64(v).tobytes() for v in expected]


@pytest.mark.parametrize("batch", [(1,), ()])
def test_the_stacked_draws_as_numpy_arrays_are_the_tensors_numbers(batch):
    """``_stacked_draws_at(as_numpy=True)`` hands out the numbers of the tensor path: the draws in the
    product's layout ``[M, K, S]``, ``C = L^-1 X^T`` and the whitened means."""
    def models():
        return [_taught(_model(noise=s, batch=batch), seed=i) for i, s in enumerate((0.5, 1.0))]

    X = torch.randn(1, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    draws, C, u = BayesianLinear._stacked_draws_at(models(), X, DrawBatch(40, 1, seed=2), with_solve=True)
    arrays = BayesianLinear._stacked_draws_at(models(), X, DrawBatch(40, 1, seed=2), with_solve=True, as_numpy=True)
    assert all(isinstance(a, np.ndarray) for a in arrays)
    assert np.array_equal(arrays[0], draws.numpy().transpose(0, 2, 1))
    assert np.array_equal(arrays[1], C.numpy()) and np.array_equal(arrays[2], u.numpy())


def test_the_common_outcome_check_is_the_general_ones():
    """``Decider._outcome``'s one pass over a float reward and float constraints gives what the general
    checks give, and for a value they refuse (NaN, an infinity, beyond ``outcome_limit``, not 0 / 1 for
    a binary metric) the general check's own error."""
    binary = BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), likelihood="probit",
                            batch_shape=[1])
    decider = Decider(TSASC(_model(), [_model(), binary], alpha=0.1), num_draws=8, outcome_limit=10.0)
    constraints = [-0.0, 1.0]
    reward, values = decider._outcome(2.5, constraints)
    assert reward == 2.5 and values == constraints and values is not constraints
    assert [np.float64(v).tobytes() for v in values] == [np.float64(v).tobytes() for v in constraints]
    for reward, constraints, message in [
            (float("nan"), [0.0, 1.0], "reward: expected a finite number"),
            (1.0, [float("inf"), 1.0], r"constraints\[0\]: expected a finite number"),
            (11.0, [0.0, 1.0], r"reward: expected \|value\| <= 10"),
            (1.0, [-10.5, 0.0], r"constraints\[0\]: expected \|value\| <= 10"),
            (1.0, [0.0, 0.5], r"constraints\[1\]: expected 0 or 1"),
            (1.0, [0.0, float("nan")], r"constraints\[1\]: expected a finite number")]:
        with pytest.raises(ValueError, match=message):
            decider._outcome(reward, constraints)


def test_the_logs_one_row_feedback_write_is_the_general_ones(tmp_path):
    """An SQLite log's one-row ``write_feedback`` (one statement, no list of rows around it) writes the
    row ``write_feedback_many`` writes, and answers a duplicate with False."""
    from bayes_safe.online import DecisionLog
    from bayes_safe.online.log import feedback_row

    assert feedback_row("1", 0.5, [0.25, -0.0])[2:] == (0.5, "[0.25, -0.0]")
    assert feedback_row("1", 0.5, [float("nan")])[3] == "[NaN]"
    assert feedback_row("1", 0.5, [None, 1.0])[3] == "[null, 1.0]"
    one, many = DecisionLog(tmp_path / "one.sqlite"), DecisionLog(tmp_path / "many.sqlite")
    for log in (one, many):
        for n in range(3):
            log.write_decision(str(n), 0, 0.5, 0.1, 0, [1.0, 2.0], [0.5, 0.5])
    answers_one = [one.write_feedback("0", 1.5, [0.25]), one.write_feedback("1", -0.5, None),
                   one.write_feedback("0", 9.0, [9.0])]
    answers_many = [many.write_feedback_many([("0", 1.5, [0.25])])[0], many.write_feedback_many([("1", -0.5, None)])[0],
                    many.write_feedback_many([("0", 9.0, [9.0])])[0]]
    assert answers_one == answers_many == [True, True, False]
    rows = [log._db.execute("SELECT decision_id, reward, constraints FROM feedback ORDER BY rowid").fetchall()
            for log in (one, many)]
    assert rows[0] == rows[1] == [("0", 1.5, "[0.25]"), ("1", -0.5, None)]
    one.close()
    many.close()


@pytest.mark.parametrize("stackable", [True, False], ids=["conjugate", "normal-inverse-gamma"])
def test_feedback_learned_at_once_is_the_queues_learning(stackable):
    """``Decider.feedback`` learning an outcome at once (``_learn_now``: update_every = 1, nothing else
    waiting) decides, counts model versions and ends as a Decider whose every outcome goes through the
    queue (a subclass with its own ``_queue``), bit for bit; a policy whose models do not learn rows
    that way is remembered and queued."""
    class Queued(Decider):
        def _queue(self, *args):  # its own queue: every outcome through it (``refresh`` learns it)
            super()._queue(*args)

    assert Decider._learns_at_once and not Queued._learns_at_once

    def constraint():
        if stackable:
            return _model(noise=1.0)
        return BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), batch_shape=[1],
                              noise_prior=dist.InverseGamma(torch.tensor(3.0, dtype=torch.float64),
                                                            torch.tensor(2.0, dtype=torch.float64)))

    def run(cls):
        rng = np.random.default_rng(11)
        decider = cls(TSASC(_model(), [constraint()], alpha=0.2), num_draws=32, seed=2)
        out = []
        for _ in range(25):
            d = decider.decide(rng.normal(size=(4, 4)), baseline=0)
            out.append((d.action, d.probabilities, d.model_version))
            assert decider.feedback(d.decision_id, float(rng.normal()), [float(rng.normal())])
            assert not decider.queued
        return decider, out

    at_once, queued = run(Decider), run(Queued)
    assert at_once[1] == queued[1] and at_once[0].model_version == queued[0].model_version == 25
    for a, b in zip(at_once[0].policy.models().values(), queued[0].policy.models().values()):
        assert torch.equal(a.precision, b.precision) and torch.equal(a.eta, b.eta)
    assert (at_once[0].__dict__.get("_rows_refused") is at_once[0].policy) is not stackable
