"""Forgetting in the Gibbs (logistic) and Langevin engines (issue 30): row ``i`` of ``n`` enters the
likelihood to the power ``lambda^(n - 1 - i)``, the prior kept; the Gibbs engine's probit likelihood
is refused by name."""

from __future__ import annotations

import copy

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.models.gibbs import (
    GibbsLinearPosterior,
    forgetting_weights,
    polya_gamma,
    recognise_prior,
)
from bayes_safe.models.langevin import LangevinLinearPosterior
from bayes_safe.random import ReplicationRNG
from bayes_safe.state import load_state, save_state

F64 = torch.float64
D = 2


def _flip_data(n_before: int, n_after: int, seed: int = 0):
    """0/1 outcomes of a logistic model whose weights flip sign after ``n_before`` rows."""
    g = torch.Generator().manual_seed(seed)
    w = torch.tensor([2.0, -2.0], dtype=F64)
    X = torch.randn(n_before + n_after, D, generator=g, dtype=F64)
    sign = torch.cat([torch.ones(n_before, dtype=F64), -torch.ones(n_after, dtype=F64)])
    p = torch.sigmoid(sign * (X @ w))
    y = (torch.rand(n_before + n_after, generator=g, dtype=F64) < p).to(F64)
    return X, y, w


def _laplace():
    return dist.Laplace(torch.zeros(D, dtype=F64), 2.0).to_event(1)


def _gauss():
    return dist.Normal(torch.zeros(D, dtype=F64), 2.0).to_event(1)


def _feed(model, X, y):
    b = tuple(model.batch_shape)
    for i in range(X.shape[0]):
        model.update(X[i].expand(*b, D), y[i].expand(b))


def test_forgetting_weights_follow_the_row_order():
    start, w = forgetting_weights(0.5, 4)
    assert start == 0 and w.tolist() == [0.125, 0.25, 0.5, 1.0]
    start, w = forgetting_weights(0.5, 100)          # rows below 2^-60 are left out
    assert start == 100 - 61 and float(w[0]) == 2.0**-60
    assert forgetting_weights(1.0, 3)[1].tolist() == [1.0, 1.0, 1.0]


def test_polya_gamma_with_weights_has_the_right_mean_and_is_exact_at_one():
    c = torch.tensor([0.0, 1.5, -3.0], dtype=F64).repeat(4000)
    b = torch.tensor([0.3, 0.7, 2.5], dtype=F64).repeat(4000)
    draws = polya_gamma(c, torch.Generator().manual_seed(1), b=b).reshape(4000, 3)
    cc, bb = c[:3].abs(), b[:3]
    mean = torch.where(cc == 0, bb / 4, bb * torch.tanh(cc / 2) / (2 * cc.clamp_min(1e-9)))
    assert torch.allclose(draws.mean(0), mean, rtol=0.05)
    one = polya_gamma(c, torch.Generator().manual_seed(2), b=torch.ones_like(c))
    assert torch.equal(one, polya_gamma(c, torch.Generator().manual_seed(2)))


def test_a_logistic_gibbs_model_with_forgetting_tracks_a_flip():
    X, y, w = _flip_data(600, 250)
    means = {}
    for lam in (None, 0.97):
        m = BayesianLinear(_laplace(), likelihood="logistic", forgetting=lam)
        assert m.engine_name == "gibbs"
        _feed(m, X, y)
        for _ in range(5):
            m.sample()
        means[lam] = m.posterior_mean
    assert bool((means[0.97].sign() == -w.sign()).all())            # the new weights
    assert float((means[0.97] + w).abs().max()) < 1.2
    assert bool((means[None].sign() == w.sign()).any())             # still the old ones, or an average
    assert float((means[None] + w).abs().max()) > 1.2


def test_a_langevin_model_with_forgetting_tracks_a_flip():
    X, y, w = _flip_data(400, 200, seed=3)
    means = {}
    for lam in (None, 0.96):
        m = BayesianLinear(_gauss(), likelihood="logistic", inference="langevin", forgetting=lam)
        assert m.engine_name == "langevin"
        _feed(m, X, y)
        means[lam] = m.posterior_mean
    assert bool((means[0.96].sign() == -w.sign()).all())
    assert float((means[0.96] + w).abs().max()) < 1.2
    assert float((means[None] + w).abs().max()) > 1.2


def test_a_gaussian_langevin_model_with_forgetting_tracks_a_flip():
    g = torch.Generator().manual_seed(4)
    w = torch.tensor([1.0, -1.0], dtype=F64)
    X = torch.randn(300, D, generator=g, dtype=F64)
    y = torch.cat([X[:200] @ w, X[200:] @ -w]) + 0.3 * torch.randn(300, generator=g, dtype=F64)
    m = BayesianLinear(_gauss(), noise_std=0.3, inference="langevin", forgetting=0.9)
    m.update(X[:150], y[:150])                       # many rows at once: in order, as one per row
    _feed(m, X[150:], y[150:])
    assert float((m.posterior_mean + w).abs().max()) < 0.3
    n_eff = sum(0.9**k for k in range(300))
    assert m.engine._n_lik() == pytest.approx(n_eff)


def _gibbs_engine(lam, R=3):
    prior = recognise_prior(_laplace(), D, (R,))
    return GibbsLinearPosterior(prior, D, (R,), likelihood="logistic", forgetting=lam)


def _langevin_engine(lam, likelihood="logistic", R=3):
    return LangevinLinearPosterior(_gauss(), D, (R,), likelihood=likelihood, forgetting=lam)


@pytest.mark.parametrize("make", [_gibbs_engine, _langevin_engine,
                                  lambda lam: _langevin_engine(lam, "probit")])
def test_weight_one_gives_the_draws_of_no_forgetting_bit_for_bit(make):
    X, y, _ = _flip_data(60, 0, seed=5)
    out = []
    for lam in (None, 1.0):
        e = make(lam)
        rng = ReplicationRNG.from_seed(7, 3)
        draws = []
        for i in range(0, 60, 6):
            e.add(X[i:i + 6], y[i:i + 6])
            draws.append(e.draw(rng).clone())
        out.append(torch.stack(draws))
    assert torch.equal(out[0], out[1])


def test_model_level_forgetting_one_is_no_forgetting():
    X, y, _ = _flip_data(40, 0, seed=6)
    draws = []
    for lam in (None, 1.0):
        m = BayesianLinear(_laplace(), likelihood="logistic", forgetting=lam, batch_shape=[2])
        rng = ReplicationRNG.from_seed(3, 2)
        out = []
        for i in range(40):
            m.update(X[i].expand(2, D), y[i].expand(2))
            out.append(m.sample(rng).clone())
        draws.append(torch.stack(out))
    assert torch.equal(draws[0], draws[1])


def test_replication_separable_under_forgetting():
    X, y, _ = _flip_data(50, 0, seed=8)
    rng = ReplicationRNG.from_seed(11, 3)
    e = _gibbs_engine(0.9)
    e.add(X, y)
    batch = torch.stack([e.draw(rng).clone() for _ in range(3)])
    for r in range(3):
        one = _gibbs_engine(0.9, R=1)
        one.add(X, y)
        rr = ReplicationRNG([rng.seeds[r]])
        single = torch.stack([one.draw(rr).clone() for _ in range(3)])
        assert torch.equal(single[:, 0], batch[:, r])


@pytest.mark.parametrize("kwargs", [
    {"prior": _laplace(), "likelihood": "logistic"},
    {"prior": _gauss(), "likelihood": "logistic", "inference": "langevin"},
    {"prior": _gauss(), "likelihood": "probit", "inference": "langevin"},
    {"prior": _gauss(), "noise_prior": dist.InverseGamma(2.0, 1.0), "inference": "langevin"},
])
def test_save_and_load_mid_stream_continues_identically(tmp_path, kwargs):
    X, y, _ = _flip_data(60, 0, seed=9)
    if "noise_prior" in kwargs:
        y = X @ torch.tensor([1.0, -0.5], dtype=F64) + 0.2 * torch.randn(60, generator=torch.Generator().manual_seed(1),
                                                                        dtype=F64)
    m = BayesianLinear(**kwargs, forgetting=0.9, batch_shape=[2])
    rng = ReplicationRNG.from_seed(5, 2)
    _feed(m, X[:30], y[:30])
    m.sample(rng)
    save_state(m, tmp_path / "m")
    again = load_state(tmp_path / "m")
    assert again.forgetting == 0.9
    rng2 = copy.deepcopy(rng)
    a, b = [], []
    for i in range(30, 60):
        _feed(m, X[i:i + 1], y[i:i + 1])
        _feed(again, X[i:i + 1], y[i:i + 1])
        a.append(m.sample(rng).clone())
        b.append(again.sample(rng2).clone())
    assert torch.equal(torch.stack(a), torch.stack(b))


def test_a_probit_gibbs_model_refuses_forgetting_by_name():
    with pytest.raises(ValueError, match="forgetting: the gibbs engine cannot forget with likelihood='probit'.*"
                                         "likelihood='logistic'.*inference='langevin'"):
        BayesianLinear(_laplace(), likelihood="probit", forgetting=0.9)
    m = BayesianLinear(_gauss(), likelihood="probit", inference="langevin", forgetting=0.9)   # the way out
    m.update(torch.ones(1, D, dtype=F64), torch.ones(1, dtype=F64))
    assert m.sample().shape == (D,)


@pytest.mark.parametrize("inference", ["nuts", "svi"])
def test_nuts_and_svi_forget_as_the_conjugate_engine_does(inference):
    """The weighted likelihood of the Pyro engines has the conjugate stabilised rule's posterior:
    after a flip of the weights, its mean follows the new weights as the closed form does."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(60, D, generator=g, dtype=F64)
    w = torch.tensor([1.0, -1.0], dtype=F64)
    y = torch.cat([X[:30] @ w, -(X[30:] @ w)]) + 0.3 * torch.randn(60, generator=g, dtype=F64)
    exact = BayesianLinear(_gauss(), noise_std=0.3, forgetting=0.9)
    exact.update(X, y)
    m = BayesianLinear(_gauss(), noise_std=0.3, forgetting=0.9, inference=inference,
                       inference_options={"num_samples": 200, "warmup_steps": 100, "svi_steps": 600,
                                          "progress": False})
    m.update(X.numpy(), y.numpy())          # numpy rows, as a user has them
    m.fit()
    mean, truth = m.sample((200,)).mean(0), exact.sample((4000,)).mean(0)
    assert torch.allclose(mean, truth, atol=0.12), (mean, truth)
    assert mean[0] < -0.5 < 0.5 < mean[1]   # the flipped weights, where no forgetting stays near 0


def test_pyro_engine_forgetting_is_saved_and_drops_rows_that_no_longer_count(tmp_path):
    m = BayesianLinear(_gauss(), noise_std=1.0, forgetting=0.5, inference="svi",
                       inference_options={"svi_steps": 50, "num_samples": 20, "progress": False})
    m.update(torch.randn(100, D, dtype=F64), torch.randn(100, dtype=F64))
    m.fit()
    assert m._X[0].shape[-2] == 61            # weights below 2^-60 (0.5^61) left out at the fit
    save_state(m, tmp_path / "m")
    back = load_state(tmp_path / "m")
    assert back.forgetting == 0.5 and back.engine.forgetting == 0.5


def test_the_exponential_rule_is_refused_where_the_prior_is_not_conjugate():
    with pytest.raises(ValueError, match="forgetting_rule='exponential'"):
        BayesianLinear(_gauss(), likelihood="logistic", inference="langevin", forgetting=0.9,
                       forgetting_rule="exponential")
    with pytest.raises(ValueError, match="forgetting: the nuts engine.*forgetting_rule='exponential'"):
        BayesianLinear(_gauss(), noise_std=1.0, inference="nuts", forgetting=0.9, forgetting_rule="exponential")


def test_a_logistic_decider_that_forgets_replays_its_log_to_the_same_chain(tmp_path):
    import numpy as np

    from bayes_safe import ThompsonSampling
    from bayes_safe.online import Decider, DecisionLog

    policy = ThompsonSampling(BayesianLinear(_laplace(), likelihood="logistic", forgetting=0.9))
    decider = Decider(policy, num_draws=10, seed=0, log=tmp_path / "log.sqlite")
    X, y, _ = _flip_data(20, 0, seed=12)
    decider.save(tmp_path / "state")  # the snapshot before any feedback
    ds = [decider.decide(np.stack([X[i].numpy(), -X[i].numpy()])) for i in range(20)]
    for d, v in zip(ds, y.tolist()):
        decider.feedback(d.decision_id, v)
    decider.log.close()
    back = Decider.load(tmp_path / "state", log=DecisionLog(tmp_path / "log.sqlite"))
    assert back.replayed == {"decisions": 20, "feedback": 20}
    e, f = policy.model.engine, back.policy.model.engine
    assert f.n == e.n == 20 and torch.equal(f._X[:20], e._X[:20]) and torch.equal(f._y[:20], e._y[:20])
    back.log.close()


@pytest.mark.parametrize("forgetting", [0.9, "adaptive"])
def test_per_arm_models_forget_at_each_arms_own_observations(tmp_path, forgetting):
    """Arm k of a forgetting PerArmLinear is the forgetting BayesianLinear told arm k's rows only;
    the other arms keep what they know; the setting survives save and load."""
    import numpy as np

    from bayes_safe.models import PerArmLinear

    prior = dist.Normal(torch.zeros(D, dtype=F64), 1.0).to_event(1)
    m = PerArmLinear(prior, 3, noise_std=0.5, forgetting=forgetting)
    alone = [BayesianLinear(prior, noise_std=0.5, forgetting=forgetting) for _ in range(3)]
    rng = np.random.default_rng(4)
    for t in range(240):
        c = rng.normal(size=D)
        a = t % 3 if t < 120 else 1
        y = float(c.sum()) * (1.0 if t < 180 else -1.0) + 0.5 * rng.normal()
        m.update(c, y, a)                      # numpy context, float outcome, int arm
        alone[a].update(c[None], [y])
    for k in range(3):
        assert torch.allclose(m.arms.precision[k], alone[k].precision)
        assert torch.allclose(m.arms.eta[k], alone[k].eta)
    mean = m.sample((2000,)).mean(0)
    assert float(mean[1].sum()) < -1.0 < 1.0 < float(mean[0].sum())   # arm 1 followed the flip; arm 0 kept the old
    if forgetting == "adaptive":
        assert m.arms.change_points.tolist() == [0, 1, 0]
    save_state(m, tmp_path / "m")
    back = load_state(tmp_path / "m")
    assert back.forgetting == m.forgetting and torch.equal(back.arms.precision, m.arms.precision)
    assert "forgetting=" in repr(back)
