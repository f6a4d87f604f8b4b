"""Drift on 0/1 outcomes (issue 43): the Bernoulli likelihood-ratio CUSUM on a model's predictive
probability, restarts to a named base prior, and decay of unplayed arms. The streams are written
here: clicks and rare adverse events drawn from rates the test sets, numpy contexts.

The false-alarm claims are checked by their rate over many seeded streams: on a stationary stream
of a 1 % metric (and of a 20 % click rate, and at 20 features) the alarms of a right model stay
within the documented bound ``false_alarm_rate x observations``.
"""

from __future__ import annotations

import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, PerArmLinear
from bayes_safe.models import power_prior
from bayes_safe.models.change_detection import AdaptiveForgetting
from bayes_safe.state import load_state, save_state

F64 = torch.float64


def _prior(d, sd=1.0):
    return dist.Normal(torch.zeros(d, dtype=F64), sd).to_event(1)


class RateStream:
    """0/1 outcomes of ``R`` independent streams: contexts ``[1, u_1 .. u_{d-1}]`` with ``u`` uniform
    on [0, 1], success probability ``base (1 + 0.5 (u_1 - 0.5))``, multiplied by ``factor`` from
    step ``change`` on (numpy, seeded)."""

    def __init__(self, R, d, base, *, change=None, factor=1.0, seed=0):
        self.R, self.d, self.base, self.change, self.factor = R, d, base, change, factor
        self.rng = np.random.default_rng(seed)
        self.t = 0

    def step(self):
        x = np.concatenate([np.ones((self.R, 1)), self.rng.uniform(size=(self.R, self.d - 1))], axis=1)
        p = self.base * (1.0 + 0.5 * (x[:, 1] - 0.5))
        if self.change is not None and self.t >= self.change:
            p = np.minimum(p * self.factor, 1.0)
        self.t += 1
        return x, (self.rng.uniform(size=self.R) < p).astype(float)


def _run(model, stream, T, record_at=None):
    alarms_at = []
    for t in range(T):
        x, y = stream.step()
        model.update(torch.from_numpy(x), torch.from_numpy(y))
        if record_at is not None and t == record_at - 1:
            alarms_at.append(model.change_points.clone())
    return alarms_at


@pytest.mark.parametrize("engine, base, d, R, T", [
    ("linear probability", 0.01, 4, 200, 3000),   # a rare adverse event, a Gaussian model of it
    ("linear probability", 0.01, 20, 60, 3000),   # the same at 20 features
    ("laplace", 0.2, 4, 100, 2000),               # clicks, the logistic laplace engine
])
def test_false_alarms_on_a_stationary_stream_stay_within_the_documented_rate(engine, base, d, R, T):
    cfg = AdaptiveForgetting(outcomes="binary", false_alarm_rate=1e-4)
    if engine == "laplace":
        model = BayesianLinear(_prior(d, 3.0), likelihood="logistic", inference="laplace", batch_shape=[R],
                               forgetting=cfg)
    else:
        model = BayesianLinear(_prior(d), noise_std=0.1, batch_shape=[R], forgetting=cfg)
    _run(model, RateStream(R, d, base, seed=d), T)
    observations = R * max(T - model._detector.warmup, 0)
    bound = cfg.rate_bound(binary=True) * observations
    assert bound == pytest.approx(1e-4 * observations)
    assert int(model.change_points.sum()) <= bound


def test_a_tripled_rare_rate_is_found_and_a_steady_one_is_not():
    R, d = 40, 3
    model = BayesianLinear(_prior(d), noise_std=0.1, batch_shape=[R],
                           forgetting=AdaptiveForgetting(outcomes="binary"))
    before = _run(model, RateStream(R, d, 0.01, change=2500, factor=3.0, seed=1), 7500, record_at=2500)[0]
    assert int(before.sum()) == 0  # the documented 1e-5 per observation: nothing in 100,000
    found = model.change_points >= 1  # measured: 35 of 40 within 5,000 observations of the change
    assert float(found.double().mean()) >= 0.8


def test_the_binary_test_finds_a_click_drop_the_gaussian_residual_test_misses():
    """The issue's news recommender: a click rate of 0.3 falling to 0.2, modelled by a Gaussian model
    of noise sd 0.35 (a shift of about 0.3 predictive sd): the Gaussian CUSUM tuned to one sd
    (``"adaptive"``) misses most, the 0/1 test finds it."""
    R, d, T, change = 40, 2, 3500, 2000

    def found(cfg):
        model = BayesianLinear(_prior(d), noise_std=0.35, batch_shape=[R], forgetting=cfg)
        stream = RateStream(R, d, 0.3, change=change, factor=2 / 3, seed=3)
        before = _run(model, stream, T, record_at=change)[0]
        return int(before.sum()), float((model.change_points > before).double().mean())

    _, gauss = found("adaptive")
    false_binary, binary = found(AdaptiveForgetting(outcomes="binary", false_alarm_rate=1e-4))
    assert false_binary <= 1e-4 * R * change and binary >= 0.85
    assert gauss < 0.5 and binary > gauss + 0.4


def _force_alarm(model, d, y_value=1.0):
    """Feed outcomes of 1 at the intercept until the 0/1 test fires; return the last row."""
    x = torch.zeros(d, dtype=F64)
    x[0] = 1.0
    for _ in range(200):
        before = int(model.change_points)
        snapshot = (model.precision.clone(), model.eta.clone())
        model.update(x, torch.tensor(y_value, dtype=F64))
        if int(model.change_points) > before:
            return x, snapshot
    raise AssertionError("no alarm")


@pytest.mark.parametrize("keep", [0.0, 0.25])
def test_a_power_prior_warm_start_restarts_to_the_named_base_prior(keep):
    d, noise = 3, 0.2
    weak = _prior(d, 2.0)
    rng = np.random.default_rng(0)
    X = np.concatenate([np.ones((3000, 1)), rng.uniform(size=(3000, d - 1))], axis=1)
    y = (rng.uniform(size=3000) < 0.02).astype(float)
    warm = power_prior(weak, X, y, noise_std=noise, weight=1.0)
    model = BayesianLinear(warm, noise_std=noise, base_prior=weak,
                           forgetting=AdaptiveForgetting(outcomes="binary", warmup=0, warmup_events=0, keep=keep))
    assert model.base_prior is not None and model.base_prior.event_shape == (d,)
    x, (precision, eta) = _force_alarm(model, d)
    base_precision = torch.eye(d, dtype=F64) / 4.0
    s = 1.0 / noise**2
    # the old world is gone (keep = 0) or discounted (keep > 0), the weak base prior kept
    expected = base_precision + keep * (precision - base_precision) + s * torch.outer(x, x)
    torch.testing.assert_close(model.precision, expected)
    torch.testing.assert_close(model.eta, keep * eta + s * x)
    # without base_prior the restart returns to the warm prior itself: the old world
    plain = BayesianLinear(warm, noise_std=noise,
                           forgetting=AdaptiveForgetting(outcomes="binary", warmup=0, warmup_events=0))
    _force_alarm(plain, d)
    assert float(torch.linalg.matrix_norm(plain.precision - expected)) > 100


def test_decay_grows_the_uncertainty_of_unplayed_arms_back_to_the_base_prior():
    K, d, decay = 3, 2, 0.9
    model = PerArmLinear(_prior(d), K, noise_std=0.5, decay=decay)
    rng = np.random.default_rng(0)
    for t in range(40):  # every arm learns
        model.update(rng.uniform(size=d), float(rng.uniform()), t % K)
    learned = model.arms.precision.clone()
    prior_precision = torch.eye(d, dtype=F64)
    for _ in range(10):  # only arm 0 is played
        x = rng.uniform(size=d)
        model.update(x, 1.0, 0)
    for k in (1, 2):  # unplayed: decay^10 of what they learned, pulled back toward the prior
        torch.testing.assert_close(model.arms.precision[k], prior_precision + decay**10 * (learned[k] - prior_precision),
                                   rtol=1e-9, atol=1e-9)
    assert float(model.posterior_covariance[1].trace()) > float(torch.cholesky_inverse(
        torch.linalg.cholesky(learned[1])).trace())
    # the played arm does not decay
    assert float(model.arms.precision[0].trace()) > float(learned[0].trace())


def test_decay_lets_exploration_find_a_change_on_an_abandoned_arm():
    """Two arms; arm 1 is bad and abandoned, then becomes the best: with decay Thompson sampling
    returns to it and finds the change; without, it does not."""
    from bayes_safe import ThompsonSampling

    R, T, change = 30, 3000, 600

    def share_found(decay):
        model = PerArmLinear(_prior(1), 2, noise_std=0.5, batch_shape=[R], decay=decay)
        policy = ThompsonSampling(model)
        g = torch.Generator().manual_seed(5)
        rng = np.random.default_rng(5)
        plays = []
        for t in range(T):
            means = np.array([0.5, 0.0 if t < change else 1.0])
            feats = torch.ones(R, 2, 1, dtype=F64)
            a = policy.select(feats, torch.zeros(R, dtype=torch.long), generator=g)
            y = means[a.numpy()] + 0.5 * rng.normal(size=R)
            policy.update(torch.ones(R, 1, dtype=F64), torch.from_numpy(y), actions=a)
            plays.append(a.numpy())
        last = np.stack(plays[-300:])  # [300, R]
        return float(((last == 1).mean(0) > 0.5).mean())

    assert share_found(0.999) >= 0.95  # measured: 30 of 30 (0.99, 0.995, 0.999); 21 of 30 without decay
    assert share_found(None) < 0.8


def test_the_laplace_engine_forgets_with_a_factor_and_adaptively():
    d = 2
    fixed = BayesianLinear(_prior(d), likelihood="logistic", inference="laplace", forgetting=0.9)
    plain = BayesianLinear(_prior(d), likelihood="logistic", inference="laplace")
    x, y = torch.tensor([1.0, 0.3], dtype=F64), torch.tensor(1.0, dtype=F64)
    for _ in range(30):
        fixed.update(x, y)
        plain.update(x, y)
    # forgetting keeps an effective memory of about 10 rows: a wider posterior than 30 rows'
    assert float(fixed.engine.H.trace()) < 0.5 * float(plain.engine.H.trace())
    adaptive = BayesianLinear(_prior(d, 3.0), likelihood="logistic", inference="laplace", forgetting="adaptive")
    assert adaptive._detector.binary  # a logistic model's test reads 0/1 outcomes
    stream = RateStream(1, d, 0.05, change=1500, factor=8.0, seed=2)
    _run(adaptive, stream, 2500)
    assert int(adaptive.change_points) >= 1


def test_a_logistic_gibbs_chain_restarts_by_weighing_old_rows_and_saves_them(tmp_path):
    d, R = 2, 3
    cfg = AdaptiveForgetting(warmup=0, keep=0.0)
    model = BayesianLinear(_prior(d, 3.0), likelihood="logistic", inference="gibbs", batch_shape=[R],
                           forgetting=cfg, inference_options={"seed": 0})
    x = torch.tensor([1.0, 0.0], dtype=F64).expand(R, d)
    g = torch.Generator().manual_seed(0)
    for t in range(160):  # a rate of 0.05 jumping to 0.95 at step 80 (replications 0 and 2 only)
        rate = torch.tensor([0.95 if t >= 80 else 0.05, 0.05, 0.95 if t >= 80 else 0.05], dtype=F64)
        model.update(x, torch.bernoulli(rate, generator=g))
        model.sample(generator=g)  # the chain advances as a policy's draws advance it
    points = model.change_points.tolist()
    assert points[0] >= 1 and points[2] >= 1 and points[1] == 0
    mask = model.engine.row_mask
    assert float(mask[1].min()) == 1.0 and float(mask[0, :80].max()) == 0.0  # the old world's rows weigh 0
    # after the restart the chain learns the new rate, not the mix of both worlds
    mean, _ = model.predict(x)
    assert float(mean[0]) > 0.7 and float(mean[1]) < 0.3
    save_state(model, tmp_path / "g")
    back = load_state(tmp_path / "g")
    assert torch.equal(back.engine.row_mask, mask) and back.change_points.tolist() == points


def test_settings_and_statistics_survive_a_save_and_load(tmp_path):
    d, R = 3, 4
    cfg = AdaptiveForgetting(outcomes="binary", false_alarm_rate=1e-3, odds_ratio=3.0, warmup=10, keep=0.1)
    model = BayesianLinear(_prior(d), noise_std=0.2, batch_shape=[R], forgetting=cfg, base_prior=_prior(d, 3.0))
    twin = BayesianLinear(_prior(d), noise_std=0.2, batch_shape=[R], forgetting=cfg, base_prior=_prior(d, 3.0))
    stream, copy = RateStream(R, d, 0.05, change=300, factor=5.0, seed=7), RateStream(R, d, 0.05, change=300,
                                                                                        factor=5.0, seed=7)
    _run(model, stream, 400)
    _run(twin, copy, 400)
    save_state(model, tmp_path / "m")
    back = load_state(tmp_path / "m")
    assert back.adaptive == cfg
    assert torch.equal(back._detector.since, model._detector.since)
    torch.testing.assert_close(back._base[1], model._base[1])
    _run(back, stream, 300)
    _run(twin, copy, 300)
    assert torch.equal(back.change_points, twin.change_points) and int(twin.change_points.sum()) >= 1
    torch.testing.assert_close(back.precision, twin.precision, rtol=0, atol=0)
    arms = PerArmLinear(_prior(d), 3, noise_std=0.5, decay=0.99)
    arms.update(np.ones(d), 1.0, 1)
    save_state(arms, tmp_path / "a")
    assert load_state(tmp_path / "a").decay == 0.99


ENGINES = {
    "conjugate": {"noise_std": 0.3},
    "normal-inverse-gamma": {"noise_prior": dist.InverseGamma(torch.tensor(3.0, dtype=F64), torch.tensor(0.2, dtype=F64))},
    "laplace": {"likelihood": "logistic", "inference": "laplace"},
    "gibbs": {"likelihood": "logistic", "inference": "gibbs"},
    "langevin": {"likelihood": "logistic", "inference": "langevin",
                 "inference_options": {"predict_steps": 20, "burn_in": 10}},
    "nuts": {"noise_std": 0.3, "inference": "nuts", "inference_options": {"num_samples": 40, "warmup_steps": 40}},
    "svi": {"noise_std": 0.3, "inference": "svi", "inference_options": {"svi_steps": 250}},
}


@pytest.mark.parametrize("engine", [*ENGINES, "per-arm", "unbatched"])
def test_every_engine_detects_on_0_1_outcomes(engine, tmp_path):
    d = 2
    cfg = AdaptiveForgetting(outcomes="binary", warmup=0)
    if engine == "per-arm":
        model = PerArmLinear(_prior(d), 2, noise_std=0.3, forgetting=cfg)
        for t in range(300):
            model.update(np.array([1.0, 0.0]), float(t >= 150), 0)
        assert model.arms.change_points.tolist() == [1, 0]
        return
    if engine == "unbatched":
        model = BayesianLinear(_prior(d), noise_std=0.3, forgetting=cfg)
    else:
        model = BayesianLinear(_prior(d), batch_shape=[2], forgetting=cfg, **ENGINES[engine])
    x = torch.tensor([1.0, 0.0], dtype=F64)
    for t in range(300):  # a rate of 0 that jumps to 1
        model.update(x.expand(*model.batch_shape, d), torch.full(model.batch_shape, float(t >= 150), dtype=F64))
        if engine in ("gibbs", "langevin"):
            model.sample(generator=torch.Generator().manual_seed(t))  # a chain advances as a policy draws
    assert int(model.change_points.min()) >= 1
    # the restart forgot the old world: the rate now reads near 1, where the 150 + 150 rows of both
    # worlds would read about 0.5 (NUTS / SVI: the old rows weigh 0 in the refit)
    mean, _ = model.predict(x.expand(*model.batch_shape, d))
    assert float(mean.min()) > 0.8
    save_state(model, tmp_path / "m")  # what the restart left is saved: a refit after the load forgets too
    back = load_state(tmp_path / "m")
    assert back.change_points.tolist() == model.change_points.tolist()
    if engine in ("nuts", "svi"):
        assert torch.equal(back._row_weight, model._row_weight)
        back.fit(force=True)
    assert float(back.predict(x.expand(*model.batch_shape, d))[0].min()) > 0.8


def test_a_rare_metric_is_tested_only_once_it_has_seen_enough_events():
    """``warmup_events`` (default ``2 d``): rows of a 1 % metric carry few events; an element is
    tested once it has learned that many of the rarer outcome since its (re)start."""
    d = 3
    model = BayesianLinear(_prior(d), noise_std=0.1, batch_shape=[2],
                           forgetting=AdaptiveForgetting(outcomes="binary", warmup=0))
    det = model._detector
    assert det.warmup_events == 2 * d
    x = torch.tensor([1.0, 0.0, 0.0], dtype=F64).expand(2, d)
    for t in range(200):  # element 0 sees a one every 20 rows, element 1 none
        model.update(x, torch.tensor([float(t % 20 == 19), 0.0], dtype=F64))
    assert det.ones.tolist() == [10, 0] and det.since.tolist() == [200, 200]
    # element 1 (no event yet) has never been tested: its statistics never moved
    assert float(det.upper[1]) == 0.0 and float(det.lower[1]) == 0.0
    for _ in range(2 * d - 1):  # a burst of ones: element 1's first events, too few to be tested on
        model.update(x, torch.ones(2, dtype=F64))
    assert float(det.upper[1]) == 0.0 and int(model.change_points[1]) == 0
    assert float(det.upper[0]) > 0.0 or int(model.change_points[0]) == 1  # element 0 is tested and moves


@pytest.mark.parametrize("kwargs, name", [
    ({"warmup_events": -2}, "warmup_events"),
    ({"false_alarm_rate": 0.7}, "false_alarm_rate"),
    ({"false_alarm_rate": 1e-4, "threshold": 5.0}, "threshold, false_alarm_rate"),
    ({"odds_ratio": 1.0}, "odds_ratio"),
    ({"outcomes": "counts"}, "outcomes"),
    ({"keep": 1.0}, "keep"),
    ({"warmup": -1}, "warmup"),
    ({"warmup": 2.5}, "warmup"),
])
def test_bad_detector_settings_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AdaptiveForgetting(**kwargs)


def test_bad_base_prior_decay_and_outcomes_name_the_argument():
    d = 3
    with pytest.raises(ValueError, match="base_prior"):
        BayesianLinear(_prior(d), noise_std=0.3, forgetting="adaptive", base_prior=_prior(d + 1))
    with pytest.raises(ValueError, match="base_prior"):
        BayesianLinear(_prior(d), noise_std=0.3, base_prior=_prior(d))  # nothing forgets
    with pytest.raises(ValueError, match="decay"):
        PerArmLinear(_prior(d), 2, noise_std=0.3, decay=1.5)
    model = BayesianLinear(_prior(d), noise_std=0.3, forgetting=AdaptiveForgetting(outcomes="binary"))
    with pytest.raises(ValueError, match="0/1 outcomes"):
        model.update(torch.ones(d, dtype=F64), torch.tensor(0.5, dtype=F64))
    assert math.isclose(AdaptiveForgetting().rate_bound(binary=False), 2 * math.exp(-10))


def test_the_laplace_engine_restarts_to_a_named_base_prior_and_saves_it(tmp_path):
    # a logistic model warm from a log of the old world; after the change its alarm restarts it to the
    # base prior the user named (here a narrow one at a distinctive intercept), not to its own prior
    d, R = 2, 4
    base = dist.Normal(torch.tensor([2.5, 0.0], dtype=F64), torch.tensor([0.01, 0.5], dtype=F64)).to_event(1)
    cfg = AdaptiveForgetting(false_alarm_rate=1e-3, odds_ratio=3.0)

    def model(base_prior):
        return BayesianLinear(_prior(d, 3.0), likelihood="logistic", inference="laplace", batch_shape=[R],
                              forgetting=cfg, base_prior=base_prior)

    named, plain = model(base), model(None)
    assert named.base_prior is not base and torch.allclose(named.base_prior.mean, base.mean.expand(R, d))
    assert plain.base_prior is plain.prior
    for m in (named, plain):
        _run(m, RateStream(R, d, 0.03, change=600, factor=10.0, seed=4), 900)
        assert bool((m.change_points >= 1).all())
    # what the rows since the alarm taught moved the named model's intercept little from 2.5; the plain
    # model's intercept is near the new world's logit (about -1.2)
    assert float(named.posterior_mean[:, 0].min()) > 2.3
    assert float(plain.posterior_mean[:, 0].max()) < 0.0
    save_state(named, tmp_path / "m")
    back = load_state(tmp_path / "m")
    torch.testing.assert_close(back.base_prior.mean, named.base_prior.mean, rtol=0, atol=0)
    # after the load, the same stream raises the same alarms and restarts to the same base, bit for bit
    a, b = RateStream(R, d, 0.3, seed=9), RateStream(R, d, 0.3, seed=9)
    _run(back, a, 300)
    _run(named, b, 300)
    assert torch.equal(back.change_points, named.change_points)
    assert int((named.change_points - back.change_points).sum()) == 0 and int(named.change_points.sum()) > 4 * R
    torch.testing.assert_close(back.posterior_mean, named.posterior_mean, rtol=0, atol=0)
    # a fixed factor forgets toward the base too: with a memory of about 10 rows of a 0.3 rate, the narrow
    # base holds the intercept at 2.5; without it the intercept follows those rows (below 0)
    fixed = [BayesianLinear(_prior(d, 3.0), likelihood="logistic", inference="laplace", forgetting=0.9,
                            base_prior=b) for b in (base, None)]
    for m in fixed:
        _run(m, RateStream(1, d, 0.3, seed=5), 300)
    assert abs(float(fixed[0].posterior_mean[0]) - 2.5) < 0.05
    assert float(fixed[1].posterior_mean[0]) < 0.0
    # the engines that forget back to their own prior, or whose prior moves with EM, refuse it by name
    with pytest.raises(ValueError, match="base_prior: the gibbs engine"):
        BayesianLinear(_prior(d), likelihood="logistic", inference="gibbs", forgetting=cfg, base_prior=base)
    with pytest.raises(ValueError, match="base_prior: the laplace engine returns to a base prior only from a Gaussian"):
        BayesianLinear(dist.Laplace(torch.zeros(d, dtype=F64), 1.0).to_event(1), likelihood="logistic",
                       inference="laplace", forgetting=cfg, base_prior=base)


@pytest.mark.parametrize("engine", [*ENGINES, "per-arm", "unbatched"])
def test_redraw_prior_reads_a_warm_model_of_every_engine(engine):
    # a log of 0/1 outcomes with a base rate of 0.3 and one weight of size about 0.1 to 0.4 per feature:
    # every engine's warm model gives a redraw prior that keeps the intercept and a spread of that size
    from bayes_safe.models import redraw_prior

    d, n = 3, 400
    rng = np.random.default_rng(0)
    X = np.concatenate([np.ones((n, 1)), rng.normal(size=(n, d - 1))], 1)
    w = np.array([0.3, 0.1, -0.1]) if engine not in ("laplace", "gibbs", "langevin") else np.array([-0.85, 0.5, -0.5])
    lin = X @ w
    y = (rng.uniform(size=n) < (lin if engine not in ("laplace", "gibbs", "langevin") else 1 / (1 + np.exp(-lin))))
    y = y.astype(float)
    if engine == "per-arm":
        model = PerArmLinear(_prior(d), 2, noise_std=0.45)
        for i in range(n):
            model.update(X[i], y[i], i % 2)
        prior = redraw_prior(model)
        assert prior.batch_shape == (2,) and prior.event_shape == (d,)
        assert torch.allclose(prior.mean[:, 0], model.arms.posterior_mean[:, 0])
        return
    kwargs = dict(ENGINES.get(engine, {"noise_std": 0.45}))
    if "noise_std" in kwargs:
        kwargs["noise_std"] = 0.45
    if engine in ("nuts", "svi"):
        kwargs["inference_options"] = {"num_samples": 200, "warmup_steps": 100, "seed": 0}
    model = BayesianLinear(_prior(d), **kwargs)
    model.update(torch.as_tensor(X), torch.as_tensor(y))
    prior = redraw_prior(model)
    assert prior.batch_shape == () and prior.event_shape == (d,)
    assert abs(float(prior.mean[0]) - w[0]) < 0.2  # the intercept kept
    assert torch.all(prior.mean[1:] == 0)
    assert 0.03 < float(prior.stddev[1]) < 1.0 and float(prior.stddev[1]) == float(prior.stddev[2])


@pytest.mark.parametrize("engine", ["conjugate", "normal-inverse-gamma", "laplace", "gibbs"])
def test_a_model_warm_from_its_rows_names_its_base_afterwards(engine):
    # the flow of a model warm-started by update: learn the log, then name the base it restarts to
    from bayes_safe.models import redraw_prior

    d, R = 3, 2
    cfg = AdaptiveForgetting(outcomes="binary" if engine in ("conjugate", "normal-inverse-gamma") else "auto")
    model = BayesianLinear(_prior(d), batch_shape=[R], forgetting=cfg, **ENGINES[engine])
    if engine == "gibbs":
        with pytest.raises(ValueError, match="base_prior: the gibbs engine forgets back to its own prior"):
            model.base_prior = _prior(d, 0.5)
        return
    _run(model, RateStream(R, d, 0.2, seed=3), 300)
    before = model.predict(torch.eye(d, dtype=F64).expand(R, d, d))
    base = redraw_prior(model)
    model.base_prior = base
    after = model.predict(torch.eye(d, dtype=F64).expand(R, d, d))
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # what it learned is unchanged
    torch.testing.assert_close(model.base_prior.mean, base.mean)
    model._restart(torch.ones(R, dtype=torch.bool), 0.0)  # what an alarm does
    torch.testing.assert_close(model.base_prior.mean, base.mean)
    mean = model.engine.summary(None)[0] if engine == "laplace" else model.posterior_mean
    torch.testing.assert_close(mean, base.mean, atol=1e-9, rtol=0)
    model.base_prior = None
    assert model.base_prior is model.prior
    with pytest.raises(ValueError, match="base_prior: the prior forgetting returns to"):
        BayesianLinear(_prior(d), noise_std=0.3).base_prior = base
