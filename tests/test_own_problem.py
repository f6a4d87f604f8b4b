"""A problem written here, not in the library, through ``simulate`` (issue 15).

The email scenario: which of 3 send times to use for each user (6 user features); a 0/1
click is the reward; a 0/1 unsubscribe whose rate may not rise more than 2 % against today's
send time (arm 0): ``Constraint.relative("unsubscribe", at_most=1.02)``.
"""

from __future__ import annotations

import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import Constraint, Problem, Units, daulton2019
from bayes_safe.factory import make_policy
from bayes_safe.metrics import summary, violation_rate
from bayes_safe.trace import Trace

K, P = 3, 6  # send times, user features
D = K * P  # the model's features: the user's features in the block of the send time


class EmailTiming(Problem):
    """3 send times; click (reward) and unsubscribe (at most 1.02 x today's rate) per user."""

    name = "email-timing"
    metric_names = ("click", "unsubscribe")
    constraints = (Constraint.relative("unsubscribe", at_most=1.02),)
    noise_std = (0.5, 0.5)

    def __init__(self, replications: int = 8, seed: int = 0):
        self.replications = replications
        g = torch.Generator().manual_seed(seed)
        # per send time: click and unsubscribe weights on the user features
        self.click_w = 0.25 * torch.rand(K, P, generator=g, dtype=torch.float64)
        self.unsub_w = 0.05 * torch.rand(K, P, generator=g, dtype=torch.float64)
        self.unsub_w[2] *= 3.0  # the late send time clicks well but annoys

    def _features(self, users):  # [n, P] -> [n, K, K * P]
        eye = torch.eye(K, dtype=users.dtype)
        return (eye[None, :, :, None] * users[:, None, None, :]).reshape(len(users), K, D)

    def _rates(self, units):  # [n, K, 2]
        users = units.context["users"]
        click = (users @ self.click_w.T).clamp(0.01, 0.99)
        unsub = (users @ self.unsub_w.T).clamp(0.001, 0.99)
        return torch.stack([click, unsub], -1)

    def draw(self, n, generator):
        users = torch.rand(n, P, generator=generator, dtype=torch.float64)
        users[:, 0] = 1.0  # an intercept
        noise = torch.rand(n, K, 2, generator=generator, dtype=torch.float64)  # common random numbers
        return Units(self._features(users), torch.zeros(n, dtype=torch.long), context={"users": users, "u": noise})

    def outcomes(self, units, actions):
        rows = torch.arange(len(units))
        return (units.context["u"][rows, actions] < self._rates(units)[rows, actions]).double()

    def expected(self, units, actions):
        return self._rates(units)[torch.arange(len(units)), actions]


class EmailNoMeans(EmailTiming):
    """The same simulator without ``expected`` (a simulator that only samples)."""

    expected = Problem.expected


def _prior(R, d=D, noise=0.5):
    prior = dist.Normal(torch.zeros(d, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)).to_event(1)
    return BayesianLinear(prior, noise_std=noise, batch_shape=[R])


def _policies(R):
    return {
        "ts": ThompsonSampling(_prior(R)),
        "ts-asc": TSASC(_prior(R), [_prior(R)], constraints=[Constraint.relative("unsubscribe", at_most=1.02)]),
    }


@pytest.mark.parametrize("name", ["ts", "ts-asc"])
def test_email_problem_runs_with_regret_and_violations(name):
    problem = EmailTiming(replications=8)
    trace = simulate(_policies(8)[name], problem, 60, seed=3)  # conjugate models: inference mode
    assert trace.actions.shape == (60, 8) and trace.observed.shape == (60, 8, 2)
    assert torch.isfinite(trace.regret).all() and (trace.regret >= -1e-12).all()
    assert trace.regret_available and trace.attrs["problem"] == "email-timing"
    assert trace.attrs["constraints"] == [{"metric": "unsubscribe", "bound": 1.02, "at_most": True,
                                           "versus_baseline": True}]
    info = summary(trace)
    assert math.isfinite(info["final_cumulative_regret_mean"]) and 0 <= info["violation_rate"] <= 1
    assert set(trace.observed.unique().tolist()) <= {0.0, 1.0}


def test_same_seed_same_trace():
    a = simulate(_policies(4)["ts-asc"], EmailTiming(replications=4), 30, seed=5)
    b = simulate(_policies(4)["ts-asc"], EmailTiming(replications=4), 30, seed=5)
    c = simulate(_policies(4)["ts-asc"], EmailTiming(replications=4), 30, seed=6)
    for f in ("actions", "observed", "regret", "violation"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.observed, c.observed)


def test_without_expected_regret_is_unavailable_not_zero(tmp_path):
    trace = simulate(_policies(8)["ts-asc"], EmailNoMeans(replications=8), 25, seed=1)
    assert trace.attrs["regret_available"] is False and not trace.regret_available
    assert torch.isnan(trace.regret).all() and torch.isnan(trace.expected).all()
    assert torch.isfinite(trace.observed).all()
    info = summary(trace)
    for key in ("final_cumulative_regret_mean", "mean_per_step_regret", "violation_rate",
                "normalized_constraint_last100_mean"):
        assert info[key] is None, key
    assert torch.isnan(violation_rate(trace)).all()
    trace.to_netcdf(tmp_path / "t.nc")
    back = Trace.from_netcdf(tmp_path / "t.nc")
    assert back.attrs["regret_available"] is False and back.attrs["constraints"] == trace.attrs["constraints"]


def test_figure_with_and_without_regret(tmp_path):
    from bayes_safe.plots import plot_simulation

    with_means = simulate(_policies(4)["ts-asc"], EmailTiming(replications=4), 20, seed=1)
    without = simulate(_policies(4)["ts-asc"], EmailNoMeans(replications=4), 20, seed=1)
    plot_simulation({"ts-asc": with_means}, tmp_path / "a.png", title="email")
    fig = plot_simulation({"ts-asc": without}, tmp_path / "b.png")
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("unavailable" in t for t in texts)


def test_constraints_equal_alpha_bit_for_bit_on_daulton():
    env = daulton2019(replications=6, seed=2, alpha=0.05)
    by_alpha = simulate(make_policy("ts-asc", env, alpha=0.05), env, 80, seed=4)
    by_constraint = simulate(make_policy("ts-asc", env, constraints=[Constraint.from_alpha("constraint", 0.05)]),
                             env, 80, seed=4)
    for f in ("actions", "observed", "expected", "regret", "violation"):
        assert torch.equal(getattr(by_alpha, f), getattr(by_constraint, f)), f


class BadMetric(Problem):
    """Two fixed arms, noisy 'quality' reward and a lower-is-better 'bad' metric.

    Arm 1 has the higher reward and twice the bad metric of arm 0 (the baseline).
    """

    name = "bad-metric"
    metric_names = ("quality", "bad")
    constraints = (Constraint.relative("bad", at_most=1.1),)
    replications = 8
    means = torch.tensor([[1.0, 1.0], [2.0, 2.0]], dtype=torch.float64)  # [K, M]

    def draw(self, n, generator):
        features = torch.eye(2, dtype=torch.float64).expand(n, 2, 2)
        return Units(features, torch.zeros(n, dtype=torch.long),
                     context=torch.randn(n, 2, 2, generator=generator, dtype=torch.float64))

    def outcomes(self, units, actions):
        rows = torch.arange(len(units))
        return self.means[actions] + 0.5 * units.context[rows, actions]

    def expected(self, units, actions):
        return self.means[actions]


def test_at_most_constraint_keeps_a_lower_is_better_metric_down():
    R, T = 8, 300
    ts = simulate(ThompsonSampling(_prior(R, 2)), BadMetric(), T, seed=1)
    asc = simulate(TSASC(_prior(R, 2), [_prior(R, 2)], constraints=BadMetric.constraints), BadMetric(), T, seed=1)
    assert ts.expected[..., 1].mean() > 1.8  # TS raises the bad metric
    assert asc.expected[..., 1].mean() < 1.1  # TS-ASC keeps it near the baseline's
    assert asc.violation.double().mean() < 0.1 < ts.violation.double().mean()


# --- bad input -------------------------------------------------------------------------------


def test_problem_missing_outcomes_lists_what_is_missing():
    class NoOutcomes(Problem):
        metric_names = ("click",)

        def draw(self, n, generator):
            return Units(torch.zeros(n, 2, 3, dtype=torch.float64), torch.zeros(n, dtype=torch.long))

    with pytest.raises(TypeError, match="missing: outcomes"):
        simulate(ThompsonSampling(_prior(1, 3)), NoOutcomes(), 5)

    class Nothing:
        def draw(self, n, generator): ...

        def outcomes(self, units, actions): ...

    with pytest.raises(TypeError, match="metric_names"):
        simulate(ThompsonSampling(_prior(1, 3)), Nothing(), 5)


def test_features_of_the_wrong_width_for_the_model():
    policy = ThompsonSampling(_prior(8, D + 1))
    with pytest.raises(ValueError, match=r"problem.draw returned features of shape \[8, 3, 18\] at step 0"):
        simulate(policy, EmailTiming(replications=8), 5)


def test_lower_is_better_absolute_constraint_with_negative_threshold():
    with pytest.raises(ValueError, match="lower-is-better threshold on 'unsubscribe' must be >= 0"):
        Constraint.absolute("unsubscribe", at_most=-0.1)


class NaNAtStep12(EmailTiming):
    def outcomes(self, units, actions):
        out = super().outcomes(units, actions)
        self.calls = getattr(self, "calls", -1) + 1
        if self.calls == 12:
            out[3, 1] = float("nan")
        return out


def test_nan_in_outcomes_names_step_and_metric_and_writes_nothing(tmp_path):
    seen = []
    with pytest.raises(ValueError, match="problem.outcomes returned NaN for metric 'unsubscribe' at step 12"):
        simulate(_policies(8)["ts-asc"], NaNAtStep12(replications=8), 30, callback=lambda t, info: seen.append(t))
    assert seen == list(range(12))  # step 12 never completed: nothing recorded for it


def test_constraint_on_an_unknown_metric():
    class Unknown(EmailTiming):
        constraints = (Constraint.relative("complaints", at_most=1.0),)

    with pytest.raises(ValueError, match="'complaints' is not one of the metrics"):
        simulate(_policies(8)["ts"], Unknown(), 5)


def test_constraint_models_must_match_the_problems_constraint_metrics():
    policy = TSASC(_prior(8), [_prior(8), _prior(8)], alpha=0.01)
    with pytest.raises(ValueError, match="models 2 constraint metrics but problem 'email-timing' has 1"):
        simulate(policy, EmailTiming(replications=8), 5)


class Float32Numpy(EmailTiming):
    def draw(self, n, generator):
        units = super().draw(n, generator)
        return Units(units.features.float().numpy(), units.baseline.numpy(), context=units.context)

    def outcomes(self, units, actions):
        return super().outcomes(units, actions).float().numpy()

    def expected(self, units, actions):
        return super().expected(units, actions).numpy().astype(np.float32)


def test_numpy_and_float32_returns_are_accepted():
    trace = simulate(_policies(4)["ts-asc"], Float32Numpy(replications=4), 20, seed=2)
    assert trace.expected.dtype == torch.float64 and torch.isfinite(trace.regret).all()


def test_models_accept_features_made_under_inference_mode():
    # the crash: the feature cache read ``_version`` of an inference tensor
    policy = TSASC(_prior(4, 3), [_prior(4, 3)], constraints=[Constraint.relative("c", at_most=1.02)])
    with torch.inference_mode():
        for _ in range(3):
            features = torch.rand(4, 5, 3, dtype=torch.float64)  # a new tensor each step
            actions = policy.select(features, torch.zeros(4, dtype=torch.long))
            policy.update(features[torch.arange(4), actions], torch.ones(4, dtype=torch.float64),
                          torch.ones(4, 1, dtype=torch.float64))
    assert actions.shape == (4,)


def test_constraint_forms_in_ts_asc_and_clucb2():
    from bayes_safe.policies import CLUCB2ASC

    with pytest.raises(ValueError, match="exactly one of alpha= and constraints="):
        TSASC(_prior(2, 3), [_prior(2, 3)], alpha=0.1, constraints=[Constraint.from_alpha("c", 0.1)])
    with pytest.raises(ValueError, match="one per constraint model"):
        TSASC(_prior(2, 3), [_prior(2, 3)], constraints=[Constraint.from_alpha("c", 0.1)] * 2)
    with pytest.raises(TypeError, match="Constraint"):
        TSASC(_prior(2, 3), [_prior(2, 3)], constraints=[0.1])
    ok = CLUCB2ASC(_prior(2, 3), [_prior(2, 3)], constraints=[Constraint.from_alpha("c", 0.1)])
    torch.testing.assert_close(ok.alpha, torch.tensor([0.1], dtype=torch.float64))
    for c in (Constraint.relative("c", at_most=1.02), Constraint.absolute("c", at_least=0.5)):
        with pytest.raises(ValueError, match="CLUCB2-ASC supports only Constraint.relative"):
            CLUCB2ASC(_prior(2, 3), [_prior(2, 3)], constraints=[c])


def test_policy_constraints_must_name_the_problems_metrics_in_order():
    policy = TSASC(_prior(8), [_prior(8)], constraints=[Constraint.relative("complaints", at_most=1.0)])
    with pytest.raises(ValueError, match="guards 'complaints' but its constraint model 0 learns metric 1"):
        simulate(policy, EmailTiming(replications=8), 5)


def test_duplicate_metric_names_and_bad_draw_returns_are_clear():
    class Twice(EmailTiming):
        metric_names = ("click", "click")
        constraints = ()

    with pytest.raises(ValueError, match="distinct names"):
        simulate(_policies(8)["ts"], Twice(), 5)

    class BaselineOutOfRange(EmailTiming):
        def draw(self, n, generator):
            units = super().draw(n, generator)
            return Units(units.features, torch.full((n,), 3), context=units.context)

    with pytest.raises(ValueError, match=r"problem.draw returned a baseline action outside \[0, 3\) at step 0"):
        simulate(_policies(8)["ts-asc"], BaselineOutOfRange(), 5)

    class WrongOutcomeShape(EmailTiming):
        def outcomes(self, units, actions):
            return super().outcomes(units, actions)[:, :1]

    with pytest.raises(ValueError, match=r"problem.outcomes returned shape \[8, 1\] at step 0; expected \[8, 2\]"):
        simulate(_policies(8)["ts-asc"], WrongOutcomeShape(), 5)


def test_one_context_without_the_replication_axis():
    """A production caller passes one context [K, d] (numpy, float32), an int baseline, and learns from one row."""
    import numpy as np
    import pyro.distributions as dist

    from bayes_safe import TSASC, BayesianLinear, Constraint

    def model():
        return BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_std=0.5)

    policy = TSASC(model(), [model()], constraints=[Constraint.relative("unsubscribe", at_most=1.02)])
    context = np.random.default_rng(0).random((4, 3)).astype(np.float32)
    action = policy.select(context, 0, generator=torch.Generator().manual_seed(0))
    assert action.shape == (1,) and 0 <= int(action) < 4
    assert int(policy.select(context, 2, valid=[False, False, True, False])) == 2
    policy.update(context[int(action)], 1.0, [0.0])
    assert int(policy.reward_model.num_observations) == 1
    with pytest.raises(ValueError, match="features"):
        policy.select(context[:, :2], 0)
