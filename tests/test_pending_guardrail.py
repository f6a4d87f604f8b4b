"""A guardrail that accounts for outcomes still pending (issue 45, item 2 and the harm target).

A refund known 2,000 decisions after the sale leaves TS-ASC's refund model behind its conversion
model: the plain policy kept breaking the 2 % cap 7 points more often than the same policy told at
once, long after the window had passed. ``TSASC(..., pending="margin")`` keeps a margin, in the
constraint check, for what the outcomes still pending can move the guarded quantity; ``simulate``
with ``delays=`` and the ``Decider`` hold and release the pending rows. The models learn each
outcome once, as without the option. Also here: the log estimate of a rare harm from the rows
whose outcome is known keeps its coverage when outcomes are missing at random.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, Constraint, simulate
from bayes_safe.models import PerArmLinear
from bayes_safe.online import Decider, DecisionLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _pricing import Pricing  # the benchmark's pricing problem: a fast reward, a slow refund

F64 = torch.float64


def _normal(d, sd=1.0):
    return dist.Normal(torch.zeros(d, dtype=F64), sd).to_event(1)


def _pricing_policy(R, **pending):
    problem = Pricing()
    problem.replications = R

    def model(noise):
        return BayesianLinear(_normal(4), noise_std=noise, batch_shape=[R])

    return problem, TSASC(model(0.5), [model(0.15)], constraints=list(problem.constraints), **pending)


def _late_shares(R, T, lag, seed=0):
    """Per replication, the share of the last ``lag`` decisions over the cap: told at once, the refund
    ``lag`` late, the refund ``lag`` late with ``pending="margin"`` (the same units and seeds)."""
    out = {}
    for name, delays, pending in (("at once", None, {}), ("late", {"refund": lag}, {}),
                                  ("margin", {"refund": lag}, {"pending": "margin"})):
        problem, policy = _pricing_policy(R, **pending)
        trace = simulate(policy, problem, T, seed=seed, delays=delays, progress=False)
        out[name] = 100 * trace.violation.double()[-lag:].mean(0)
    return out


# ---------------------------------------------------------------------- the harm target
def test_a_margin_for_pending_refunds_closes_the_late_stream_gap():
    """Pricing, a refund 500 decisions late, 2,000 decisions, R = 32 (about 12 s): the plain policy breaks
    the cap over 6 points more often than told at once in the last 500 decisions; with the margin it is
    within 2 points (measured: +12.7 +- 4.7 against -0.1 +- 4.4 points; paired, the margin removes
    12.8 +- 2.2)."""
    shares = _late_shares(R=32, T=2000, lag=500)
    plain = shares["late"] - shares["at once"]
    margin = shares["margin"] - shares["at once"]
    assert float(plain.mean()) > 6.0
    assert float(margin.mean()) <= 2.0
    gain = plain - margin
    assert float(gain.mean()) > 3 * float(gain.std() / len(gain) ** 0.5)


@pytest.mark.long
def test_the_issue_target_at_full_size():
    """The issue's numbers: a refund 2,000 decisions late, 8,000 decisions, R = 64 (about 1 min): the plain
    late stream misses the target, the margin's is within 2 points of the policy told at once
    (benchmarks/delays.py at R = 128: +6.9 +- 1.3 and -0.6 +- 0.9)."""
    shares = _late_shares(R=64, T=8000, lag=2000)
    plain = float((shares["late"] - shares["at once"]).mean())
    margin = float((shares["margin"] - shares["at once"]).mean())
    assert plain > 2.0, plain  # the plain policy misses the target (measured: +3.4 on these 64)
    assert margin <= 2.0 and margin < plain - 2.0, (margin, plain)


# ---------------------------------------------------------------------- held rows leave exactly
def _two_models(R=None, d=3):
    shape = [] if R is None else [R]
    return (BayesianLinear(_normal(d), noise_std=0.5, batch_shape=shape),
            BayesianLinear(_normal(d), noise_std=0.2, batch_shape=shape))


def test_held_rows_leave_exactly_and_the_model_learns_each_outcome_once():
    """Hold three decisions' refunds, learn them in another order: the constraint model equals the one
    that learned the refunds alone (the held rows were never in it), the held sums are exactly 0 after
    the last release, and a partial release leaves the sums of the rows still held (to 1e-9)."""
    R, d = 5, 3
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, R, d, generator=g, dtype=F64)
    y = torch.rand(3, R, generator=g, dtype=F64)
    policy = TSASC(*_two_models(R, d), constraints=[Constraint.absolute("constraint0", at_most=0.3)],
                   pending="margin")
    plain = TSASC(*_two_models(R, d), constraints=[Constraint.absolute("constraint0", at_most=0.3)])
    for i in range(3):
        policy.hold_pending(x[i])
    assert policy.pending_held[0].tolist() == [3] * R
    s = policy.constraint_models[0]._scale

    def outer(i):
        return s * x[i][:, :, None] * x[i][:, None, :]

    policy.release_pending(x[1])
    assert torch.allclose(policy._pseudo[0][0], outer(0) + outer(2), atol=1e-9, rtol=0)
    policy.release_pending(x[0])
    assert torch.allclose(policy._pseudo[0][0], outer(2), atol=1e-9, rtol=0)
    for i in (1, 0, 2):
        if i == 2:
            policy.release_pending(x[2])
        for p in (policy, plain):
            p.update(x[i], y[i], y[i][:, None])
    assert policy.pending_held[0].tolist() == [0] * R
    assert torch.equal(policy._pseudo[0][0], torch.zeros(R, d, d, dtype=F64))
    for a, b in zip(policy.models().values(), plain.models().values()):
        assert torch.equal(a.precision, b.precision) and torch.equal(a.eta, b.eta)
        assert torch.equal(a.num_observations, b.num_observations)
    # nothing held: the decisions are the plain policy's, bit for bit
    features = torch.randn(R, 4, d, generator=g, dtype=F64)
    base = torch.zeros(R, dtype=torch.long)
    from bayes_safe.random import ReplicationRNG

    assert torch.equal(policy.select(features, base, generator=ReplicationRNG([1, 2, 3, 4, 5])),
                       plain.select(features, base, generator=ReplicationRNG([1, 2, 3, 4, 5])))
    with pytest.raises(ValueError, match="release_pending: constraint model 0 holds fewer"):
        policy.release_pending(x[0])


def test_the_margin_is_what_the_pending_outcomes_can_still_move():
    """Held rows move the guarded value of an action toward the side the guard fears by ``z`` times
    ``sqrt(v_now - v_known)``: for a conjugate model, the variance of the posterior mean's change once the
    pending outcomes are known (closed form here), and nothing for a direction they do not inform."""
    d = 2
    reward, refund = _two_models(None, d)
    cap = Constraint.absolute("constraint0", at_most=0.3)
    policy = TSASC(reward, [refund], constraints=[cap], pending="margin", pending_z=1.5)
    policy.hold_pending(torch.tensor([[1.0, 0.0]], dtype=F64))
    features = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=F64)
    shift = policy._pending_shift(1, cap, features, torch.tensor([0]))
    v_now = 1.0  # prior N(0, I), nothing learned
    v_known = 1.0 / (1.0 + 1.0 / 0.2 ** 2)
    assert torch.allclose(shift, torch.tensor([[1.5 * (v_now - v_known) ** 0.5, 0.0]], dtype=F64), atol=1e-12)
    floor = Constraint.absolute("constraint0", at_least=-0.3)
    assert float(policy._pending_shift(1, floor, features, torch.tensor([0]))[0, 0]) < 0  # toward the floor


# ---------------------------------------------------------------------- arguments and engines
def test_bad_settings_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="pending: expected 'ignore' or 'margin'"):
        TSASC(*_two_models(), alpha=0.1, pending="pessimistic")
    with pytest.raises(ValueError, match="pending_z: expected a finite number >= 0"):
        TSASC(*_two_models(), alpha=0.1, pending="margin", pending_z=-1.0)
    with pytest.raises(ValueError, match="pending_z"):
        TSASC(*_two_models(), alpha=0.1, pending="margin", pending_z=True)


@pytest.mark.parametrize("refund, named", [
    (lambda: BayesianLinear(dist.Laplace(torch.zeros(3, dtype=F64), 1.0).to_event(1), noise_std=0.5), "engine 'gibbs'"),
    (lambda: BayesianLinear(_normal(3), likelihood="logistic", inference="laplace"), "engine 'laplace'"),
    (lambda: BayesianLinear(_normal(3), noise_prior=dist.InverseGamma(2.0, 1.0)), "noise_prior"),
    (lambda: PerArmLinear(_normal(3), 4, noise_std=0.5), "PerArmLinear"),
], ids=["gibbs", "laplace", "normal-inverse-gamma", "per-arm"])
def test_engines_that_cannot_keep_the_margin_refuse_by_name(refund, named):
    with pytest.raises(ValueError, match=rf"pending='margin': constraint_models\[0\] .*{named}"):
        TSASC(BayesianLinear(_normal(3), noise_std=0.5), [refund()], alpha=0.1, pending="margin")
    TSASC(BayesianLinear(_normal(3), noise_std=0.5), [refund()], alpha=0.1)  # the default takes any engine


# ---------------------------------------------------------------------- simulate
@pytest.mark.parametrize("delays, mode", [
    ({"refund": 7}, "models"),
    ({"conversion": 7, "refund": 7}, "whole"),
    ({"refund": lambda u: (u * 12).floor()}, "models"),
    ({"refund": 10_000}, "models"),
], ids=["fixed", "whole", "random", "never"])
def test_simulate_holds_each_late_outcome_until_it_is_delivered(delays, mode):
    """At the end of a run the policy holds exactly the decisions whose refund was never delivered
    (``trace.learned_at`` -1): each row held once, released once, whatever the delivery mode."""
    problem, policy = _pricing_policy(4, pending="margin")
    trace = simulate(policy, problem, 60, seed=2, delays=delays, progress=False)
    assert trace.attrs["delivery"] == mode
    never = (trace.learned_at[..., 1] < 0).sum(0)
    assert policy.pending_held[0].tolist() == never.tolist()
    assert int(never.sum()) > 0
    # the models learned each delivered refund once
    assert policy.constraint_models[0].num_observations.tolist() == (60 - never).tolist()


def test_without_delays_or_with_the_default_nothing_changes():
    """``pending="margin"`` without delays holds nothing: the run of ``pending="ignore"``, bit for bit;
    and a batched run with the margin equals its replications run alone (daulton2019, a relative guard,
    random lags)."""
    problem, a = _pricing_policy(3)
    _, b = _pricing_policy(3, pending="margin")
    ta = simulate(a, problem, 40, seed=1, progress=False)
    tb = simulate(b, problem, 40, seed=1, progress=False)
    assert torch.equal(ta.actions, tb.actions) and torch.equal(ta.regret, tb.regret)
    from bayes_safe.envs import daulton2019
    from bayes_safe.factory import make_policy
    from bayes_safe.random import replication_seeds

    def margin(env):
        plain = make_policy("ts-asc", env)
        return TSASC(plain.reward_model, plain.constraint_models, alpha=plain.alpha.tolist(), pending="margin")

    seeds = replication_seeds(11, 3)
    delays = {"reward": 2, "constraint": torch.distributions.Geometric(probs=torch.tensor(0.2))}
    env = daulton2019(replications=3, seed=seeds, alpha=0.01)
    batched = simulate(margin(env), env, 40, seed=seeds, delays=delays)
    for r in range(3):
        env_r = daulton2019(replications=1, seed=[seeds[r]], alpha=0.01)
        single = simulate(margin(env_r), env_r, 40, seed=[seeds[r]], delays=delays)
        assert torch.equal(batched.replication(r).actions, single.actions)
    plain = simulate(make_policy("ts-asc", env), env, 40, seed=seeds, delays=delays)
    assert not torch.equal(plain.actions, batched.actions)  # the margin acted


# ---------------------------------------------------------------------- the Decider
def _decider(pending="margin", **kw):
    reward, refund = _two_models(None, 3)
    policy = TSASC(reward, [refund], constraints=[Constraint.absolute("refund", at_most=0.2)],
                   metric_names=["conversion", "refund"], pending=pending)
    return Decider(policy, seed=0, **kw)


def _contexts(n, seed=0):
    return [np.random.default_rng(seed + i).normal(size=(4, 3)) for i in range(n)]


def test_the_decider_holds_each_refund_until_its_model_learns_it(tmp_path):
    """Each decision holds its refund from ``decide`` until the refund model learns it (after the
    conversion alone it still holds; with ``update_every`` at the refresh); the refund model ends as a
    Decider's without the option, given the same reports; a snapshot keeps the option and the held rows."""
    log = DecisionLog(tmp_path / "log.sqlite")
    d, plain = _decider(log=log), _decider("ignore")
    ids = [(d.decide(x, baseline=0), plain.decide(x, baseline=0)) for x in _contexts(4)]
    assert d.policy.pending_held[0].tolist() == 4
    for a, b in ids:
        for one, dec in ((d, a), (plain, b)):
            one.feedback(dec.decision_id, reward=1.0)
    assert d.policy.pending_held[0].tolist() == 4  # conversions known, refunds still out
    for one, dec in ((d, ids[0][0]), (plain, ids[0][1])):
        one.feedback(dec.decision_id, constraints={"refund": 1.0})
    assert d.policy.pending_held[0].tolist() == 3
    d.save(tmp_path / "state")
    back = Decider.load(tmp_path / "state", log=tmp_path / "log.sqlite")
    assert back.policy.pending == "margin" and back.policy.pending_held[0].tolist() == 3
    for one in (d, back):
        for a, _ in ids[1:]:
            one.feedback(a.decision_id, constraints=[0.0])
        assert one.policy.pending_held[0].tolist() == 0 and not one.policy._held
    for a, b in ids[1:]:
        plain.feedback(b.decision_id, constraints=[0.0])
    for one in (d, back):
        m, p = one.policy.constraint_models[0], plain.policy.constraint_models[0]
        assert torch.allclose(m.precision, p.precision, atol=1e-9) and torch.allclose(m.eta, p.eta, atol=1e-9)
        assert int(m.num_observations) == 4
    queued = _decider(update_every=3)
    dec = queued.decide(_contexts(1)[0], baseline=0)
    queued.feedback(dec.decision_id, reward=0.0, constraints=[0.0])
    assert queued.policy.pending_held[0].tolist() == 1  # received, not learned yet: still held
    queued.refresh()
    assert queued.policy.pending_held[0].tolist() == 0


def test_the_margin_reaches_the_served_decisions():
    """The first decision (nothing held yet) is the plain Decider's; with refunds pending the served
    probabilities are not those of the same Decider, at the same generator state, with nothing held."""
    x = _contexts(1)[0]
    d, plain = _decider(), _decider("ignore")
    assert d.decide(x, baseline=0).probabilities == plain.decide(x, baseline=0).probabilities
    for _ in range(30):
        dec = d.decide(x, baseline=0)
        d.feedback(dec.decision_id, reward=1.0)
    assert d.policy.pending_held[0].tolist() == 31
    state = d._generator.get_state()
    held = d.decide(x, baseline=0).probabilities
    d.policy.clear_pending()
    d._generator.set_state(state)
    assert d.decide(x, baseline=0).probabilities != held


# ---------------------------------------------------------------------- the log estimate of a rare harm
def test_a_rare_harm_estimated_from_the_known_rows_keeps_its_coverage():
    """200 seeded logs of 4,000 decisions (3 actions, logged at 0.5 / 0.3 / 0.2), a harm of 0.5 / 1 / 2 %
    per action, 30 % of the outcomes still pending (missing at random); the target policy plays 0.2 / 0.6
    / 0.2 (true harm 1.1 %). The self-normalised IPS estimate from the known rows (``_known_rows``, as
    the log tuner) covers the truth: its betting interval (the default for a rate) in at least 95 % of
    the logs (measured 99.5 % over 400), the percentile bootstrap near its nominal 95 % (93.8 %), and the
    estimate is unbiased; counting the pending outcomes as 0 would put it 30 % low (about 6 s)."""
    from bayes_safe.offline.data import LoggedData
    from bayes_safe.offline.estimators import estimate_value
    from bayes_safe.online.tuning import _known_rows

    K, N, logs = 3, 4000, 200
    logging = np.array([0.5, 0.3, 0.2])
    target = torch.tensor([0.2, 0.6, 0.2], dtype=F64)
    harm = np.array([0.005, 0.01, 0.02])
    truth = float((target.numpy() * harm).sum())
    covered = {"betting": 0, "bootstrap": 0}
    known_values, zero_values = [], []
    for seed in range(logs):
        g = np.random.default_rng(seed)
        a = g.choice(K, size=N, p=logging)
        y = (g.random(N) < harm[a]).astype(np.float64)
        y[g.random(N) < 0.3] = np.nan
        data = LoggedData.from_tensors(np.zeros((N, 1)), a, np.zeros(N), logging[a], np.zeros(N, dtype=np.int64),
                                       n_actions=K, logging_probs=np.tile(logging, (N, 1)))
        probs = target.expand(N, K).clone()
        p, _, known_data, known = _known_rows(probs, None, data, y)
        assert len(known) == int(np.isfinite(y).sum())
        for how in ("betting", "bootstrap"):
            e = estimate_value(p, known_data, "snips", values=known, n_boot=200, seed=seed,
                               interval="auto" if how == "betting" else "bootstrap")
            covered[how] += e.low <= truth <= e.high
        known_values.append(e.value)
        zero_values.append(estimate_value(probs, data, "snips", values=np.nan_to_num(y), n_boot=2, seed=seed,
                                          interval="bootstrap").value)
    assert covered["betting"] / logs >= 0.95
    assert 0.90 <= covered["bootstrap"] / logs <= 0.99
    assert abs(np.mean(known_values) / truth - 1) < 0.03  # unbiased (the mean of 200: 1.6 % se)
    assert np.mean(zero_values) / truth < 0.75  # pending read as 0: 30 % low


@pytest.mark.slow  # 100 betting intervals: about 20 s
def test_a_rare_contextual_harm_at_80_features_keeps_its_coverage_from_the_known_rows():
    """The same claim where users meet it: contexts of 80 features, a logging policy and a target
    policy that both depend on them (softmax scores mixed with a uniform share; importance weights
    up to about 48), a harm near 1.2 % that depends on the context and the action, and 30 % of the
    outcomes still pending (missing at random). Over 100 seeded logs of 4,000 decisions the default
    interval for a rate (the betting interval) from the known rows covers the true harm of the
    target policy in at least 95 % of logs (measured 100 %), and the estimate is unbiased. (The
    percentile bootstrap, ``interval="bootstrap"``, covered 83 % here: docs/offline.md.)"""
    from bayes_safe.offline.data import LoggedData
    from bayes_safe.offline.estimators import estimate_value
    from bayes_safe.online.tuning import _known_rows

    d, K, N, logs = 80, 5, 4000, 100
    g0 = np.random.default_rng(12345)
    th_log, th_tgt, beta = (g0.normal(size=(d, K)) for _ in range(3))

    def softmax(z):
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def logging(x):
        return 0.9 * softmax(2 * x @ th_log) + 0.1 / K

    def target(x):
        return 0.95 * softmax(2 * x @ th_tgt) + 0.05 / K

    def harm(x):
        return 1 / (1 + np.exp(-(0.8 * x @ beta - 4.7)))

    X = g0.normal(size=(400_000, d)) / np.sqrt(d)
    truth = float((target(X) * harm(X)).sum(1).mean())  # 1.25 % (Monte Carlo se 0.2 % of it)
    assert 0.008 < truth < 0.02
    covered, values = 0, []
    for seed in range(logs):
        g = np.random.default_rng(seed)
        x = g.normal(size=(N, d)) / np.sqrt(d)
        lp = logging(x)
        a = (lp.cumsum(1) > g.random((N, 1))).argmax(1)
        y = (g.random(N) < harm(x)[np.arange(N), a]).astype(np.float64)
        y[g.random(N) < 0.3] = np.nan
        data = LoggedData.from_tensors(x, a, np.zeros(N), lp[np.arange(N), a], np.zeros(N, dtype=np.int64),
                                       n_actions=K, logging_probs=lp)
        p, _, known_data, known = _known_rows(torch.from_numpy(target(x)), None, data, y)
        e = estimate_value(p, known_data, "snips", values=known, seed=seed)
        assert e.method.startswith("betting")
        covered += e.low <= truth <= e.high
        values.append(e.value)
    assert covered / logs >= 0.95
    assert abs(np.mean(values) / truth - 1) < 3 * np.std(values) / np.sqrt(logs) / truth  # unbiased within 3 se


def test_a_saved_policy_keeps_its_pending_option(tmp_path):
    """The option travels with the policy's own saved state (a study's policy loaded by the service), and a
    file with a bad value is refused naming the field."""
    import json

    from bayes_safe.state import load_state, save_state

    reward, refund = _two_models()
    policy = TSASC(reward, [refund], constraints=[Constraint("constraint0", at_most=True, bound=0.02)],
                   pending="margin", pending_z=0.75)
    path = save_state(policy, tmp_path / "policy")
    loaded = load_state(path)
    assert (loaded.pending, loaded.pending_z) == ("margin", 0.75)
    plain = load_state(save_state(TSASC(*_two_models()[:1], [_two_models()[1]], alpha=0.1), tmp_path / "plain"))
    assert plain.pending == "ignore"
    config = Path(path)  # the JSON half of the saved pair (tensors beside it)
    text = config.read_text()
    assert '"pending": "margin"' in text
    config.write_text(text.replace('"pending": "margin"', '"pending": "sometimes"'))
    with pytest.raises(Exception, match="pending"):
        load_state(path)
    json.loads(config.read_text())  # still a readable file: the refusal is the library's, not the parser's
