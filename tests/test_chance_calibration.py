"""Calibration of chance constraints (issue 39, item 3): the record, the diagnostic, the fix.

* the diagnostic's numbers against a hand count on a small problem written here;
* the calibration of the fixed rule over seeded replications on the public sparse problem;
* the record works for every engine of the matrix (or is absent where there is no chance
  constraint).
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, Constraint, Problem, Units, simulate
from bayes_safe.diagnostics import (
    chance_calibration,
    chance_trial_metrics,
    format_chance_calibration,
)
from bayes_safe.diagnostics.chance import wilson_interval
from bayes_safe.envs.sparse_dosing import SparseDosing

F64 = torch.float64


class ThreeDoses(Problem):
    """Three actions, features ``[1, u]``; the AE risk ``0.02 + 0.03 u`` (u = 0, 1, 2: 0.02, 0.05, 0.08
    shifted by a per-unit covariate), efficacy ``u``; the AE capped at 0.05 with a chance constraint."""

    name = "three-doses"
    metric_names = ("efficacy", "adverse_event")

    def __init__(self, replications=4, confidence=0.8):
        self.replications = replications
        self.constraints = (Constraint.absolute("adverse_event", at_most=0.05, confidence=confidence),)

    def draw(self, n, generator):
        shift = 0.02 * torch.randn(n, generator=generator, dtype=F64)
        u = torch.arange(3, dtype=F64).expand(n, 3)
        x = torch.stack([torch.ones_like(u), u], -1)
        return Units(x, torch.zeros(n, dtype=torch.long), context=shift)

    def expected_all(self, units):
        u = units.features[..., 1]
        return torch.stack([u, 0.02 + 0.03 * u + units.context[:, None]], -1)

    def outcomes(self, units, actions):
        mean = self.expected_all(units)[torch.arange(len(units)), actions]
        return mean + 0.0  # noiseless means: the test is about the bookkeeping

    def models(self, replications):
        shape = () if replications is None else (replications,)
        prior = dist.Normal(torch.zeros(2, dtype=F64), 1.0).to_event(1)
        return [BayesianLinear(prior, noise_std=1.0, batch_shape=shape),
                BayesianLinear(prior, noise_std=0.05, batch_shape=shape)]


def _policy(problem, R, **options):
    reward, ae = problem.models(R)
    return TSASC(reward, [ae], constraints=problem.constraints, metric_names=problem.metric_names, **options)


def test_diagnostic_matches_a_hand_count():
    R, T = 4, 40
    problem = ThreeDoses(R)
    policy = _policy(problem, R)
    seen = []

    def callback(t, info):  # what the policy claimed and played, and the truth, kept apart from the record
        probs, allowed = info["policy"].last_chance_claims
        a = info["actions"]
        rows = torch.arange(R)
        truth = problem.expected_all(info["units"])[rows, a, 1]
        seen.append((probs[0, rows, a].clone(), allowed[rows, a].clone(), truth <= 0.05, truth))

    trace = simulate(policy, problem, T, seed=3, callback=callback, progress=False)
    claimed = torch.stack([s[0] for s in seen])
    allowed = torch.stack([s[1] for s in seen])
    met = torch.stack([s[2] for s in seen])
    # the trace's record equals the callback's copies, and the truth agrees with simulate's own count
    assert torch.equal(trace.chance_claims["claimed"][..., 0], claimed)
    assert torch.equal(trace.chance_claims["allowed"], allowed)
    assert torch.equal(trace.chance_claims["met"][..., 0], met)
    assert torch.equal(~met, trace.constraint_violation[..., 0])
    assert torch.equal(~allowed, trace.fallback) if trace.fallback is not None else True

    (row,) = chance_calibration(trace)
    n = int(allowed.sum())
    k = int((met & allowed).sum())
    assert 0 < n < T * R  # some plays allowed, some fallbacks: both branches counted
    assert row["n"] == n
    assert row["realised"] == pytest.approx(k / n)
    assert row["claimed"] == pytest.approx(float(claimed[allowed].mean()))
    assert row["confidence"] == 0.8
    assert row["fallback_share"] == pytest.approx(1 - n / (T * R))
    assert row["interval"] == pytest.approx(list(wilson_interval(k, n)))
    late = slice(T - T // 4, T)
    nl, kl = int(allowed[late].sum()), int((met & allowed)[late].sum())
    assert row["late"]["n"] == nl and row["late"]["realised"] == pytest.approx(kl / nl)
    # reliability of the played allowed actions: bins of the claim, counted by hand
    edges = [0.0, 0.5, 0.8, 0.9, 0.95, 0.975, 0.99, 1.0]
    hand = {}
    for c, ok in zip(claimed[allowed].tolist(), met[allowed].tolist()):
        b = sum(c >= e for e in edges[1:])
        hand.setdefault(b, []).append(ok)
    assert sum(r["n"] for r in row["reliability"]) == n
    assert sorted(len(v) for v in hand.values()) == sorted(r["n"] for r in row["reliability"])
    assert sorted(sum(v) / len(v) for v in hand.values()) == pytest.approx(
        sorted(r["realised"] for r in row["reliability"]))
    # every allowed candidate (played or not): its count is at least the played ones
    assert row["candidates"]["n"] >= n
    line = format_chance_calibration([row])[0]
    assert line.startswith("adverse_event <= 0.05 with P >= 0.8: claimed >= 0.8 safe")
    assert f"realised {k / n:.2f}" in line
    metrics = chance_trial_metrics(trace)
    assert metrics["adverse_event_chance_realised"] == pytest.approx(k / n)
    assert metrics["adverse_event_chance_claimed"] == 0.8


def test_no_record_without_a_chance_constraint():
    R = 2
    problem = ThreeDoses(R, confidence=None)
    trace = simulate(_policy(problem, R), problem, 5, seed=0, progress=False)
    assert trace.chance_claims is None
    assert chance_trial_metrics(trace) == {}
    with pytest.raises(ValueError, match="no chance record"):
        chance_calibration(trace)


def test_wilson_interval_known_value():
    low, high = wilson_interval(90, 100)
    # Wilson (1927) at 95 %: 0.8256 to 0.9448 for 90 of 100
    assert low == pytest.approx(0.8256, abs=5e-4) and high == pytest.approx(0.9448, abs=5e-4)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


# ------------------------------------------------------------------ every engine of the matrix
class Binary(Problem):
    """Three actions, features ``[1, u]``; success ``Phi(1 - u)`` (0/1), reward ``(1 + u)`` times
    success; the chance constraint: success probability at least 0.5 with probability 0.8."""

    name = "binary"
    metric_names = ("reward", "success")

    def __init__(self, replications=2):
        self.replications = replications
        self.constraints = (Constraint.absolute("success", at_least=0.5, confidence=0.8),)

    def draw(self, n, generator):
        u = torch.arange(3, dtype=F64).expand(n, 3)
        x = torch.stack([torch.ones_like(u), u], -1)
        return Units(x, torch.zeros(n, dtype=torch.long), context=torch.rand(n, generator=generator, dtype=F64))

    def expected_all(self, units):
        u = units.features[..., 1]
        p = torch.special.ndtr(1.0 - u)
        return torch.stack([(1 + u) * p, p], -1)

    def outcomes(self, units, actions):
        rows = torch.arange(len(units))
        u = units.features[rows, actions, 1]
        success = (units.context < torch.special.ndtr(1.0 - u)).double()
        return torch.stack([(1 + u) * success, success], -1)


def _prior(kind="normal"):
    loc, scale = torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64)
    return (dist.Laplace(loc, scale) if kind == "laplace" else dist.Normal(loc, scale)).to_event(1)


def _log_scale_prior():
    import pyro

    s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    return pyro.sample("w", dist.Normal(torch.zeros(2, dtype=F64), s).expand([2]).to_event(1))


def _gp_views():
    from bayes_safe.models import ProbitGP, ScaledOutcome, SuccessProbability

    g = torch.Generator().manual_seed(0)
    model = ProbitGP(2, seed=0, nn_epochs=1, nn_min_steps=20, refit_every=None, gp_epochs=1)
    u = torch.randint(0, 3, (60,), generator=g).double()
    model.update(torch.stack([torch.ones_like(u), u], -1), (torch.rand(60, generator=g, dtype=F64)
                                                            < torch.special.ndtr(1 - u)).double())
    model.fit()
    return ScaledOutcome(model, torch.tensor([1.0, 2.0, 3.0], dtype=F64)), SuccessProbability(model)


def _engines(R):
    from bayes_safe.models import PerArmLinear

    shape = () if R is None else (R,)
    reward = lambda: BayesianLinear(_prior(), noise_std=1.0, batch_shape=shape)
    small = {"num_samples": 8, "warmup_steps": 8}
    return {
        "conjugate": lambda: (reward(), BayesianLinear(_prior(), noise_std=0.5, batch_shape=shape)),
        "normal-inverse-gamma": lambda: (reward(), BayesianLinear(_prior(), noise_prior=dist.InverseGamma(2.0, 0.5),
                                                                  batch_shape=shape)),
        "gibbs-laplace": lambda: (reward(), BayesianLinear(_prior("laplace"), noise_std=0.5, batch_shape=shape)),
        "gibbs-logistic": lambda: (reward(), BayesianLinear(_prior(), likelihood="logistic", batch_shape=shape)),
        "langevin": lambda: (reward(), BayesianLinear(_log_scale_prior, dim=2, noise_std=0.5, batch_shape=shape)),
        "nuts": lambda: (reward(), BayesianLinear(_prior(), noise_std=0.5, batch_shape=shape, inference="nuts",
                                                  inference_options=small)),
        "svi": lambda: (reward(), BayesianLinear(_prior(), noise_std=0.5, batch_shape=shape, inference="svi",
                                                 inference_options={"num_samples": 8, "svi_steps": 20})),
        "per-arm": lambda: (reward(), PerArmLinear(_prior(), 3, noise_std=0.5, batch_shape=shape)),
    }


MATRIX = [(name, 2) for name in _engines(2)] + [(name, None) for name in ("conjugate", "gibbs-logistic", "per-arm")] + [
    ("probit-gp", None)]


@pytest.mark.parametrize(("engine", "batch"), MATRIX, ids=[f"{n}-{'batched' if b else 'unbatched'}" for n, b in MATRIX])
@pytest.mark.parametrize("options", [{}, {"chance_mcse": "batch", "chance_selection": "bonferroni"}],
                         ids=["declared", "calibrated"])
def test_record_for_every_engine(engine, batch, options):
    R = batch or 1
    problem = Binary(R)
    reward, success = _gp_views() if engine == "probit-gp" else _engines(batch)[engine]()
    policy = TSASC(reward, [success], constraints=problem.constraints, metric_names=problem.metric_names,
                   confidence_draws=8, **options)
    T = 6
    if batch is None and engine != "probit-gp":  # simulate runs batched models only, and says so by name
        with pytest.raises(ValueError, match=r"batch_shape \[\] .*build the models with batch_shape=\[1\]"):
            simulate(policy, problem, T, seed=1, progress=False)
        return
    trace = simulate(policy, problem, T, seed=1, progress=False)
    record = trace.chance_claims
    assert record["claimed"].shape == (T, R, 1)
    assert bool(((record["claimed"] >= 0) & (record["claimed"] <= 1)).all())
    # the truth recorded is the problem's: success probability of the played action >= 0.5
    truth = trace.expected[..., 1] >= 0.5
    assert torch.equal(record["met"][..., 0], truth)
    (row,) = chance_calibration(trace)
    assert row["n"] == int(record["allowed"].sum())
    assert row["candidates"]["n"] >= row["n"]
    assert row["fallback_share"] == pytest.approx(1 - row["n"] / (T * R))


# ------------------------------------------------------------------ the command line
def test_simulate_summary_shows_the_calibration(tmp_path, monkeypatch, capsys):
    import json

    from bayes_safe.cli import main

    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    out = tmp_path / "run"
    assert main(["simulate", "--problem", "test_chance_calibration:ThreeDoses", "--policy", "ts-asc",
                 "--horizon", "12", "--replications", "3", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    info = json.loads((out / "summary.json").read_text())
    (row,) = info["chance_calibration"]
    assert row["constraint"] == "adverse_event <= 0.05 with P >= 0.8" and row["confidence"] == 0.8
    assert 0 <= row["realised"] <= 1 and row["n"] > 0
    line = info["chance_calibration_lines"][0]
    assert line in printed and line.startswith("adverse_event <= 0.05 with P >= 0.8: claimed >= 0.8 safe")


# ------------------------------------------------------------------ the fix, over seeded replications
def _late_calibration(covariates, ae_prior, options, R=8, T=400, seed=0):
    torch.set_num_threads(1)
    problem = SparseDosing(R, covariates=covariates, confidence=0.95)
    efficacy, ae = problem.models(R, ae_prior=ae_prior)
    policy = TSASC(efficacy, [ae], constraints=problem.constraints, metric_names=problem.metric_names, **options)
    trace = simulate(policy, problem, T, seed=seed, progress=False)
    (row,) = chance_calibration(trace)
    late = slice(T - T // 4, T)
    exceed = float((trace.expected[late, :, 1] > problem.cap).double().mean())
    fallback = float((~trace.chance_claims["allowed"][late]).double().mean())
    return row["late"]["realised"], exceed, fallback


@pytest.mark.parametrize("covariates", [pytest.param(11, marks=pytest.mark.long), pytest.param(76, marks=pytest.mark.slow)],
                         ids=["d15", "d80"])
def test_fixed_setup_keeps_the_promise_the_old_one_breaks(covariates):
    """8 seeded trials x 400 patients (Gibbs engine): the user's setup (a N(0, 1) prior on every AE
    weight, the declared rule) plays allowed doses of which fewer than 93 % are truly under the cap
    late in the trial; the fixed setup (covariate weights N(0, 0.25^2), ``TSASC.CALIBRATED``: the
    Monte-Carlo lower bound of the probability) keeps
    at least 93 % (within 2 points of the promised 95 %), with at most 7 % of late doses above the
    cap, and still plays allowed doses in most late rows."""
    old_safe, old_exceed, _ = _late_calibration(covariates, "wide", {})
    new_safe, new_exceed, new_fallback = _late_calibration(covariates, "scaled", dict(TSASC.CALIBRATED))
    assert old_safe < 0.93 and old_exceed > 0.07
    assert new_safe >= 0.93
    assert new_exceed <= 0.07
    assert new_fallback < 0.9


# ------------------------------------------------------------------ the options, one by one
def _three_dose_policy(R=2, **options):
    problem = ThreeDoses(R, confidence=0.8)
    return problem, _policy(problem, R, **options)


def test_bonferroni_judges_each_candidate_at_the_corrected_level():
    problem, plain = _three_dose_policy()
    _, corrected = _three_dose_policy(chance_selection="bonferroni")
    g = torch.Generator().manual_seed(0)
    units = problem.draw(2, g)
    p = plain.constraint_probabilities(units.features, units.baseline)[0]  # closed form: no draws
    assert torch.equal(plain.feasible(units.features, units.baseline), p >= 0.8)
    K = units.features.shape[1]
    assert torch.equal(corrected.feasible(units.features, units.baseline), p >= 1 - 0.2 / K)


def test_batch_means_error_sees_autocorrelation():
    from bayes_safe.policies.ts_asc import _batch_means_se

    g = torch.Generator().manual_seed(0)
    iid = (torch.rand(64, 2000, generator=g, dtype=F64) < 0.9).double()
    se = _batch_means_se(iid)
    assert float(se.mean()) == pytest.approx((0.9 * 0.1 / 64) ** 0.5, rel=0.15)
    # runs of 8 equal draws (a sticky chain): the same mean, a standard error about sqrt(8) times larger
    sticky = (torch.rand(8, 2000, generator=g, dtype=F64) < 0.9).double().repeat_interleave(8, 0)
    assert float(_batch_means_se(sticky).mean()) > 2.0 * float(se.mean())


def test_mcse_rule_needs_more_than_the_estimate():
    from bayes_safe.policies.ts_asc import _batch_means_se, _normal_quantile

    R = 2
    problem = Binary(R)
    reward, success = _engines(R)["normal-inverse-gamma"]()
    policy = TSASC(reward, [success], constraints=problem.constraints, metric_names=problem.metric_names,
                   confidence_draws=64, chance_mcse="batch")
    c = problem.constraints[0]
    draws = torch.rand(64, R, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    p = (draws >= 0.5).double().mean(0)
    allowed = policy._chance_allowed(1, c, p, torch.zeros(R, 3, 2, dtype=F64), torch.zeros(R, dtype=torch.long),
                                     {1: draws})
    se = _batch_means_se((draws >= 0.5).double())
    assert torch.equal(allowed, p - _normal_quantile(0.8) * se >= 0.8)


def test_monotone_envelope():
    from bayes_safe.policies.ts_asc import _envelope

    risk = torch.tensor([[0.02, 0.06, 0.03, 0.04]], dtype=F64)
    # an increasing risk under a cap: the running maximum from the lowest dose up
    assert _envelope(risk, True, True, maximum=True).tolist() == [[0.02, 0.06, 0.06, 0.06]]
    # a decreasing risk: the running maximum from the highest dose down
    assert _envelope(risk, True, False, maximum=True).tolist() == [[0.06, 0.06, 0.04, 0.04]]
    # probabilities of meeting the cap: the running minimum
    p = torch.tensor([[0.99, 0.9, 0.97, 0.8]], dtype=F64)
    assert _envelope(p, True, True, maximum=False).tolist() == [[0.99, 0.9, 0.9, 0.8]]
    problem, policy = _three_dose_policy(chance_monotone="increasing")
    units = problem.draw(2, torch.Generator().manual_seed(0))
    q = policy.constraint_probabilities(units.features, units.baseline)[0]
    assert bool((q[:, 1:] <= q[:, :-1]).all())


def test_recalibration_shifts_by_the_bias_on_played_allowed_actions():
    R = 2
    problem, policy = _three_dose_policy(R, chance_recalibrate=True)
    g = torch.Generator().manual_seed(0)
    units = problem.draw(R, g)
    policy.select(units.features, units.baseline, generator=g)
    predicted = policy._recal_pred[0].clone()
    allowed = policy.last_chance_claims[1]
    actions = torch.zeros(R, dtype=torch.long)
    rows = torch.arange(R)
    observed = torch.tensor([0.3, 0.1], dtype=F64)
    ok = allowed[rows, actions].double()
    policy.update(units.features[rows, actions], torch.zeros(R, dtype=F64), observed[:, None], actions=actions)
    n, s1, s2 = policy._recal[0]
    r = (observed - predicted[rows, actions]) * ok
    assert torch.equal(n, ok) and torch.allclose(s1, r) and torch.allclose(s2, r * r)
    bias, se = policy._recal_shift(problem.constraints[0], predicted)
    assert torch.allclose(bias, r / (ok + 1)) and torch.allclose(se, r.abs() / (ok + 1))


def test_thinning_keeps_every_kth_chain_draw():
    from bayes_safe.policies.ts_asc import _joint_draws

    class Chain:
        engine_name = "gibbs"
        calls = 0

        def sample_at(self, features, generator=None, key=""):
            Chain.calls += 1
            return torch.full(features.shape[:2], float(Chain.calls), dtype=F64)

    out = _joint_draws(Chain(), torch.zeros(1, 3, 2, dtype=F64), None, "k", 4, thin=3)
    assert Chain.calls == 12 and out[:, 0, 0].tolist() == [3.0, 6.0, 9.0, 12.0]


@pytest.mark.parametrize(("option", "value", "match"), [("chance_mcse", "bootstrap", "chance_mcse"),
                                                        ("chance_selection", "holm", "chance_selection"),
                                                        ("confidence_thin", 0, "confidence_thin"),
                                                        ("chance_monotone", "up", "chance_monotone")])
def test_bad_options_are_named(option, value, match):
    with pytest.raises(ValueError, match=match):
        _three_dose_policy(**{option: value})


def test_sparse_dosing_is_seeded_and_sparse():
    problem = SparseDosing(3, covariates=76)
    assert problem.dim == 80 and int((problem.beta_ae != 0).sum()) == 5
    a = problem.draw(3, torch.Generator().manual_seed(4))
    b = problem.draw(3, torch.Generator().manual_seed(4))
    assert torch.equal(a.features, b.features) and a.features.shape == (3, 7, 80)
    means = problem.expected_all(a)
    assert means.shape == (3, 7, 2) and bool((means[..., 1].diff(dim=-1) > 0).all())  # AE risk rises with the dose
    out = problem.outcomes(a, torch.tensor([0, 3, 6]))
    assert out.shape == (3, 2) and set(out[:, 1].tolist()) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="ae_prior"):
        problem.models(3, ae_prior="flat")
