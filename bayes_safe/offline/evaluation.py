"""Off-policy "A/B tests": a parameterization's metrics estimated from logs instead of simulated.

``evaluate_offline`` is the offline counterpart of a simulated A/B trial for the tuning
loop (``tuning.ABTest``): it splits the logged data (seeded), lets ``policy_factory`` build
(and usually train) a policy from ``params`` on one part, and estimates the policy's metrics
on the held-out part with the off-policy estimators of ``bayes_safe.offline.estimators``.
Every metric comes back as ``(mean, sem)``, the shape the tuning loop hands to Ax.

Metrics (``sem`` = standard error):

* ``reward``: the self-normalised IPS value (bootstrap standard error);
* ``baseline_reward``: the logging policy's value on the held-out logs (their mean reward);
* ``reward_change``: ``100 (reward / baseline_reward - 1)``, paired bootstrap standard error
  (the names follow ``tuning.ABTest``: ``m``, ``baseline_m``, ``m_change``);
* ``reward_ips``, ``reward_dr``: IPS and doubly-robust values (the DR reward model is a
  per-action ridge fitted on the training part);
* with constraints and a logging distribution: ``violation_macro``, ``violation_micro``
  (binomial standard errors: ``sqrt(p (1 - p) / n)`` for micro,
  ``sqrt(sum_k p_k (1 - p_k) / n_k) / M`` for macro) and ``replication`` (mean ``R(x)``,
  its standard error over contexts);
* with ``metrics`` (other outcomes the logs record, e.g. an adverse event): for each ``m``,
  ``m`` (the policy's SNIPS mean of it on the held-out part, bootstrap standard error: the
  estimators are linear in the logged outcome, ``estimate_value(..., values=)``) and
  ``baseline_m`` (the logging policy's, the held-out mean).

Example (tune Algorithm 1's ``eta, gamma`` against the Open Bandit logs)::

    data = load_open_bandit("random")
    cons = ReplicationConstraints.from_benchmark("obd-critical", data.domain_names)
    factory = trained_policy_factory("minimax", constraints=cons, epochs=8)
    evaluate_offline(data, factory, {"eta": 0.1, "gamma": 0.999}, seed=0, constraints=cons)
    # {"reward": (0.0051, 0.0009), "violation_macro": (0.12, 0.004), ...}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn

from .constraints import ReplicationConstraints, replication_rate
from .data import LoggedData
from .estimators import estimate_value, fit_reward_model, metric_values
from .policy import check_policy_output, mask_probs, mlp_policy, policy_probs
from .training import make_method, train_policy

__all__ = ["PolicyFactory", "evaluate_offline", "offline_metric_names", "trained_policy_factory"]

#: ``policy_factory(params, train, seed) -> policy``: a torch module (or any callable) mapping
#: contexts ``[N, d]`` to probabilities ``[N, A]``.
PolicyFactory = Callable[[Mapping, LoggedData, int], Callable]


def _probs_of(policy, data: LoggedData) -> torch.Tensor:
    if isinstance(policy, nn.Module):
        probs = policy_probs(policy, data.contexts, data.action_mask)
    elif callable(policy):
        with torch.no_grad():
            probs = mask_probs(torch.as_tensor(policy(data.contexts)), data.action_mask)
    else:
        raise TypeError(f"policy_factory: expected it to return a torch module or a callable, got {type(policy).__name__}")
    check_policy_output(probs, len(data), data.n_actions)
    return probs


def evaluate_offline(
    logged_data: LoggedData,
    policy_factory: PolicyFactory,
    params: Mapping,
    seed: int = 0,
    *,
    constraints: ReplicationConstraints | None = None,
    holdout: float | None = 0.3,
    n_boot: int = 500,
    metrics: Mapping | None = None,
) -> dict[str, tuple[float, float]]:
    """Estimate the metrics of the policy ``policy_factory(params, train, seed)`` off-policy.

    Args:
        logged_data: the logs (a ``LoggedData``).
        policy_factory: builds the policy from ``params``, the training part of the logs and
            ``seed`` (see ``trained_policy_factory``); a fixed policy may ignore the data.
        params: the parameterization (e.g. ``{"eta": 0.1, "gamma": 0.999}``).
        seed: of the split, the factory and the bootstrap.
        constraints: replication constraints for the violation metrics (None: value only).
        holdout: share of rows (split stratified by domain) held out for evaluation; None
            evaluates on all rows and passes all rows to the factory (for fixed policies only:
            a trained policy would be scored on its own training data).
        n_boot: bootstrap resamples for the value's standard error.
        metrics: other logged outcomes to estimate, ``{name: values}`` with one value per row of
            ``logged_data`` (``bayes_safe.offline.estimators.metric_values``: a tensor, array or a
            pandas Series aligned by the logged frame's index).

    Returns:
        ``{metric: (mean, sem)}`` (module docstring).
    """
    if not isinstance(logged_data, LoggedData):
        raise TypeError(f"logged_data: expected a LoggedData, got {type(logged_data).__name__}")
    if not callable(policy_factory):
        raise TypeError(f"policy_factory: expected a callable (params, train, seed) -> policy, got {policy_factory!r}")
    if not isinstance(params, Mapping):
        raise TypeError(f"params: expected a mapping of parameter names to values, got {type(params).__name__}")
    table = _metric_table(metrics, logged_data, constraints)
    if holdout is None:
        train, test = logged_data, logged_data
        rows = np.arange(len(logged_data))
    else:
        h = float(holdout)
        if not 0 < h < 1:
            raise ValueError(f"holdout: expected a share in (0, 1) or None, got {holdout!r}")
        # the split does not read row labels: positions as labels say which rows each part holds
        tagged = dataclasses.replace(logged_data, row_labels=np.arange(len(logged_data)))
        parts = tagged.split((1 - h, h), seed=seed, names=("train", "test"))
        rows = parts["test"].row_labels
        labels = logged_data.row_labels
        train, test = (dataclasses.replace(parts[k], row_labels=None if labels is None else labels[parts[k].row_labels])
                       for k in ("train", "test"))
    policy = policy_factory(dict(params), train, int(seed))
    probs = _probs_of(policy, test)
    out: dict[str, tuple[float, float]] = {}
    snips = estimate_value(probs, test, "snips", n_boot=n_boot, seed=seed)
    out["reward"] = (snips.value, snips.se)
    r = test.rewards.to(torch.float64)
    out["baseline_reward"] = (float(r.mean()), float(r.std() / math.sqrt(r.numel())) if r.numel() > 1 else 0.0)
    change = _reward_change(probs, test, n_boot, seed)
    if change is not None:
        out["reward_change"] = change
    ips = estimate_value(probs, test, "ips", n_boot=n_boot, seed=seed + 1)
    out["reward_ips"] = (ips.value, ips.se)
    q = fit_reward_model(train).predict(test.contexts)
    dr = estimate_value(probs, test, "dr", q, n_boot=n_boot, seed=seed + 2)
    out["reward_dr"] = (dr.value, dr.se)
    if constraints is not None and test.logging_probs is not None:
        constraints.check_domains(test.domain_names)
        rate = replication_rate(probs.to(torch.float64), test.logging_probs.to(torch.float64))
        bad = constraints.violated(rate, test.domains).to(torch.float64)
        on = constraints.constrained()
        counts = test.domain_counts().to(torch.float64)
        per = torch.zeros(test.n_domains, dtype=torch.float64).index_add_(0, test.domains, bad) / counts.clamp_min(1)
        use = on & (counts > 0)
        if bool(use.any()):
            n_on = counts[use].sum()
            micro = float((per[use] * counts[use]).sum() / n_on)
            out["violation_micro"] = (micro, math.sqrt(max(micro * (1 - micro), 0.0) / float(n_on)))
            macro = float(per[use].mean())
            var = (per[use] * (1 - per[use]) / counts[use]).sum() / float(use.sum()) ** 2
            out["violation_macro"] = (macro, float(var.sqrt()))
        out["replication"] = (float(rate.mean()), float(rate.std() / math.sqrt(rate.numel())))
    for i, (name, values) in enumerate(table.items()):
        v = values[torch.as_tensor(rows, dtype=torch.int64)]
        e = estimate_value(probs, test, "snips", values=v, n_boot=n_boot, seed=seed + 4 + i)
        out[name] = (e.value, e.se)
        out[f"baseline_{name}"] = (float(v.mean()), float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else 0.0)
    return out


def _metric_table(metrics, data: LoggedData, constraints) -> dict[str, torch.Tensor]:
    """``{name: values [N]}`` of ``metrics``, checked (finite, one per row; names not the trial's own)."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics: expected a mapping {{name: values}} of other logged outcomes, got {type(metrics).__name__}")
    taken = set(offline_metric_names(constraints))
    out = {}
    for name, values in metrics.items():
        name = str(name)
        if name in taken or name.startswith("baseline_"):
            raise ValueError(f"metrics: {name!r} clashes with a metric evaluate_offline reports ({sorted(taken)}) "
                             "or its baseline_ names; rename it")
        out[name] = metric_values(values, data, f"metrics[{name!r}]")
    return out


def _reward_change(probs: torch.Tensor, test: LoggedData, n_boot: int, seed: int) -> tuple[float, float] | None:
    """``100 (V_snips / V_0 - 1)`` against the logging policy's on-policy value ``V_0 = mean(r)``,
    with a paired bootstrap standard error (the same resampled rows for both); None if ``V_0 = 0``."""
    r = test.rewards.to(torch.float64)
    if float(r.sum()) == 0.0:
        return None
    p = probs.to(torch.float64)
    w = p[torch.arange(len(test)), test.actions] / test.propensities
    value = 100.0 * (float((w * r).sum() / w.sum()) / float(r.mean()) - 1.0)
    g = torch.Generator().manual_seed(int(seed) + 3)
    n = len(test)
    stats = []
    chunk = max(1, min(int(n_boot), 4_000_000 // n))
    done = 0
    while done < n_boot:
        b = min(chunk, int(n_boot) - done)
        idx = torch.randint(n, (b, n), generator=g)
        wr, ww, rr = (w * r)[idx].sum(1), w[idx].sum(1), r[idx].sum(1)
        ok = rr > 0
        stats.append((100.0 * ((wr / ww) / (rr / n) - 1.0))[ok])
        done += b
    s = torch.cat(stats)
    return value, float(s.std()) if s.numel() > 1 else float("nan")


def offline_metric_names(constraints: ReplicationConstraints | None = None, metrics=()) -> list[str]:
    """The metrics ``evaluate_offline`` reports (``violation_*`` and ``replication`` only
    with constraints; ``reward_change`` is left out of a trial whose held-out logs have no reward;
    ``m`` and ``baseline_m`` for each name of ``metrics``)."""
    names = ["reward", "reward_change", "baseline_reward", "reward_ips", "reward_dr"]
    if constraints is not None:
        names += ["violation_macro", "violation_micro", "replication"]
    for m in metrics or ():
        names += [str(m), f"baseline_{m}"]
    return names


def trained_policy_factory(method: str, *, constraints: ReplicationConstraints | None = None, hidden: int = 64,
                           epochs: int = 16, batch_size: int = 1024, lr: float = 1e-3,
                           valid_fraction: float = 0.15) -> PolicyFactory:
    """A factory training a two-layer MLP with ``method`` (hyperparameters from ``params``).

    ``params`` holds the method's hyperparameters (e.g. ``{"weight": 10}`` for quadratic,
    ``{"eta": 0.1, "gamma": 1}`` for minimax, ``{"lam": 1}`` for meta) and optionally
    ``lr``; the training part is split again (``valid_fraction``) for early selection.
    """
    make_method(method)  # fail early on an unknown name

    def factory(params: Mapping, train: LoggedData, seed: int):
        params = dict(params)
        lr_ = float(params.pop("lr", lr))
        parts = train.split((1 - valid_fraction, valid_fraction), seed=seed, names=("train", "valid"))
        policy = mlp_policy(train.n_features, train.n_actions, hidden=hidden, seed=seed)
        train_policy(policy, parts["train"], constraints, make_method(method, **params), valid=parts["valid"],
                     epochs=epochs, batch_size=batch_size, lr=lr_, seed=seed)
        return policy

    return factory
