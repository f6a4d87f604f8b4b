"""Drifting problems inside tuning studies (issue 41, item 2).

Written as a user would: two offers whose conversion rates swap halfway through the A/B test (a
``draw(n, generator, step)`` with a time axis, as ``simulate`` runs it), a steady twin whose
``draw(n, generator)`` knows no step, and ``models`` hooks with and without the trial's
``forgetting``. Each batch of a trial is the problem's step ``b``; forgetting pays on the drifting
problem and not on the steady one; a hook that cannot receive ``forgetting`` is told why it is
refused and what to write.
"""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import Problem, Units
from bayes_safe.tuning import ABTest, Range
from bayes_safe.tuning.own_problem import SimulatedProblem

F64 = torch.float64
BATCHES = 10
SWAP = BATCHES // 2
BEFORE = torch.tensor([0.2, 0.8], dtype=F64)  # offer 1 converts best until the swap, offer 0 after it


class SwappingOffers(Problem):
    """Two offers (one-hot features), today's offer 0 the baseline; their rates swap at ``swap_at``."""

    name = "swapping-offers"
    metric_names = ("conversion",)
    noise_std = (0.5,)

    def __init__(self, swap_at: int = SWAP):
        self.swap_at = swap_at
        self.asked: list[tuple[int, int]] = []  # (n, step) of every draw

    def means_at(self, step: int) -> torch.Tensor:
        return BEFORE if step < self.swap_at else BEFORE.flip(0)

    def draw(self, n, generator, step):  # no default: a step is always needed
        self.asked.append((n, step))
        features = torch.eye(2, dtype=F64).expand(n, 2, 2)
        noise = torch.randn(n, generator=generator, dtype=F64)  # common random numbers of the step
        return Units(features, torch.zeros(n, dtype=torch.long), context=(self.means_at(step).expand(n, 2), noise))

    def expected_all(self, units):
        return units.context[0][..., None]

    def outcomes(self, units, actions):
        means, noise = units.context
        return (means[torch.arange(len(units)), actions] + 0.5 * noise)[:, None]


class SteadyOffers(SwappingOffers):
    """The stationary twin: the offers never swap, and its ``draw`` takes no step (as before steps)."""

    name = "steady-offers"

    def draw(self, n, generator):
        return super().draw(n, generator, 0)


def _model(replications, forgetting=None):
    prior = dist.Normal(torch.zeros(2, dtype=F64), 0.5).to_event(1)
    return BayesianLinear(prior, noise_std=0.5, batch_shape=() if replications is None else (replications,),
                          forgetting=forgetting)


class SwappingWithModels(SwappingOffers):
    """Its own models, told the trial's forgetting."""

    def __init__(self, swap_at: int = SWAP):
        super().__init__(swap_at)
        self.received = []

    def models(self, replications, forgetting=None):
        self.received.append(forgetting)
        return [_model(replications, forgetting)]


class SwappingWithParameters(SwappingOffers):
    """Its own models, given every parameter of the trial."""

    def __init__(self, swap_at: int = SWAP):
        super().__init__(swap_at)
        self.received = []

    def models(self, replications, parameters=None):
        self.received.append(dict(parameters or {}))
        return [_model(replications, (parameters or {}).get("forgetting"))]


class SwappingWithFixedModels(SwappingOffers):
    """Its own models, which cannot be told a forgetting factor."""

    def models(self, replications):
        return [_model(replications, 0.99)]


def _ab(problem, n_users=2_000, replicates=4):
    return ABTest(problem, n_users=n_users, batches=BATCHES, policy="ts", compare=(), replicates=replicates)


def _conversion_change(ab, parameters, seed=0):
    return ab.evaluate(parameters, seed=seed)["conversion_change"][0]


def test_each_batch_of_a_trial_is_drawn_at_its_step_as_simulate_numbers_them():
    problem = SwappingOffers()
    _ab(problem, n_users=400, replicates=2).evaluate({}, seed=1)
    trial = [step for n, step in problem.asked if n > 1]  # n = 1: the tuner's probe of the feature width
    assert trial == [*range(BATCHES), *range(BATCHES)]  # batch b is step b, in each replicate
    assert all(step == 0 for n, step in problem.asked if n == 1)
    # simulate asks the same problem for the same steps, one round of decisions each
    problem.asked.clear()
    simulate(ThompsonSampling(_model(1)), problem, horizon=BATCHES, seed=0, progress=False)
    assert [step for _, step in problem.asked] == list(range(BATCHES))
    # the steady twin, whose draw takes no step, runs unchanged
    steady = SteadyOffers()
    _ab(steady, n_users=400, replicates=1).evaluate({}, seed=1)
    assert [step for n, step in steady.asked if n > 1] == [0] * BATCHES


def test_forgetting_wins_the_ab_test_when_the_offers_swap_and_not_when_they_stay():
    drifting, steady = _ab(SwappingOffers()), _ab(SteadyOffers())
    forget, keep = _conversion_change(drifting, {"forgetting": 0.9}), _conversion_change(drifting, {})
    assert forget > keep + 15, (forget, keep)  # in % of the baseline's conversion (SE about 15 and 5)
    forget, keep = _conversion_change(steady, {"forgetting": 0.9}), _conversion_change(steady, {})
    assert forget < keep, (forget, keep)  # steady offers: forgetting only throws evidence away


def test_a_models_hook_that_takes_forgetting_is_tuned_with_it():
    problem = SwappingWithModels()
    simulated = SimulatedProblem(problem)
    assert simulated.own_models and "forgetting" in simulated.known_parameters()
    simulated.check_parameters([Range("forgetting", 0.8, 1.0)])
    assert "each trial's `forgetting` is passed to the hook" in simulated.models_text()
    ab = _ab(simulated)
    problem.received.clear()
    forget = _conversion_change(ab, {"forgetting": 0.9})
    assert set(problem.received) == {0.9}
    problem.received.clear()
    keep = _conversion_change(ab, {})
    assert set(problem.received) == {None}  # not set by the trial: the hook's own default
    assert forget > keep + 15, (forget, keep)
    env = simulated.make_env({}, 0)
    for value, setting in (("none", None), ("0.95", 0.95), (1.0, None), ("adaptive", "adaptive")):
        policy = simulated.make_policy("ts", {"forgetting": value}, env, seed=0, refit_every=10)
        assert policy.models()["reward"].forgetting == setting
    # the parameters form receives every parameter of the trial, forgetting converted
    with_parameters = SwappingWithParameters()
    simulated = SimulatedProblem(with_parameters)
    assert "forgetting" in simulated.known_parameters()
    simulated.make_policy("ts", {"forgetting": "0.9"}, env, seed=0, refit_every=10)
    assert with_parameters.received[-1] == {"forgetting": 0.9}


def test_a_models_hook_that_cannot_take_forgetting_is_refused_with_the_reason_and_the_fix():
    simulated = SimulatedProblem(SwappingWithFixedModels())
    assert "forgetting" not in simulated.known_parameters()
    why = (r"'forgetting' is refused because SwappingWithFixedModels\.models\(replications\) builds the problem's own "
           r"models and takes neither a `forgetting` nor a `parameters` argument.*"
           r"def models\(self, replications, forgetting=None\)")
    with pytest.raises(ValueError, match=why):
        simulated.check_parameters([Range("forgetting", 0.8, 1.0)])
    with pytest.raises(ValueError, match=why):
        _ab(simulated, n_users=40, replicates=1).evaluate({"forgetting": 0.9})
    with pytest.raises(ValueError, match=why):
        simulated.check_parameter_values({"forgetting": "adaptive"})


@pytest.mark.slow
def test_a_study_tunes_forgetting_through_the_hook_and_refuses_a_hook_that_cannot_take_it(tmp_path):
    """The study's search space: ``forgetting=0.8:1`` runs on a hook that takes it; on one that cannot,
    the study is refused before it starts, with the reason (about 5 s: Ax)."""
    from bayes_safe.tuning import Study

    problem = SwappingWithModels()
    study = Study(_ab(problem, n_users=400, replicates=1), parameters=["forgetting=0.8:1"],
                  storage=tmp_path / "hook.sqlite", sobol_trials=2, seed=0)
    study.run(trials=2, inline=True)
    assert study.counts() == {"COMPLETED": 2}
    factors = [t.arm.parameters["forgetting"] for t in study.experiment.trials.values()]
    assert all(0.8 <= f <= 1 for f in factors)
    with pytest.raises(ValueError, match="'forgetting' is refused because SwappingWithFixedModels.models"):
        Study(_ab(SwappingWithFixedModels(), n_users=400, replicates=1), parameters=["forgetting=0.8:1"],
              storage=tmp_path / "fixed.sqlite")
