"""Warm starts (issue 30): a prior fitted on other instances' logs against the cold prior.

    python benchmarks/warm_start.py [--quick] [--seed S]

The problem: a population of linear bandits (K = 100 arms in R^4, a reward and a constraint
metric, TS-ASC's relative constraint at alpha = 0.1, the baseline arm chosen as in Daulton et al.
2019 s.4.1: the 20th best by the constraint among the 30 best by reward) whose true weights are
drawn around a population mean, ``theta_m ~ N(mu_m, tau^2 I)`` per metric, with ``tau = 0.25``
and noise sd 1. The history: 5,000 logged decisions of 50 *other* instances (100 each, arms
played uniformly at random, the logging policy of an exploration bucket). ``fit_prior`` fits one
prior per metric on it (diagonal covariance, noise fitted); the cold prior is ``N(0, I)``, the
docs' default for standardised features, with the true noise sd.

Rows: TS and TS-ASC over R = 100 new instances (seeds disjoint from the history's), 500
decisions each, with the cold and with the fitted priors: the mean total regret and the mean
number of violations per instance (the plays whose expected constraint breaks the instance's
constraint, the baseline's plays included), their standard errors, and the ratio warm / cold.
Target: at most 0.5 for both, over the first 500 decisions. ``--quick``: R = 30.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pyro.distributions as dist
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

D, K, NOISE, ALPHA, HORIZON = 4, 100, 1.0, 0.1, 500
#: the population spreads measured: the target's (similar instances) and a wider one
TAUS = (0.1, 0.25)
#: the population means of the reward's and the constraint's weights
MU = torch.tensor([[1.0, 0.5, -0.5, 0.3], [0.3, 1.0, 0.5, -0.5]], dtype=torch.float64)
F64 = torch.float64


def population(replications: int, first_seed: int, tau: float, constrained: bool = True):
    """``replications`` instances of the population of spread ``tau`` (seeds ``first_seed, ...``) as a
    ``LinearBandit``; ``constrained=False``: the same instances with the reward only (for TS)."""
    from bayes_safe.envs.linear import LinearBandit

    feats, thetas, base, seeds = [], [], [], list(range(first_seed, first_seed + replications))
    for s in seeds:
        gen = torch.Generator().manual_seed(s)
        theta = MU + tau * torch.randn(2, D, generator=gen, dtype=F64)
        arms = torch.empty(0, D, dtype=F64)
        while arms.shape[0] < K:  # arms whose expected metrics are both positive (Daulton et al. s.4.1)
            x = torch.randn(4 * K, D, generator=gen, dtype=F64)
            arms = torch.cat([arms, x[((x @ theta.T) > 0).all(-1)]])[:K]
        mean = arms @ theta.T
        top = mean[:, 0].argsort(descending=True)[:30]
        base.append(int(top[mean[top, 1].argsort(descending=True)[19]]))
        feats.append(arms)
        thetas.append(theta)
    if not constrained:
        return LinearBandit(name="population", arm_features=torch.stack(feats), parameters=torch.stack(thetas)[:, :1],
                            noise_std=torch.full((1,), NOISE, dtype=F64), baseline_action=torch.tensor(base),
                            seeds=seeds)
    return LinearBandit(name="population", arm_features=torch.stack(feats), parameters=torch.stack(thetas),
                        noise_std=torch.full((2,), NOISE, dtype=F64), baseline_action=torch.tensor(base),
                        alpha=ALPHA, metric_names=["reward", "constraint"], seeds=seeds)


def history(tau: float, instances: int = 50, per_instance: int = 100, seed: int = 10_000):
    """Logged rows of other instances under uniformly random arms: features ``[N, d]``, outcomes ``[N, 2]``, instance ``[N]``."""
    env = population(instances, seed, tau)
    gen = torch.Generator().manual_seed(seed)
    actions = torch.randint(0, K, (instances, per_instance), generator=gen)
    rows = torch.arange(instances)[:, None].expand(-1, per_instance)
    X = env.arm_features[rows, actions]                                             # [G, n, d]
    y = env.expected[rows, actions] + NOISE * torch.randn(instances, per_instance, 2, generator=gen, dtype=F64)
    return X.reshape(-1, D), y.reshape(-1, 2), rows.reshape(-1)


def policies(priors, noise_stds, R: int):
    from bayes_safe import TSASC, BayesianLinear, ThompsonSampling

    def model(m):
        return BayesianLinear(priors[m], noise_std=noise_stds[m], batch_shape=[R])

    return {"TS": ThompsonSampling(model(0)), "TS-ASC": TSASC(model(0), [model(1)], alpha=ALPHA)}


def _se(v: torch.Tensor) -> float:
    return float(v.std() / len(v) ** 0.5)


def run(quick: bool = False, seed: int = 0) -> list[dict]:
    from bayes_safe import simulate
    from bayes_safe.models import fit_prior

    torch.set_num_threads(1)
    R = 30 if quick else 100
    rows = []
    cold = [dist.Normal(torch.zeros(D, dtype=F64), 1.0).to_event(1)] * 2
    for tau in TAUS:
        X, y, g = history(tau)
        t0 = time.perf_counter()
        fits = [fit_prior(X, y[:, m], g) for m in range(2)]
        fit_seconds = time.perf_counter() - t0
        for m, fit in enumerate(fits):
            print(f"tau {tau}: fitted prior of {'reward' if m == 0 else 'constraint'}: {fit}  (true mean "
                  f"{MU[m].tolist()}, sd {tau})")
        envs = {"TS": population(R, seed, tau, constrained=False), "TS-ASC": population(R, seed, tau)}
        results = {}
        for label, priors, noise in (("cold N(0, I)", cold, [NOISE, NOISE]),
                                     ("fitted", [f.prior for f in fits], [f.noise_std for f in fits])):
            for name, policy in policies(priors, noise, R).items():
                trace = simulate(policy, envs[name], HORIZON, seed=seed)
                results[(name, label)] = (trace.regret.sum(0), trace.violation.double().sum(0))  # [R] each
        load = round(os.getloadavg()[0], 2)
        for name in ("TS", "TS-ASC"):
            base_regret, base_violations = results[(name, "cold N(0, I)")]
            for label in ("cold N(0, I)", "fitted"):
                regret, violations = results[(name, label)]
                target = "<= 0.5" if label == "fitted" and tau == TAUS[0] else ""
                rows.append({"benchmark": f"tau {tau}, {name}, {label} prior: total regret over {HORIZON} (mean of {R})",
                             "value": float(regret.mean()), "unit": f"+- {_se(regret):.2f} se", "load_avg": load,
                             "vs ref": float(regret.mean() / base_regret.mean()), "target": target})
                if name == "TS-ASC":  # (TS's problem has no constraint: nothing to violate)
                    rows.append({"benchmark": f"tau {tau}, {name}, {label} prior: violations over {HORIZON} (mean of {R})",
                                 "value": float(violations.mean()), "unit": f"+- {_se(violations):.2f} se",
                                 "load_avg": load, "target": target,
                                 "vs ref": float(violations.mean() / base_violations.mean()) if base_violations.mean() else None})
        rows.append({"benchmark": f"tau {tau}: fit_prior on 5,000 logged rows of 50 instances, both metrics",
                     "value": fit_seconds, "unit": "s", "load_avg": load, "vs ref": None, "target": ""})
    return rows


if __name__ == "__main__":
    from run import print_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print_table(run(args.quick, args.seed), headers=("benchmark", "value", "unit", "load_avg", "vs ref", "target"))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
