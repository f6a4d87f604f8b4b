"""bayes_safe.offline: logged data, constraints, estimators, the four training methods."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from bayes_safe.offline import (
    IPS,
    LoggedData,
    LoggedDataError,
    MetaGradient,
    Minimax,
    Quadratic,
    ReplicationConstraints,
    SkillRouting,
    available_benchmarks,
    bootstrap_ci,
    direct_method,
    doubly_robust,
    evaluate_offline,
    evaluate_policy,
    ips,
    load_benchmark,
    mlp_policy,
    offline_metric_names,
    policy_probs,
    replication_rate,
    snips,
    train_policy,
    trained_policy_factory,
    violation_rates,
    violation_reduction,
)
from bayes_safe.offline.estimators import (
    LogisticRewardModel,
    RidgeRewardModel,
    cross_fit_rewards,
    fit_reward_model,
)
from bayes_safe.offline.synthetic import CRITICAL_DOMAINS, DOMAIN_NAMES, EXPLORE_DOMAINS
from bayes_safe.offline.training import Batch, _meta_core, meta_gradient, meta_gradient_reference


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def small():
    """20,000 synthetic rounds split 70/15/15."""
    data = SkillRouting(env_seed=0).sample(20_000, seed=0)
    return data, data.split((0.7, 0.15, 0.15), seed=0)


def _frame(n=6):
    return pd.DataFrame({
        "f0": np.linspace(0, 1, n), "f1": np.arange(n, dtype=float),
        "act": [0, 1, 2, 0, 1, 2][:n], "rew": [1.0, 0.0, 1.0, 0.0, 1.0, 1.0][:n],
        "ps": [0.5, 0.25, 0.25, 0.5, 0.25, 0.25][:n], "dom": ["a", "b", "a", "b", "a", "b"][:n],
        "p0": [0.5] * n, "p1": [0.25] * n, "p2": [0.25] * n,
    }, index=[f"r{i}" for i in range(n)])


COLS = {"context_columns": ["f0", "f1"], "action_column": "act", "reward_column": "rew",
        "propensity_column": "ps", "domain_column": "dom", "logging_prob_columns": ["p0", "p1", "p2"]}


def _float64(data: LoggedData) -> LoggedData:
    return dataclasses.replace(data, contexts=data.contexts.double(), rewards=data.rewards.double(),
                               logging_probs=data.logging_probs.double())


# ---------------------------------------------------------------------- logged data
def test_from_dataframe_round_trip():
    d = LoggedData.from_dataframe(_frame(), **COLS)
    assert len(d) == 6 and d.n_actions == 3 and d.domain_names == ("a", "b")
    assert d.contexts.shape == (6, 2) and d.logging_probs.shape == (6, 3)
    back = LoggedData.from_dataframe(d.to_dataframe(), **d.column_spec())
    for attr in ("contexts", "actions", "rewards", "propensities", "domains", "logging_probs"):
        assert torch.equal(getattr(back, attr), getattr(d, attr)), attr


def test_csv_loading(tmp_path):
    path = tmp_path / "logs.csv"
    _frame().to_csv(path)
    d = LoggedData.from_csv(path, **COLS)
    assert len(d) == 6
    with pytest.raises(FileNotFoundError, match="no such file"):
        LoggedData.from_csv(tmp_path / "missing.csv", **COLS)


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5])
def test_bad_propensity_names_the_rows(value):
    df = _frame()
    df.loc["r3", "ps"] = value
    df.loc["r3", "p0"] = value  # keep logging_probs consistent so only the propensity check fires
    with pytest.raises(LoggedDataError, match=r"propensity Pi_0\(a\|x\) is not in \(0, 1\]: rows \[r3\]") as info:
        LoggedData.from_dataframe(df, **{**COLS, "logging_prob_columns": None})
    assert info.value.rows["propensity Pi_0(a|x) is not in (0, 1]"] == ["r3"]


def test_incomplete_rows_are_listed():
    df = _frame()
    df.loc["r1", "f0"] = np.nan
    df.loc["r4", "rew"] = np.nan
    with pytest.raises(LoggedDataError) as info:
        LoggedData.from_dataframe(df, **COLS)
    msg = str(info.value)
    assert "context has a missing or non-finite value: rows [r1]" in msg
    assert "reward is missing or non-finite: rows [r4]" in msg


def test_logging_probs_checks():
    df = _frame()
    df.loc["r2", "p1"] = 0.5  # row sums to 1.25
    df.loc["r5", ["p0", "p1", "p2"]] = [0.6, 0.2, 0.2]  # logged action 2 has 0.2 != 0.25
    with pytest.raises(LoggedDataError) as info:
        LoggedData.from_dataframe(df, **COLS)
    assert info.value.rows["logging_probs row does not sum to 1 (tolerance 0.0001)"] == ["r2"]
    assert "r5" in info.value.rows["logging_probs[a] differs from the logged propensity"]


def test_unknown_column_names():
    with pytest.raises(KeyError, match=r"propensity_column: column\(s\) \['pscore'\] not in the data"):
        LoggedData.from_dataframe(_frame(), **{**COLS, "propensity_column": "pscore"})
    with pytest.raises(KeyError, match=r"context_columns: column\(s\) \['f9'\]"):
        LoggedData.from_dataframe(_frame(), **{**COLS, "context_columns": ["f0", "f9"]})


def test_domain_with_no_samples():
    with pytest.raises(LoggedDataError, match=r"have no samples: \['c'\]"):
        LoggedData.from_dataframe(_frame(), **COLS, domains=["a", "b", "c"])
    with pytest.raises(LoggedDataError, match="domain value not in domains"):
        LoggedData.from_dataframe(_frame(), **COLS, domains=["a"])


def test_split_is_stratified_and_seeded(small):
    data, parts = small
    assert sum(len(p) for p in parts.values()) == len(data)
    for p in parts.values():
        assert (p.domain_counts() > 0).all()
        assert p.domain_names == data.domain_names
    again = data.split((0.7, 0.15, 0.15), seed=0)
    assert torch.equal(again["test"].actions, parts["test"].actions)
    other = data.split((0.7, 0.15, 0.15), seed=1)
    assert not torch.equal(other["test"].contexts, parts["test"].contexts)
    with pytest.raises(ValueError, match="summing to 1"):
        data.split((0.5, 0.4))
    assert set(data.split((0.5, 0.5))) == {"train", "test"}


# ---------------------------------------------------------------------- synthetic data and benchmarks
def test_synthetic_generator(small):
    data, _ = small
    assert data.n_domains == 27 and data.domain_names == DOMAIN_NAMES
    counts = data.domain_counts()
    assert (counts > 0).all() and counts[0] > 10 * counts[-1]  # imbalanced sizes
    assert torch.allclose(data.logging_probs.sum(1), torch.ones(len(data)), atol=1e-5)
    again = SkillRouting(env_seed=0).sample(20_000, seed=0)
    assert torch.equal(again.contexts, data.contexts) and torch.equal(again.rewards, data.rewards)
    # the production policy is good but improvable
    mu = data.expected_rewards
    logging_value = float((data.logging_probs * mu).sum(1).mean())
    assert 0.8 < logging_value < float(mu.max(1).values.mean()) - 0.03


def test_benchmarks_are_data(tmp_path):
    assert {"global", "critical", "explore"} <= set(available_benchmarks())
    crit = ReplicationConstraints.from_benchmark("critical", DOMAIN_NAMES)
    idx = [DOMAIN_NAMES.index(d) for d in CRITICAL_DOMAINS]
    assert (crit.c_min[idx] > crit.c_min[DOMAIN_NAMES.index("weather")]).all()
    exp = ReplicationConstraints.from_benchmark("explore", DOMAIN_NAMES)
    assert all(exp.c_max[DOMAIN_NAMES.index(d)] < 1 for d in EXPLORE_DOMAINS)
    # a user edits a copy
    spec = load_benchmark("global")
    spec["constraints"].append({"description": "mine", "domain": "music", "c_min": 0.9})
    path = tmp_path / "mine.json"
    path.write_text(__import__("json").dumps(spec))
    mine = ReplicationConstraints.from_benchmark(path, DOMAIN_NAMES)
    assert float(mine.c_min[0]) == 0.9 and float(mine.c_min[1]) == 0.5


def test_constraint_errors():
    with pytest.raises(ValueError, match=r"c_min=0.8 > c_max=0.5"):
        ReplicationConstraints.from_rules([{"domain": "a", "c_min": 0.8, "c_max": 0.5}], ["a", "b"])
    with pytest.raises(ValueError, match=r"c_min > c_max for a: c_min=0.8 > c_max=0.5"):
        ReplicationConstraints.from_rules([{"domain": "*", "c_min": 0.8}, {"domain": "a", "c_max": 0.5}], ["a", "b"])
    with pytest.raises(ValueError, match=r"unknown domain 'z'"):
        ReplicationConstraints.from_rules([{"domain": "z", "c_min": 0.5}], ["a", "b"])
    with pytest.raises(ValueError, match=r"c_min must be a number in \[0, 1\]"):
        ReplicationConstraints.from_rules([{"domain": "a", "c_min": 1.5}], ["a", "b"])
    with pytest.raises(ValueError, match="unknown name"):
        ReplicationConstraints.from_benchmark("nope", ["a"])


def test_replication_rate_eq1():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    p0 = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.5, 0.3, 0.2]])
    assert torch.allclose(replication_rate(p, p0), torch.tensor([1.0, 0.0, 0.7]))


# ---------------------------------------------------------------------- estimators
def test_estimators_against_direct_computation(small):
    _, parts = small
    test = parts["test"]
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(len(test), test.n_actions, generator=g, dtype=torch.float64), -1)
    x = test.to_dataframe()
    a, r, p0 = x["action"].to_numpy(), x["reward"].to_numpy(np.float64), x["propensity"].to_numpy()
    pi = probs.numpy()
    w = pi[np.arange(len(a)), a] / p0
    assert ips(probs, test) == pytest.approx(np.mean(w * r), rel=1e-12)
    assert snips(probs, test) == pytest.approx(np.sum(w * r) / np.sum(w), rel=1e-12)
    q = test.expected_rewards.double()
    truth = float((probs * q).sum(1).mean())
    assert direct_method(probs, test, q) == pytest.approx(truth, rel=1e-12)  # DM with the true model is exact
    qn = q.numpy()
    dr = np.mean((pi * qn).sum(1) + w * (r - qn[np.arange(len(a)), a]))
    assert doubly_robust(probs, test, q) == pytest.approx(dr, rel=1e-12)
    # on-policy: IPS of the logging policy is the mean reward
    assert ips(test.logging_probs.double(), test) == pytest.approx(float(test.rewards.double().mean()), rel=1e-5)


def test_estimates_cover_the_truth():
    data = SkillRouting(env_seed=1).sample(30_000, seed=5)
    probs = torch.softmax(4 * data.expected_rewards.double(), -1)  # a better-than-logging target
    out = evaluate_policy(probs, data, n_boot=300, seed=0)
    truth = out["true_value"]
    for name in ("ips", "snips", "dm", "dr"):
        est = out[name]
        assert est["low"] < est["value"] < est["high"], name
    for name in ("ips", "snips", "dr"):  # unbiased (SNIPS: consistent)
        est = out[name]
        assert abs(est["value"] - truth) < 4 * est["se"], (name, est, truth)
    # the ridge reward model is misspecified (the truth is a sigmoid): DM is biased, DR corrects it
    assert abs(out["dr"]["value"] - truth) < abs(out["dm"]["value"] - truth)
    assert out["dr"]["se"] < out["ips"]["se"]  # and the reward model cuts the variance


def _sparse_clicks(n=20_000, n_actions=40, d=30, rate=0.004, seed=0) -> LoggedData:
    """Uniform logging of ``n_actions`` arms whose click probability does not depend on the context."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    a = rng.integers(n_actions, size=n)
    r = (rng.random(n) < rate).astype(np.float64)
    return LoggedData.from_tensors(
        contexts=torch.tensor(x, dtype=torch.float32), actions=torch.tensor(a), rewards=torch.tensor(r, dtype=torch.float32),
        propensities=torch.full((n,), 1.0 / n_actions, dtype=torch.float64), domains=torch.zeros(n, dtype=torch.long),
        domain_names=("all",), n_actions=n_actions,
        logging_probs=torch.full((n, n_actions), 1.0 / n_actions))


def test_reward_model_is_calibrated_on_sparse_clicks():
    data = _sparse_clicks()
    r = data.rewards.double()
    mean, se = float(r.mean()), float(r.std()) / math.sqrt(len(r))
    pi0 = data.logging_probs.double()
    # the ridge overfits the few clicks per arm and clipping its negative predictions at 0 biases DM up
    ridge = direct_method(pi0, data, cross_fit_rewards(data, model="ridge"))
    assert ridge - mean > 3 * se, (ridge, mean, se)
    q = cross_fit_rewards(data)  # default for 0/1 rewards: penalised logistic regression per action
    assert bool((q > 0).all() & (q < 1).all())
    assert abs(direct_method(pi0, data, q) - mean) < se
    assert isinstance(fit_reward_model(data), LogisticRewardModel)
    assert isinstance(fit_reward_model(data, model="ridge"), RidgeRewardModel)


def test_logistic_reward_model_learns_a_context_effect():
    rng = np.random.default_rng(1)
    n = 40_000
    x = rng.normal(size=(n, 2))
    a = rng.integers(2, size=n)
    logit = np.where(a == 0, -1.0 + 1.5 * x[:, 0], 0.5 - x[:, 1])
    r = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    data = LoggedData.from_tensors(
        contexts=torch.tensor(x, dtype=torch.float32), actions=torch.tensor(a), rewards=torch.tensor(r, dtype=torch.float32),
        propensities=torch.full((n,), 0.5, dtype=torch.float64), domains=torch.zeros(n, dtype=torch.long),
        domain_names=("all",), n_actions=2)
    w = torch.tensor([[1.5, 0.0], [0.0, -1.0]], dtype=torch.float64)
    c = torch.tensor([-1.0, 0.5], dtype=torch.float64)
    model = fit_reward_model(data, penalty=1e-3)  # nearly the maximum-likelihood fit
    assert torch.allclose(model.weights, w, atol=0.06) and torch.allclose(model.intercepts, c, atol=0.06)
    model = fit_reward_model(data)  # the default penalty shrinks a little with 20 000 rows per action
    assert torch.allclose(model.weights, w, atol=0.15) and torch.allclose(model.intercepts, c, atol=0.15)


def test_reward_model_choice_errors():
    data = _sparse_clicks(n=500)
    with pytest.raises(ValueError, match="model"):
        fit_reward_model(data, model="forest")
    real = dataclasses.replace(data, rewards=data.rewards + 0.5)
    with pytest.raises(ValueError, match="model='ridge'"):
        fit_reward_model(real, model="logistic")
    assert isinstance(fit_reward_model(real), RidgeRewardModel)  # real-valued rewards: ridge by default


def test_bootstrap_ci():
    x = torch.arange(100, dtype=torch.float64)
    lo, hi, se = bootstrap_ci(x, n_boot=2000, seed=0)
    assert lo < 49.5 < hi and se == pytest.approx(float(x.std() / 10), rel=0.1)
    assert bootstrap_ci(x, n_boot=200, seed=1) == bootstrap_ci(x, n_boot=200, seed=1)
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci(x, n_boot=1)


def test_violation_rates_micro_macro():
    pi0 = torch.tensor([[1.0, 0.0]] * 5)
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [1.0, 0.0]])  # R = 1, .5, .5, .5, 1
    data = LoggedData.from_tensors(torch.zeros(5, 1), [0] * 5, [1.0] * 5, [1.0] * 5, [0, 0, 0, 0, 1],
                                   domain_names=["a", "b"], logging_probs=pi0)
    cons = ReplicationConstraints.from_rules([{"domain": "*", "c_min": 0.8}], ["a", "b"])
    vr = violation_rates(probs, data, cons)
    assert vr["micro"] == pytest.approx(3 / 5)
    assert vr["macro"] == pytest.approx((3 / 4 + 0) / 2)
    assert violation_reduction(0.15, 0.6) == pytest.approx(75.0)


# ---------------------------------------------------------------------- meta-gradient (Algorithm 2)
def _batches(data, size=256, mask=False):
    data = _float64(data)
    if mask:  # make the last action unavailable in half of the rows, and renormalise Pi_0
        m = torch.ones(len(data), data.n_actions, dtype=torch.bool)
        m[::2, -1] = False
        m[data.actions == data.n_actions - 1] = True
        pi0 = data.logging_probs * m
        pi0 = pi0 / pi0.sum(1, keepdim=True)
        data = dataclasses.replace(data, action_mask=m, logging_probs=pi0,
                                   propensities=pi0[torch.arange(len(data)), data.actions])
    p0a = data.propensities
    return Batch.take(data, torch.arange(size), p0a), Batch.take(data, torch.arange(size, 2 * size), p0a)


@pytest.mark.parametrize("engine", ["jet", "autograd"])
@pytest.mark.parametrize("lam,mask", [(1.0, False), (0.3, False), (1.0, True)])
def test_meta_gradient_matches_differentiating_through_the_inner_step(small, lam, mask, engine):
    data, _ = small
    b1, b2 = _batches(data, mask=mask)
    cons = ReplicationConstraints.uniform(data.domain_names, c_min=0.75, c_max=0.95)
    policy = mlp_policy(data.n_features, data.n_actions, seed=1).double()
    g = torch.Generator().manual_seed(0)
    u = 0.3 * torch.randn(27, generator=g, dtype=torch.float64)
    v = 0.3 * torch.randn(27, generator=g, dtype=torch.float64)
    prior = data.domain_prior()
    fast = meta_gradient(policy, b1, b2, cons, u, v, eta=0.5, lam=lam, prior=prior, engine=engine)
    ref = meta_gradient_reference(policy, b1, b2, cons, u, v, eta=0.5, lam=lam, prior=prior)
    for a, b in zip(fast, ref):
        assert torch.allclose(a, b.detach(), rtol=1e-9, atol=1e-15)
    assert fast[0].abs().max() > 0


@pytest.mark.parametrize("engine", ["jet", "autograd"])
def test_final_step_gradient_is_eq5_at_the_new_weights(small, engine):
    data, _ = small
    b1, b2 = _batches(data)
    cons = ReplicationConstraints.uniform(data.domain_names, c_min=0.75, c_max=0.95)
    policy = mlp_policy(data.n_features, data.n_actions, seed=1).double()
    u = torch.zeros(27, dtype=torch.float64)
    _, _, finish, _ = _meta_core(policy, b1, b2, cons, u, u.clone(), 0.5, 1.0, data.domain_prior(), engine)
    u_new = u + torch.linspace(-0.2, 0.3, 27, dtype=torch.float64)
    got = finish(u_new, u)
    probs = policy(b1.x)
    pa = probs.gather(1, b1.a[:, None])[:, 0]
    hmin, hmax = cons.hinges(replication_rate(probs, b1.pi0), b1.k)
    loss = (-b1.r * pa / b1.p0a + torch.exp(u_new)[b1.k] * hmin + hmax).mean()
    want = torch.autograd.grad(loss, list(policy.parameters()))
    for (name, _), w in zip(policy.named_parameters(), want):
        assert torch.allclose(got[name], w, rtol=1e-9, atol=1e-15), name


def test_meta_gradient_is_exactly_zero_without_violations_in_the_inner_batch(small):
    """A domain with samples in the inner batch, none of them violating, gets a zero meta-gradient."""
    data, _ = small
    b1, b2 = _batches(data, size=512)
    policy = mlp_policy(data.n_features, data.n_actions, seed=1).double()
    with torch.no_grad():
        rate = replication_rate(policy(b1.x), b1.pi0)
    quiet = DOMAIN_NAMES.index("music")  # the largest domain: many samples in the batch
    assert int((b1.k == quiet).sum()) > 50
    rules = [{"domain": "*", "c_min": float(rate.quantile(0.5))},
             {"domain": "music", "c_min": float(rate[b1.k == quiet].min()) - 1e-3}]  # nobody violates
    cons = ReplicationConstraints.from_rules(rules, data.domain_names)
    u = torch.zeros(27, dtype=torch.float64)
    gu, gv = meta_gradient(policy, b1, b2, cons, u, u.clone(), eta=0.1, lam=1.0, prior=data.domain_prior())
    assert gu[quiet].item() == 0.0  # exactly
    ref_u, _ = meta_gradient_reference(policy, b1, b2, cons, u, u.clone(), eta=0.1, lam=1.0, prior=data.domain_prior())
    assert ref_u[quiet].item() == 0.0  # also when differentiating literally through the inner step
    absent = [k for k in range(27) if not bool((b1.k == k).any())]
    assert all(gu[k].item() == 0.0 for k in absent)
    violating = [k for k in range(27) if k != quiet and bool(((b1.k == k) & (rate < cons.c_min[k])).any())]
    assert violating and all(gu[k].item() != 0.0 for k in violating)
    assert (gv == 0).all()  # no upper bounds: nothing to push


# ---------------------------------------------------------------------- training
def test_minimax_multipliers_stay_finite_with_eta_1_gamma_1(small):
    """Algorithm 1 with the paper's grid value eta = gamma = 1 overflows unless u is kept finite."""
    # the unclipped update u <- u + eta e^u h reaches inf in finite time
    u, h = torch.tensor(0.0, dtype=torch.float64), 0.3
    steps = 0
    while torch.isfinite(u) and steps < 100:
        u = u + 1.0 * torch.exp(u) * h
        steps += 1
    assert not torch.isfinite(u) and steps < 10
    data, parts = small
    cons = ReplicationConstraints.uniform(data.domain_names, c_min=0.97)  # unattainable: always violated
    policy = mlp_policy(data.n_features, data.n_actions, seed=0)
    res = train_policy(policy, parts["train"], cons, Minimax(eta=1.0, gamma=1.0), valid=parts["valid"],
                       epochs=2, batch_size=256)
    assert res.steps > 100
    assert torch.isfinite(res.u).all() and res.u.max() == Minimax().u_max
    assert torch.isfinite(res.log_weights["u"]).all()
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["value"]) for h in res.history if h["epoch"] > 0)


def test_constrained_methods_reduce_violations(small):
    data, parts = small
    cons = ReplicationConstraints.from_benchmark("critical", data.domain_names)
    test = parts["test"]
    out = {}
    for method in (IPS(), Quadratic(1000.0), Minimax(eta=0.1, gamma=0.999), MetaGradient()):
        policy = mlp_policy(data.n_features, data.n_actions, seed=0)
        res = train_policy(policy, parts["train"], cons, method, valid=parts["valid"], epochs=6, batch_size=512,
                           lr=3e-3, seed=0)
        out[method.name] = violation_rates(policy_probs(policy, test.contexts), test, cons)["macro"]
        if method.name != "ips":  # early selection on the validation macro violation rate
            assert res.history[res.best_epoch]["macro"] == min(h["macro"] for h in res.history)
    for name in ("quadratic", "minimax", "meta"):
        assert out[name] < 0.7 * out["ips"], out


def test_training_is_reproducible(small):
    data, parts = small
    cons = ReplicationConstraints.from_benchmark("explore", data.domain_names)
    runs = []
    for _ in range(2):
        policy = mlp_policy(data.n_features, data.n_actions, seed=4)
        res = train_policy(policy, parts["train"], cons, MetaGradient(), valid=parts["valid"], epochs=1,
                           batch_size=1024, seed=7)
        runs.append((res.u, [p.detach().clone() for p in policy.parameters()]))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert runs[0][0].abs().max() > 0  # the weights moved
    assert res.log_weights["u"].shape == (res.steps, 27)


def test_training_bad_input(small):
    data, parts = small
    policy = mlp_policy(data.n_features, data.n_actions)
    cons = ReplicationConstraints.uniform(data.domain_names, c_min=0.5)
    with pytest.raises(ValueError, match="needs a ReplicationConstraints"):
        train_policy(policy, parts["train"], None, MetaGradient())
    with pytest.raises(ValueError, match="Minimax.gamma"):
        Minimax(gamma=1.5)
    with pytest.raises(ValueError, match="Minimax.eta"):
        Minimax(eta=-0.1)
    with pytest.raises(ValueError, match="MetaGradient.lam"):
        MetaGradient(lam=2.0)
    with pytest.raises(ValueError, match="unknown name"):
        train_policy(policy, parts["train"], cons, "adam")
    no_pi0 = dataclasses.replace(parts["train"], logging_probs=None)
    with pytest.raises(ValueError, match="full logging distribution"):
        train_policy(policy, no_pi0, cons, Quadratic())
    logits = torch.nn.Linear(data.n_features, data.n_actions)  # no softmax
    with pytest.raises(ValueError, match="end the module with torch.nn.Softmax"):
        train_policy(logits, parts["train"], cons, IPS(), epochs=1)
    no_timers = parts["train"].subset(parts["train"].domains != DOMAIN_NAMES.index("timers"))
    with pytest.raises(ValueError, match=r"constrained domain\(s\) \['timers'\] have no samples"):
        train_policy(policy, no_timers, cons, Quadratic())
    other = ReplicationConstraints.uniform(["x", "y"], c_min=0.5)
    with pytest.raises(ValueError, match="build the constraints from the data's domain_names"):
        train_policy(policy, parts["train"], other, Quadratic())


# ---------------------------------------------------------------------- off-policy trials for tuning
def test_evaluate_offline_shape(small):
    data, _ = small
    cons = ReplicationConstraints.from_benchmark("global", data.domain_names)

    def uniform(params, train, seed):
        return lambda x: torch.full((x.shape[0], train.n_actions), 1.0 / train.n_actions)

    out = evaluate_offline(data, uniform, {}, seed=0, constraints=cons, n_boot=50)
    assert set(out) == set(offline_metric_names(cons))
    assert out["reward_change"][0] < -5  # uniform routing is much worse than the production policy
    assert all(isinstance(v, tuple) and len(v) == 2 and all(math.isfinite(x) for x in v) for v in out.values())
    factory = trained_policy_factory("quadratic", constraints=cons, epochs=1, batch_size=1024)
    trained = evaluate_offline(data, factory, {"weight": 10.0}, seed=1, constraints=cons, n_boot=50)
    assert trained["violation_macro"][0] < 1.0 and trained["reward"][1] > 0


# ---------------------------------------------------------------------- jet
@pytest.mark.parametrize("layers", ["relu", "tanh-deep"])
@pytest.mark.parametrize("mask", [False, True])
def test_sequential_jet_matches_autograd(layers, mask):
    from torch import nn

    from bayes_safe.offline.jet import AutogradJet, SequentialJet, supports
    from bayes_safe.offline.policy import mask_probs

    torch.manual_seed(0)
    if layers == "relu":
        policy = mlp_policy(6, 4, hidden=8, seed=2).double()
    else:
        policy = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5, bias=False), nn.ReLU(), nn.Linear(5, 4),
                               nn.Softmax(dim=-1)).double()
    assert supports(policy)
    x = torch.randn(30, 6, dtype=torch.float64)
    m = None
    if mask:
        m = torch.ones(30, 4, dtype=torch.bool)
        m[::3, 0] = False
    params = {n: p.detach() for n, p in policy.named_parameters()}
    tangents = {n: torch.randn_like(p) for n, p in params.items()}
    rows = torch.tensor([0, 3, 4, 17, 29])
    fast, slow = SequentialJet(policy, params, x, m), AutogradJet(policy, params, x, m)
    assert torch.allclose(fast.probs, slow.probs, atol=1e-14)
    assert torch.allclose(fast.probs, mask_probs(policy(x), m), atol=1e-14)
    cot = torch.randn(30, 4, dtype=torch.float64)
    for r, c in ((None, cot), (rows, cot[rows])):
        assert torch.allclose(fast.jvp(tangents, r), slow.jvp(tangents, r), atol=1e-12)
        gf, gs = fast.vjp(c, r), slow.vjp(c, r)
        assert list(gf) == list(params)
        for n in params:
            assert torch.allclose(gf[n], gs[n], atol=1e-12), n


def test_jet_falls_back_to_autograd_for_other_modules(small):
    from torch import nn

    from bayes_safe.offline.jet import supports

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp_policy(39, 8, seed=0)

        def forward(self, x):
            return self.net(x)

    assert not supports(Wrapped())
    assert not supports(nn.Sequential(nn.ReLU(), nn.Linear(39, 8), nn.Softmax(dim=-1)))  # must start with Linear
    assert not supports(nn.Sequential(nn.Linear(39, 8), nn.Dropout(), nn.Linear(8, 8), nn.Softmax(dim=-1)))
    data, _ = small
    data = _float64(data)
    b1, b2 = _batches(data)
    cons = ReplicationConstraints.uniform(data.domain_names, c_min=0.75, c_max=0.95)
    policy = Wrapped().double()
    u = torch.zeros(27, dtype=torch.float64)
    auto = meta_gradient(policy, b1, b2, cons, u, u.clone(), eta=0.5, lam=1.0, prior=data.domain_prior())
    ref = meta_gradient_reference(policy, b1, b2, cons, u, u.clone(), eta=0.5, lam=1.0, prior=data.domain_prior())
    assert torch.allclose(auto[0], ref[0].detach(), rtol=1e-9, atol=1e-15)
    with pytest.raises(ValueError, match="engine: expected 'auto', 'jet' or 'autograd'"):
        meta_gradient(policy, b1, b2, cons, u, u.clone(), eta=0.5, lam=1.0, prior=data.domain_prior(), engine="fast")


def test_verbose_training_logs_one_line_per_epoch(small, capsys, caplog):
    """``verbose=True``: through logging. With no logging configured, the lines print as the
    command line prints its own; an application's own handler receives them instead."""
    import logging

    data, parts = small
    logger = logging.getLogger("bayes_safe")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.propagate, root = True, logging.getLogger()
        root_handlers = list(root.handlers)
        for h in root_handlers:
            root.removeHandler(h)
        try:
            train_policy(mlp_policy(data.n_features, data.n_actions, seed=0), parts["train"], None, IPS(),
                         epochs=2, batch_size=512, verbose=True)
        finally:
            for h in root_handlers:
                root.addHandler(h)
        out = capsys.readouterr().out
        assert out.count("bayes-safe train: [ips] epoch") == 2, out   # epochs 1 and 2
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.propagate = True
        with caplog.at_level(logging.INFO, logger="bayes_safe.offline.training"):
            train_policy(mlp_policy(data.n_features, data.n_actions, seed=0), parts["train"], None, IPS(),
                         epochs=1, batch_size=512, verbose=True)
        assert [r.getMessage().split(":")[0] for r in caplog.records] == ["[ips] epoch 1"]
        assert "bayes-safe train" not in capsys.readouterr().out                  # the application's handler only
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        for h in saved[0]:
            logger.addHandler(h)
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
