"""Controlled exploration from logs (Kachuee & Lee 2022): constrained off-policy training and evaluation.

Five lines::

    from bayes_safe.offline import skill_routing_logs, ReplicationConstraints, mlp_policy, train_policy, MetaGradient
    data = skill_routing_logs(n=50_000, seed=0).split((0.7, 0.15, 0.15), seed=0)
    cons = ReplicationConstraints.from_benchmark("critical", data["train"].domain_names)
    policy = mlp_policy(data["train"].n_features, data["train"].n_actions, seed=0)
    result = train_policy(policy, data["train"], cons, MetaGradient(), valid=data["valid"], epochs=8)

Modules: ``.data`` (``LoggedData``), ``.constraints`` (eq. 1-2, benchmarks as JSON),
``.policy``, ``.training`` (IPS, quadratic, Algorithm 1, Algorithm 2),
``.estimators`` (IPS, SNIPS, DM, DR of the reward and of every logged metric, violation rates), ``.intervals``
(betting confidence intervals of bounded metrics, rare harms included), ``.synthetic`` (skill routing, rare harms), ``.open_bandit`` (the Open Bandit Dataset sample), ``.evaluation``
(off-policy trials for the tuning loop).
"""

from .constraints import (
    ReplicationConstraints,
    available_benchmarks,
    load_benchmark,
    replication_rate,
)
from .data import LoggedData, LoggedDataError
from .estimators import (
    Estimate,
    bootstrap_ci,
    cross_fit_rewards,
    direct_method,
    doubly_robust,
    estimate_metrics,
    estimate_ratio,
    estimate_value,
    evaluate_policy,
    fit_reward_model,
    ips,
    snips,
    violation_rates,
    violation_reduction,
)
from .evaluation import evaluate_offline, offline_metric_names, trained_policy_factory
from .policy import mlp_policy, policy_probs
from .synthetic import RareHarmLogs, SkillRouting, rare_harm_logs, skill_routing_logs
from .training import (
    IPS,
    MetaGradient,
    Minimax,
    Quadratic,
    TrainResult,
    make_method,
    meta_gradient,
    train_policy,
)

__all__ = [
    "IPS",
    "Estimate",
    "LoggedData",
    "LoggedDataError",
    "MetaGradient",
    "Minimax",
    "Quadratic",
    "RareHarmLogs",
    "ReplicationConstraints",
    "SkillRouting",
    "TrainResult",
    "available_benchmarks",
    "bootstrap_ci",
    "cross_fit_rewards",
    "direct_method",
    "doubly_robust",
    "estimate_metrics",
    "estimate_ratio",
    "estimate_value",
    "evaluate_offline",
    "evaluate_policy",
    "fit_reward_model",
    "ips",
    "load_benchmark",
    "load_open_bandit",
    "make_method",
    "meta_gradient",
    "mlp_policy",
    "offline_metric_names",
    "policy_probs",
    "rare_harm_logs",
    "replication_rate",
    "skill_routing_logs",
    "snips",
    "train_policy",
    "trained_policy_factory",
    "violation_rates",
    "violation_reduction",
]


def __getattr__(name: str):
    # imported on first use: `python -m bayes_safe.offline.open_bandit --fetch` (make data) then
    # runs the module without it having been imported by the package first
    if name == "load_open_bandit":
        from .open_bandit import load_open_bandit

        return load_open_bandit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
