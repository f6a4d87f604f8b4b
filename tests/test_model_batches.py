"""A batch of R models is R independent models, for every model kind in ``bayes_safe.models``.

``bayes_safe.simulate`` runs ``R`` replications in lockstep: each step the policy's models see
features ``[R, K, d]`` and are updated with one row per replication (``[R, d]``). A model kind
must then either hold ``R`` independent posteriors (``batch_shape=[R]``), so that replication
``r`` of a batched run is the run of replication ``r`` alone, or refuse ``R > 1`` with an error
that names the argument, before any work. It must never pool the replications into one
posterior (issue 16 item 8: a ``ProbitGP`` held 240 observations after 60 steps at ``R = 4``).

Kinds checked here (``test_every_model_kind_is_covered`` fails when a new one is exported):

* ``BayesianLinear``, conjugate (known noise and Normal-Inverse-Gamma) and ``PerArmLinear``:
  a batched ``simulate`` run equals the ``R`` one-replication runs, field by field.
* ``BayesianLinear(inference="nuts" | "svi")`` / ``PyroLinearPosterior``: each batch element is
  fitted on its own rows only (changing the other elements' data changes nothing) and element 0
  is the unbatched fit. Bit-for-bit equality of replication ``r > 0`` with its one-replication
  run does not hold (the fit seed comes from the batch index, and the prior draws before the
  first fit are drawn for the whole batch at once): the strict xfail below records that gap.
* ``ProbitGP`` and its views ``SuccessProbability`` / ``ScaledOutcome`` (Daulton et al. 2019,
  s.5.2; one posterior): ``simulate`` with ``R > 1`` raises a ``ValueError`` naming
  ``replications`` before any observation is recorded; ``R = 1`` runs.
"""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch

import bayes_safe.models
from bayes_safe import BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import Problem, Units
from bayes_safe.models import PerArmLinear
from bayes_safe.models.pyro_inference import PyroLinearPosterior
from bayes_safe.policies import TSASC, Greedy
from bayes_safe.random import ReplicationRNG, replication_seeds, standard_normal, standard_uniform
from bayes_safe.threads import single_thread

R, K, D = 3, 4, 3
SEEDS = replication_seeds(11, R)
W_TRUE = torch.tensor([[0.5, -1.0, 0.8], [1.0, 0.3, -0.4], [-0.2, 0.9, 0.6], [0.4, 0.4, 0.4]], dtype=torch.float64)
FIELDS = ("actions", "baseline", "observed")


class _Toy(Problem):
    """``K = 4`` candidates with standard-normal features ``[K, 3]``; replication-separable streams.

    ``binary=False``: reward ``x^T w_a + 0.5 e`` (linear models, ``w_a`` the row of the chosen
    action, ignored by shared-weight models); ``binary=True``: success ``u < Phi(x^T w_a)``, and
    with ``constraint=True`` a second metric, the same success (TS-ASC's constraint).
    """

    name = "batch-check"
    replication_streams = True

    def __init__(self, replications: int, binary: bool = False, constraint: bool = False):
        self.replications = replications
        self.binary = binary
        self.metric_names = ("reward", "success") if constraint else ("reward",)
        self.constraints = ()
        self.calls = 0

    def draw(self, n, generator):
        x = standard_normal((n, K, D), generator, key="env/features")
        noise = (standard_uniform((n,), generator, key="env/noise") if self.binary
                 else standard_normal((n,), generator, key="env/noise"))
        return Units(x, torch.zeros(n, dtype=torch.long), context=noise)

    def outcomes(self, units, actions):
        self.calls += 1
        x = units.features[torch.arange(len(units)), actions]
        f = (x * W_TRUE[actions]).sum(-1)
        if self.binary:
            y = (units.context < torch.special.ndtr(f)).double()
        else:
            y = f + 0.5 * units.context
        return torch.stack([y] * len(self.metric_names), -1)


def _normal_prior():
    return dist.Normal(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)).expand([D]).to_event(1)


CONJUGATE = {
    "BayesianLinear (conjugate, known noise)": lambda batch: BayesianLinear(_normal_prior(), noise_std=0.5, batch_shape=batch),
    "BayesianLinear (conjugate, Normal-Inverse-Gamma)": lambda batch: BayesianLinear(
        _normal_prior(), noise_prior=dist.InverseGamma(torch.tensor(3.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)),
        batch_shape=batch),
    "PerArmLinear": lambda batch: PerArmLinear(_normal_prior(), num_arms=K, noise_std=0.5, batch_shape=batch),
}


@pytest.mark.parametrize("kind", list(CONJUGATE))
def test_conjugate_batch_equals_separate_runs(kind):
    T = 30
    make = CONJUGATE[kind]
    batched = simulate(ThompsonSampling(make([R])), _Toy(R), T, seed=SEEDS)
    for r in range(R):
        single = simulate(ThompsonSampling(make([1])), _Toy(1), T, seed=[SEEDS[r]])
        one = batched.replication(r)
        for f in FIELDS:
            assert torch.equal(getattr(one, f), getattr(single, f)), f"{kind}: field {f} differs for replication {r}"


@pytest.mark.parametrize("kind", list(CONJUGATE))
def test_conjugate_batch_posterior_equals_separate_models(kind):
    make = CONJUGATE[kind]
    g = torch.Generator().manual_seed(0)
    X = torch.randn(R, 8, D, generator=g, dtype=torch.float64)
    y = torch.randn(R, 8, generator=g, dtype=torch.float64)
    a = torch.randint(0, K, (R, 8), generator=g)
    batched = make([R])
    alone = [make([]) for _ in range(R)]
    for i in range(8):
        if kind == "PerArmLinear":
            batched.update(X[:, i], y[:, i], actions=a[:, i])
            for r in range(R):
                alone[r].update(X[r, i], y[r, i], actions=a[r, i])
        else:
            batched.update(X[:, i], y[:, i])
            for r in range(R):
                alone[r].update(X[r, i][None], y[r, i][None])
    for r in range(R):
        torch.testing.assert_close(batched.posterior_mean[r], alone[r].posterior_mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(batched.posterior_covariance[r], alone[r].posterior_covariance, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------- Pyro inference (NUTS, SVI)
PYRO_OPTIONS = {
    "nuts": {"num_samples": 15, "warmup_steps": 15, "seed": 3},
    "svi": {"num_samples": 15, "svi_steps": 40, "seed": 3},
}


def _laplace_prior():
    return dist.Laplace(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)).expand([D]).to_event(1)


@pytest.mark.parametrize("method", ["nuts", "svi"])
def test_pyro_batch_elements_are_fitted_on_their_own_rows_only(method):
    """Through ``BayesianLinear`` (which drives ``PyroLinearPosterior``): no element sees another's rows."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(R, 12, D, generator=g, dtype=torch.float64)
    y = torch.randn(R, 12, generator=g, dtype=torch.float64)
    changed = y.clone()
    changed[1:] += 3.0  # every element but 0 gets other data

    def fitted(batch, X, y):
        m = BayesianLinear(_laplace_prior(), noise_std=0.5, batch_shape=batch, inference=method,
                           inference_options=PYRO_OPTIONS[method])
        m.update(X, y)
        m.fit()
        return m.engine.draws

    with single_thread():
        draws = fitted([R], X, y)
        draws_changed = fitted([R], X, changed)
        alone = fitted([], X[0], y[0])
    assert draws.shape == (15, R, D)
    assert torch.equal(draws[:, 0], draws_changed[:, 0]), "element 0 moved when only the others' data changed"
    assert not torch.equal(draws[:, 1], draws_changed[:, 1])
    assert torch.equal(draws[:, 0], alone), "element 0 of a batch is not the unbatched fit"


def test_pyro_posterior_directly_keeps_batch_elements_apart():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(2, 10, D, generator=g, dtype=torch.float64)
    y = torch.randn(2, 10, generator=g, dtype=torch.float64)
    with single_thread():
        a = PyroLinearPosterior(_laplace_prior(), D, noise_std=0.5, batch_shape=(2,), method="svi", **PYRO_OPTIONS["svi"])
        a.fit(X, y)
        b = PyroLinearPosterior(_laplace_prior(), D, noise_std=0.5, batch_shape=(2,), method="svi", **PYRO_OPTIONS["svi"])
        b.fit(X, torch.stack([y[0], -y[1]]))
    assert torch.equal(a.draws[:, 0], b.draws[:, 0])
    assert not torch.equal(a.draws[:, 1], b.draws[:, 1])


def test_pyro_batch_simulate_equals_separate_runs():
    T = 8

    def policy(batch):
        return ThompsonSampling(BayesianLinear(_laplace_prior(), noise_std=0.5, batch_shape=batch, inference="svi",
                                               refit_every=4, inference_options=PYRO_OPTIONS["svi"]))

    batched = simulate(policy([2]), _Toy(2), T, seed=SEEDS[:2])
    for r in range(2):
        single = simulate(policy([1]), _Toy(1), T, seed=[SEEDS[r]])
        assert torch.equal(batched.replication(r).actions, single.actions)


# ---------------------------------------------------------------------- ProbitGP: one posterior, R > 1 refused
def _probit(**kwargs):
    from bayes_safe.models import ProbitGP

    return ProbitGP(D, hidden=(8, 2), refit_every=None, seed=0, **kwargs)


def _probit_policies():
    from bayes_safe.models import ScaledOutcome, SuccessProbability

    gp = _probit()
    yield "ThompsonSampling(ProbitGP)", ThompsonSampling(gp), gp, False
    gp = _probit()
    yield "ThompsonSampling(SuccessProbability)", ThompsonSampling(SuccessProbability(gp)), gp, False
    gp = _probit()
    yield ("TSASC(ScaledOutcome, SuccessProbability)",
           TSASC(ScaledOutcome(gp, torch.ones(K, dtype=torch.float64)), SuccessProbability(gp), alpha=0.01), gp, True)


@pytest.mark.parametrize("case", range(3))
def test_probit_gp_refuses_a_batch_of_replications_before_any_work(case):
    name, policy, gp, constraint = list(_probit_policies())[case]
    problem = _Toy(4, binary=True, constraint=constraint)
    with pytest.raises(ValueError, match=r"replications: .*4 replications.*one posterior.*replications=1"):
        simulate(policy, problem, 60, seed=0)
    assert gp.num_observations == 0, f"{name}: observations were recorded before the error"
    assert problem.calls == 0, f"{name}: outcomes were simulated before the error"


def test_probit_gp_with_a_mean_only_policy_refuses_at_the_first_update():
    """Greedy reads ``predict`` only (no draw to catch), so the refusal comes at its first update,
    still before anything is recorded."""
    gp = _probit()
    with pytest.raises(ValueError, match="replications: .*4 replications"):
        simulate(Greedy(gp), _Toy(4, binary=True), 60, seed=0)
    assert gp.num_observations == 0


def test_probit_gp_runs_one_replication():
    gp = _probit()
    trace = simulate(ThompsonSampling(gp), _Toy(1, binary=True), 60, seed=[SEEDS[0]])
    assert trace.actions.shape == (60, 1)
    assert gp.num_observations == 60  # one replication's 60 observations, nothing pooled
    # reproducible: the same seed gives the same run
    again = _probit()
    assert torch.equal(simulate(ThompsonSampling(again), _Toy(1, binary=True), 60, seed=[SEEDS[0]]).actions, trace.actions)


def test_probit_gp_sampling_with_replication_streams():
    gp = _probit()
    feats = torch.randn(4, K, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="replications"):
        gp.sample_at(feats, ReplicationRNG(SEEDS[:1] * 4))
    assert gp.sample_at(feats[:1], ReplicationRNG(SEEDS[:1])).shape == (1, K)


# ---------------------------------------------------------------------- coverage
COVERED = {"BayesianLinear", "PerArmLinear", "PyroLinearPosterior", "ProbitGP", "SuccessProbability", "ScaledOutcome"}


def test_every_model_kind_is_covered():
    # the posteriors (what updates); the warm-start helpers (fit_prior, power_prior, PriorFit) make priors
    exported = {n for n in bayes_safe.models.__all__
                if callable(getattr(getattr(bayes_safe.models, n), "update", None))} | {"PyroLinearPosterior"}
    assert {"BayesianLinear", "PerArmLinear", "ProbitGP"} <= exported
    missing = exported - COVERED
    assert not missing, f"model kinds without a batch test here: {sorted(missing)}"
