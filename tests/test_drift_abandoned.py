"""Issue 43: decay of abandoned arms that waits and stops (``PerArmLinear``'s ``idle_after``, ``max_sd``,
``explore_rate``, ``recall``), on a small K-armed 0/1 world written here (not the library's problems)."""

from __future__ import annotations

import math

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import ThompsonSampling
from bayes_safe.models.per_arm import PerArmLinear
from bayes_safe.state import load_state, save_state

F64 = torch.float64
NOISE = 0.35


def _prior(d: int, scale: float = 1.0):
    return dist.Normal(torch.zeros(d, dtype=F64), torch.tensor(scale, dtype=F64)).expand([d]).to_event(1)


class ImprovingArmWorld:
    """``K`` arms of 0/1 rewards, one context (an intercept); arm ``improves`` goes from its rate to
    ``after`` at step ``change``; a click is ``U < p`` for one uniform per replication and step."""

    def __init__(self, rates, improves: int, after: float, change: int | None, R: int, T: int, seed: int):
        self.K = len(rates)
        self.rates = torch.tensor(rates, dtype=F64).expand(R, self.K)
        self.rates2 = self.rates.clone()
        self.rates2[:, improves] = after
        self.change, self.R, self.T = change, R, T
        self.u = torch.rand(T, R, dtype=F64, generator=torch.Generator().manual_seed(seed))

    def run(self, model: PerArmLinear, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Thompson sampling on ``model``: the arms played ``[T, R]`` and the regret ``[T, R]``."""
        policy = ThompsonSampling(model)
        g = torch.Generator().manual_seed(seed)
        F = torch.ones(self.R, self.K, 1, dtype=F64)
        rows = torch.arange(self.R)
        played = torch.zeros(self.T, self.R, dtype=torch.long)
        regret = torch.zeros(self.T, self.R, dtype=F64)
        for t in range(self.T):
            p_all = self.rates2 if self.change is not None and t >= self.change else self.rates
            a = policy.select(F, None, generator=g)
            p = p_all[rows, a]
            played[t], regret[t] = a, p_all.max(-1).values - p
            policy.update(F[rows, a], (self.u[t] < p).to(F64), actions=a)
        return played, regret


RATES = (0.4, 0.1, 0.3)  # arm 1 is abandoned early, then improves to 0.7
WAITING = {"decay": 0.95, "idle_after": 100, "explore_rate": 0.02, "recall": 2.0}


def _found(options, R=40, T=1500, change=600, seed=3) -> float:
    world = ImprovingArmWorld(RATES, 1, 0.7, change, R, T, seed)
    model = PerArmLinear(_prior(1), 3, noise_std=NOISE, batch_shape=[R], **options)
    played, _ = world.run(model, seed + 1)
    return float(((played[-150:] == 1).double().mean(0) > 0.5).double().mean())


def test_the_waiting_decay_finds_an_abandoned_arm_that_improved():
    found = _found(WAITING)
    without = _found({})
    # measured: 40 of 40 with the waiting decay, 19 of 40 without decay
    assert found >= 0.9
    assert without <= 0.6


def test_the_waiting_decay_costs_little_when_nothing_changes():
    """On the stationary twin the waiting decay re-explores an idle arm about once per idle spell:
    far less than the clock decay at the same speed, which forgets every unplayed step."""
    R, T = 40, 1500
    world = ImprovingArmWorld(RATES, 1, 0.7, None, R, T, 5)
    cost = {}
    for name, options in (("none", {}), ("waiting", WAITING), ("clock", {"decay": 0.95})):
        model = PerArmLinear(_prior(1), 3, noise_std=NOISE, batch_shape=[R], **options)
        cost[name] = float(world.run(model, 6)[1].sum(0).mean())
    # measured: none 15.8, waiting 19.6, clock decay 0.95 86.3
    assert cost["waiting"] < 0.4 * cost["clock"]
    assert cost["waiting"] < 1.6 * cost["none"]


def test_max_sd_bounds_the_variance_of_idle_arms():
    R, K, d, cap = 6, 4, 2, 0.3
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, R, d, dtype=F64, generator=g)
    Y = torch.rand(400, R, dtype=F64, generator=g)
    # every arm in turn for 80 steps (each learns until its sd is under the cap), then arm 0 only
    A = torch.cat([torch.arange(80) % K, torch.zeros(320, dtype=torch.long)])[:, None].expand(400, R)
    highest = {}
    for name, options in (("capped", {"max_sd": cap}), ("plain", {})):
        model = PerArmLinear(_prior(d), K, noise_std=NOISE, batch_shape=[R], decay=0.9, **options)
        top = torch.zeros(R, K, dtype=F64)
        for t, (x, y, a) in enumerate(zip(X, Y, A)):
            model.update(x, y, actions=a)
            if t >= 40:
                top = torch.maximum(top, torch.linalg.eigvalsh(model.posterior_covariance)[..., -1])
        highest[name] = top
    assert bool((highest["capped"] <= cap**2 * (1 + 1e-9)).all())  # never past the cap
    assert bool((highest["capped"][:, 1:] > 0.9 * cap**2).all())  # the idle arms did grow to it
    assert bool((highest["plain"][:, 1:] > 5 * cap**2).all())  # without it they return to the prior's 1


def test_explore_rate_stops_the_decay_at_a_bounded_chance():
    R, K = 8, 3
    x = torch.ones(R, 1, dtype=F64)
    chances = {}
    for name, options in (("bounded", {"explore_rate": 0.01}), ("plain", {})):
        model = PerArmLinear(_prior(1), K, noise_std=NOISE, batch_shape=[R], decay=0.95, **options)
        g = torch.Generator().manual_seed(1)
        for t in range(60):  # arm 0 pays 0.8, the others 0.1, each learned
            a = torch.full((R,), t % K)
            model.update(x, (torch.rand(R, dtype=F64, generator=g) < torch.where(a == 0, 0.8, 0.1)).to(F64), actions=a)
        for _ in range(200):  # only arm 0 now: the others decay until their chance reaches about 1 %
            model.update(x, (torch.rand(R, dtype=F64, generator=g) < 0.8).to(F64),
                         actions=torch.zeros(R, dtype=torch.long))
        mean, var = model.predict(torch.ones(R, K, 1, dtype=F64))
        chances[name] = torch.special.ndtr((mean[:, 1:] - mean[:, :1]) / (var[:, 1:] + var[:, :1]).sqrt())
    # about the rate (one step's decay and the best arm's own learning move it a little past)
    assert bool((chances["bounded"] < 0.025).all()) and bool((chances["bounded"] > 0.003).all())
    assert bool((chances["plain"] > 0.1).all())  # without it the idle arms return to the prior


def test_recall_undoes_the_decay_when_a_probe_finds_nothing_new():
    K = 2
    model = PerArmLinear(_prior(1), K, noise_std=NOISE, decay=0.5, idle_after=0, recall=2.0)
    x = torch.ones(1, dtype=F64)
    for _ in range(30):
        model.update(x, torch.tensor(0.1, dtype=F64), actions=1)
    before = model.arms.precision[1].clone()
    for _ in range(5):  # arm 1 idle: its precision falls back toward the prior's
        model.update(x, torch.tensor(1.0, dtype=F64), actions=0)
    assert float(model.arms.precision[1]) < 0.1 * float(before)
    model.update(x, torch.tensor(0.1, dtype=F64), actions=1)  # a probe like what it knew: recalled, and learned
    torch.testing.assert_close(model.arms.precision[1], before + 1 / NOISE**2)
    for _ in range(5):
        model.update(x, torch.tensor(1.0, dtype=F64), actions=0)
    model.update(x, torch.tensor(1.0, dtype=F64), actions=1)  # a surprise (z > 2): the decay stays
    assert float(model.arms.precision[1]) < 0.2 * float(before)
    assert float(model.posterior_mean[1, 0]) > 0.5


def test_without_the_new_options_decay_is_unchanged_bit_for_bit():
    R, K, d = 5, 3, 2
    g = torch.Generator().manual_seed(2)
    X = torch.randn(50, R, d, dtype=F64, generator=g)
    Y = torch.rand(50, R, dtype=F64, generator=g)
    A = torch.randint(0, K, (50, R), generator=g)
    plain = PerArmLinear(_prior(d), K, noise_std=NOISE, batch_shape=[R], decay=0.97)
    named = PerArmLinear(_prior(d), K, noise_std=NOISE, batch_shape=[R], decay=0.97, idle_after=None, max_sd=None,
                         explore_rate=None, recall=None)
    waits_zero = PerArmLinear(_prior(d), K, noise_std=NOISE, batch_shape=[R], decay=0.97, idle_after=0)
    assert named._clock is None and named.arms.decay == 0.97 and named.idle_after is None
    for x, y, a in zip(X, Y, A):
        for m in (plain, named, waits_zero):
            m.update(x, y, actions=a)
    assert torch.equal(plain.arms.precision, named.arms.precision) and torch.equal(plain.arms.eta, named.arms.eta)
    # idle_after=0 waits no step: the same decay as decay alone, by its own path
    assert torch.equal(plain.arms.precision, waits_zero.arms.precision)
    assert torch.equal(plain.arms.eta, waits_zero.arms.eta)
    # a plain decay's saved state has no clock (as written before)
    assert plain.decay == 0.97 and plain.idle_steps is None


def test_unbatched_models_work_and_sample():
    model = PerArmLinear(_prior(2), 3, noise_std=NOISE, **WAITING)
    for t in range(300):
        model.update(torch.tensor([1.0, 0.5], dtype=F64), torch.tensor(float(t % 2), dtype=F64), actions=t % 2)
    assert model.idle_steps.tolist() == [1, 0, 300]
    assert model.sample_at(torch.ones(3, 2, dtype=F64)).shape == (3,)
    assert "idle_after=100" in repr(model) and "recall=2.0" in repr(model)


@pytest.mark.parametrize("options", [{"decay": 0.9, "idle_after": 20, "recall": 2.0}, WAITING,
                                     {"decay": 0.99, "max_sd": 0.2}, {"decay": 0.99, "idle_after": 3}])
def test_save_load_round_trips_the_waiting_decay(tmp_path, options):
    R, K, d = 3, 3, 2
    g = torch.Generator().manual_seed(4)
    X = torch.randn(400, R, d, dtype=F64, generator=g)
    Y = torch.rand(400, R, dtype=F64, generator=g)
    A = torch.where(torch.rand(400, R, generator=g) < 0.97, 0, torch.randint(0, K, (400, R), generator=g))
    model = PerArmLinear(_prior(d), K, noise_std=NOISE, batch_shape=[R], **options)
    for x, y, a in zip(X[:300], Y[:300], A[:300]):
        model.update(x, y, actions=a)
    if options.get("idle_after") == 20:
        assert bool(model._clock.held.any())  # some arms hold what they knew: saved mid-spell
    save_state(model, tmp_path / "m")
    back = load_state(tmp_path / "m")
    for name in ("decay", "idle_after", "max_sd", "explore_rate", "recall"):
        assert getattr(back, name) == getattr(model, name)
    assert torch.equal(back.idle_steps, model.idle_steps)
    for x, y, a in zip(X[300:], Y[300:], A[300:]):  # both continue the same
        model.update(x, y, actions=a)
        back.update(x, y, actions=a)
    torch.testing.assert_close(back.arms.precision, model.arms.precision, rtol=0, atol=0)
    torch.testing.assert_close(back.arms.eta, model.arms.eta, rtol=0, atol=0)
    assert torch.equal(back.idle_steps, model.idle_steps)


@pytest.mark.parametrize("options, name", [
    ({"decay": 0.99, "idle_after": -1}, "idle_after"), ({"decay": 0.99, "idle_after": 2.5}, "idle_after"),
    ({"decay": 0.99, "idle_after": True}, "idle_after"), ({"decay": 0.99, "max_sd": 0.0}, "max_sd"),
    ({"decay": 0.99, "max_sd": math.nan}, "max_sd"), ({"decay": 0.99, "explore_rate": 0.7}, "explore_rate"),
    ({"decay": 0.99, "recall": -1.0}, "recall"), ({"idle_after": 10}, "idle_after"), ({"max_sd": 0.3}, "max_sd"),
    ({"explore_rate": 0.01}, "explore_rate"), ({"recall": 2.0}, "recall"), ({"decay": 1.0, "idle_after": 5}, "decay"),
])
def test_bad_options_name_the_argument(options, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        PerArmLinear(_prior(2), 3, noise_std=NOISE, **options)


def test_recall_needs_a_known_noise_sd():
    with pytest.raises(ValueError, match="^recall"):
        PerArmLinear(_prior(2), 3, noise_prior=dist.InverseGamma(torch.tensor(2.0, dtype=F64), torch.tensor(1.0, dtype=F64)),
                     decay=0.99, recall=2.0)
