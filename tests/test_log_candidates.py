"""Issue 41 item 4: a decision log whose decisions had different numbers of candidates.

A news site's recommender serves one of 8 candidate articles on mobile and one of 12 on the desktop
page, each article a row of 3 features (relevance, recency, length), with TS-ASC over conjugate
models: the reward is a click, the guarded metric a complaint rate capped at 0.3. Its ``Decider``
logs every decision with its own K. Before, reading the log back for off-policy evaluation or
tuning raised ``decisions with different numbers of actions ([8, 12])``; now the log reads as
``LoggedData`` over K_max = 12 actions with an action mask (padded actions: mask False, logging
probability 0, a target's probability exactly 0), and a log of one K reads exactly as before.
"""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.envs import Constraint
from bayes_safe.models import BayesianLinear
from bayes_safe.offline import LoggedData, estimate_value, ips, snips
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.policies import TSASC

D = 3
CLICK = np.array([0.6, 0.2, -0.1])
COMPLAINT = np.array([0.05, -0.05, 0.15])


def _policy(cap: float = 0.3) -> TSASC:
    prior = dist.Normal(torch.zeros(D, dtype=torch.float64), 1.0).to_event(1)
    return TSASC(BayesianLinear(prior, noise_std=0.5), [BayesianLinear(prior, noise_std=0.3)],
                 constraints=[Constraint.absolute("complaints", at_most=cap)], metric_names=["clicks", "complaints"])


def _serve(directory, sizes, n: int, seed: int = 0):
    """The site's Decider: ``n`` requests, the i-th with ``sizes[i % len(sizes)]`` candidates; feedback for each."""
    decider = Decider(_policy(), log=DecisionLog(directory / "log.sqlite"), update_every=25, num_draws=100, seed=seed)
    rng = np.random.default_rng(seed)
    for i in range(n):
        articles = rng.normal(size=(sizes[i % len(sizes)], D))
        d = decider.decide(articles, baseline=0)
        x = articles[d.action]
        decider.feedback(d.decision_id, float(x @ CLICK + 0.5 * rng.normal()),
                         [float(0.2 + x @ COMPLAINT + 0.1 * rng.normal())])
    decider.save(directory / "state")
    decider.log.close()
    return directory


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return _serve(tmp_path_factory.mktemp("mixed"), (8, 12), n=120)


@pytest.fixture(scope="module")
def constant(tmp_path_factory):
    return _serve(tmp_path_factory.mktemp("constant"), (8,), n=60, seed=1)


def test_a_log_of_8_and_12_candidates_reads_back_padded_to_12_with_a_mask(mixed):
    log = DecisionLog(mixed / "log.sqlite", read_only=True)
    frame = log.to_dataframe(with_feedback_only=True)
    sizes = frame["num_actions"].to_numpy()
    assert sorted(set(sizes)) == [8, 12]
    data = log.to_logged_data()
    assert data.n_actions == 12 and len(data) == 120
    present = torch.arange(12)[None] < torch.tensor(sizes)[:, None]
    assert torch.equal(data.action_mask, present)
    assert bool((data.logging_probs[~present] == 0).all())                 # the padding: never played
    assert torch.allclose(data.logging_probs.sum(1), torch.ones(120), atol=1e-5)
    # contexts: each decision's candidate features, padded with zero rows, flattened [N, 12 d]
    assert tuple(data.contexts.shape) == (120, 12 * D)
    for i in (0, 1):
        logged = torch.tensor(frame["context"].iloc[i], dtype=torch.float32)
        assert torch.equal(data.contexts[i, :logged.numel()], logged)
        assert bool((data.contexts[i, logged.numel():] == 0).all())

    # a looser cap's value, estimated off-policy from the log
    target = _policy(cap=0.5)
    served = Decider.load(mixed / "state").policy
    target.reward_model, target.constraint_models = served.reward_model, served.constraint_models
    probs = log.target_probabilities(target, num_draws=200, seed=0)
    assert tuple(probs.shape) == (120, 12)
    assert bool((probs[~present] == 0).all())                               # exactly 0 on the padding
    assert torch.allclose(probs.sum(1), torch.ones(120, dtype=torch.float64))
    assert torch.equal(probs, log.target_probabilities(target, num_draws=200, seed=0))  # reproducible
    value = estimate_value(probs, data, "snips", n_boot=50, seed=0)
    assert np.isfinite(value.value) and value.value == pytest.approx(snips(probs, data))
    assert np.isfinite(ips(probs, data))
    # the row-by-row path agrees in law
    slow = log.target_probabilities(target, num_draws=200, seed=0, batched=False)
    assert bool((slow[~present] == 0).all())
    assert abs(snips(probs, data) - snips(slow, data)) < 0.1
    obp = log.to_obp()
    assert obp["n_actions"] == 12 and obp["context"].shape == (120, 12 * D)
    log.close()


def test_the_decision_log_tuner_takes_a_log_of_8_and_12_candidates(mixed):
    from bayes_safe.online.tuning import LoggedAlpha

    problem = LoggedAlpha(mixed / "log.sqlite", mixed / "state", num_draws=50, n_boot=30)
    assert problem.tune == "constraints" and problem.data.n_actions == 12
    out = problem.estimate({"tolerance_complaints": 0.1}, seed=0)
    assert {"reward", "complaints", "unsupported"} <= set(out)
    assert all(np.isfinite(m) and np.isfinite(s) for m, s in out.values())
    assert 0 <= out["unsupported"][0] <= 1
    probs = problem._probabilities(problem._target({"tolerance_complaints": 0.1}), num_draws=50, seed=0)
    assert bool((probs[~problem.data.action_mask] == 0).all())
    alpha = LoggedAlpha(mixed / "log.sqlite", mixed / "state", num_draws=50, n_boot=30, tune="alpha")
    reward = alpha.estimate({"alpha": 0.2}, seed=0)["reward"]
    assert np.isfinite(reward[0]) and reward[1] > 0


def _old_logged_data(frame) -> LoggedData:
    """``DecisionLog.to_logged_data`` as it was before ragged logs (one K only)."""
    K = int(frame["num_actions"].iloc[0])
    contexts = np.array(frame["context"].tolist(), dtype=np.float32)
    probs = np.array(frame["probabilities"].tolist(), dtype=np.float32)
    return LoggedData.from_tensors(contexts, frame["action"].to_numpy(np.int64), frame["reward"].to_numpy(np.float32),
                                   frame["propensity"].to_numpy(np.float64), np.zeros(len(frame), dtype=np.int64),
                                   domain_names=["all"], n_actions=K, logging_probs=probs,
                                   row_labels=frame["decision_id"].to_numpy())


def _old_target_probabilities(frame, policy, num_draws, seed):
    """``DecisionLog.target_probabilities`` as it was: one ``action_probabilities`` call per row."""
    generator = torch.Generator().manual_seed(int(seed))
    out = []
    for ctx, K, base in zip(frame["context"], frame["num_actions"], frame["baseline"]):
        cand = torch.tensor(ctx, dtype=torch.float64).reshape(1, int(K), -1)
        probs, _ = policy.action_probabilities(cand, torch.tensor([int(base)]), num_draws=num_draws, generator=generator)
        out.append(probs[0])
    return torch.stack(out)


def test_a_log_of_one_k_gives_the_numbers_it_gave_before(constant):
    log = DecisionLog(constant / "log.sqlite", read_only=True)
    frame = log.to_dataframe(with_feedback_only=True)
    data, old = log.to_logged_data(), _old_logged_data(frame)
    assert data.n_actions == old.n_actions == 8 and data.action_mask is None
    for name in ("contexts", "actions", "rewards", "propensities", "domains", "logging_probs"):
        assert torch.equal(getattr(data, name), getattr(old, name)), name
    policy = Decider.load(constant / "state").policy
    # the row-by-row path is the old loop, number for number
    rows = log.target_probabilities(policy, num_draws=100, seed=3, batched=False)
    assert torch.equal(rows, _old_target_probabilities(frame, policy, 100, 3))
    assert snips(rows, data) == snips(rows, old) and ips(rows, data) == ips(rows, old)
    assert estimate_value(rows, data, "snips", n_boot=40, seed=0) == estimate_value(rows, old, "snips", n_boot=40, seed=0)
    # the batched default: the same law (each row's probabilities within Monte-Carlo error)
    S = 2000
    fast = log.target_probabilities(policy, num_draws=S, seed=0)
    slow = log.target_probabilities(policy, num_draws=S, seed=1, batched=False)
    se = ((fast * (1 - fast) + slow * (1 - slow)) / S).sqrt()
    assert bool(((fast - slow).abs() <= 5 * se + 2 / S).all()), float(((fast - slow).abs() - 5 * se).max())
    log.close()


def test_contexts_that_are_not_candidate_features_are_refused_by_the_propensities(tmp_path):
    prior = dist.Normal(torch.zeros(D, dtype=torch.float64), 1.0).to_event(1)
    log = DecisionLog(tmp_path / "log.sqlite")
    decider = Decider(TSASC(BayesianLinear(prior, noise_std=0.5), [BayesianLinear(prior, noise_std=0.5)], alpha=0.1),
                      log=log, num_draws=20, seed=0)
    rng = np.random.default_rng(0)
    for k in (8, 12):
        d = decider.decide(rng.normal(size=(k, D)), baseline=0)
        decider.feedback(d.decision_id, 1.0, [0.0])
    with log._lock:  # an export whose contexts are one vector per decision (not the candidates)
        log._b.run("UPDATE decisions SET context = '[0.5, 0.25]'")
    data = log.to_logged_data()
    assert data.n_actions == 12 and tuple(data.contexts.shape) == (2, 2)   # kept as they are
    with pytest.raises(ValueError, match="not the candidate features of"):
        log.target_probabilities(decider.policy, num_draws=10)
    log.close()


@pytest.mark.slow  # an Ax study (several seconds)
def test_tune_decision_log_on_the_command_line_takes_8_and_12_candidates(mixed, tmp_path):
    import pandas as pd

    from bayes_safe.cli import main

    out = tmp_path / "study"
    args = ["tune", "decision-log", "--log", str(mixed / "log.sqlite"), "--state", str(mixed / "state"),
            "--trials", "2", "--sobol", "2", "--replicates", "1", "--draws", "20", "--boot", "20", "--no-progress",
            "--no-rerun", "--out", str(out)]
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    assert code == 0
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 2 and (trials["status"] == "COMPLETED").all()
