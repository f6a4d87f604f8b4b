"""Learning under drift (issue 30): forgetting against no forgetting on the drifting presets.

    .venv/bin/python benchmarks/drift.py            # R = 100 replications, T = 4,000, change at 2,000
    .venv/bin/python benchmarks/drift.py --quick    # R = 10, T = 1,000, change at 500 (a smoke run)

Problems (``bayes_safe.envs.drifting``; every policy of a problem runs on the same instances and
the same observation noise, ``simulate``'s replication-separable streams from ``--seed``):

* ``kazerouni2017-neurips-abrupt``: the reward parameter redrawn at the change step;
* ``kazerouni2017-neurips-rotating``: the reward parameter turning by 1e-3 rad per step;
* ``kazerouni2017-neurips``: the stationary problem the two drift from;
* ``daulton2019-abrupt``: the guardrail's (constraint) parameter redrawn at the change step, and
  with ``drifting="all"`` both parameters;
* ``daulton2019-rotating``: both parameters turning by 1e-3 rad per step;
* ``daulton2019``: the stationary guardrail problem.

Policies: Thompson sampling (``ThompsonSampling``) and TS-ASC (``TSASC``, alpha = 0.01) over
conjugate ``BayesianLinear`` models with the problem's own prior ``N(0, s^2 I)`` and known noise,
with no forgetting, with the stabilised rule (Kulhavy & Zarrop 1993) at ``lambda = 0.99``, and
with adaptive forgetting (``forgetting="adaptive"``: a restart from the prior when a two-sided
CUSUM test on the model's standardised predictive residuals fires; the recommended setting); the reference peer is bayesianbandits' forgetting agent (``LipschitzContextualAgent``
over one shared ``NormalRegressor`` of the same prior and noise, ``StabilizedForgetting(0.99)``,
Thompson sampling), wrapped as a ``Policy`` and run through the same ``simulate`` (it has no
guardrail, so it runs on the reward-only problems). A sweep of ``lambda`` for TS shows the
trade-off between adapting and settling.

Numbers: per replication, the regret summed over a window (after the change: the ``window``
decisions from the change step; otherwise the whole horizon) and the violations (plays whose
true means break the guardrail) over the same window; the table gives their medians over the
replications, and the ratio of the median regret to the reference measured in the same run (the
same policy without forgetting). Targets (issue 30): after an abrupt change, regret over the
next 2,000 decisions at most 0.5 x no forgetting's; on a stationary problem, at most 1.10 x.
The load average is printed at the start and the end. One process, one torch thread.

0/1 problems (issue 43; ``benchmarks/_drift_binary.py`` builds them, a second set of tables after the
Gaussian one; ``--binary-only`` runs them alone):

    .venv/bin/python benchmarks/drift.py --binary-only           # news R = 8, T = 2,000; rare R = 40; arm R = 100
    .venv/bin/python benchmarks/drift.py --binary-only --quick   # smaller and shorter (a smoke run)
    .venv/bin/python benchmarks/drift.py --abandoned-only        # the abandoned arm alone (R = 100, T = 4,000)

(a) a news recommender (20 articles, 0/1 clicks, a change of preferences half-way that costs a
stuck policy 0.11 clicks per decision, a stationary twin), cold and warm-started (the log's rows
given to ``update``; ``power_prior`` with ``base_prior=`` the weak prior), on the conjugate Gaussian
model of clicks and the logistic laplace engine, without forgetting, at 0.995 and adaptive (the 0/1
CUSUM; restarts keeping 0 and 0.05 of what was learned), with a rare 0/1 metric (hide, ~1 %, never
changing) modelled alongside; (b) the rare metric alone: false alarms against the documented rate
bound, and a doubled rate; (c) an abandoned arm (``PerArmLinear`` with and without ``decay``).
Targets (issue 43): after the change <= 0.5 x no forgetting's regret; before it and on the stationary
twin <= 1.2 x; false alarms within the documented rate; an abandoned arm's change found in >= 95 %.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import pyro.distributions as dist
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import make_problem

FACTOR = 0.99  # the stabilised rule's factor in the main table (module docstring; docs/reports/drift.md)
ADAPTIVE = "adaptive"  # forget when a CUSUM test on the predictive residuals fires (the recommended setting)
SWEEP = (0.99, 0.995, 0.999, 0.9999)


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def _model(env, metric: int, forgetting: float | None) -> BayesianLinear:
    """The problem's own prior ``N(0, s^2 I)``, known noise, batched over its replications."""
    scale = torch.tensor(float(env.parameter_std), dtype=torch.float64)
    prior = dist.Normal(torch.zeros(env.dim, dtype=torch.float64), scale).expand([env.dim]).to_event(1)
    return BayesianLinear(prior, noise_std=float(env.noise_std[metric]), batch_shape=[env.replications],
                          forgetting=forgetting)


class PeerThompson:
    """bayesianbandits' Thompson sampling with forgetting, one agent per replication, as a ``Policy``.

    Each agent is a ``LipschitzContextualAgent`` over the replication's fixed arms (an arm's
    design row is its feature vector) with one shared ``NormalRegressor(alpha = 1 / s^2,
    beta = 1 / sigma^2)`` (the same prior and noise as ours), forgetting with
    ``StabilizedForgetting(rate)`` on every ``partial_fit`` (one row per decision).
    """

    def __init__(self, env, rate: float | None, seeds: list[int]):
        import bayesianbandits as bb

        self.agents = []
        for r in range(env.replications):
            arms = env.arm_features[r].numpy()  # [K, d]

            def featurize(contexts, tokens, arms=arms):
                idx = np.asarray(tokens, dtype=int)
                return np.broadcast_to(arms[idx].T[None], (len(contexts), arms.shape[1], len(idx)))

            learner = bb.NormalRegressor(alpha=1.0 / float(env.parameter_std) ** 2,
                                         beta=1.0 / float(env.noise_std[0]) ** 2,
                                         forgetting=None if rate is None else bb.StabilizedForgetting(rate))
            self.agents.append(bb.LipschitzContextualAgent(
                [bb.Arm(k) for k in range(env.num_arms)], bb.ThompsonSampling(), bb.FunctionArmFeaturizer(featurize),
                learner, random_seed=int(seeds[r]) % 2**32))
        self._context = np.zeros((1, 1))

    def select(self, features, baseline, generator=None, valid=None):
        return torch.tensor([int(a.pull(self._context)[0]) for a in self.agents], dtype=torch.long)

    def update(self, features_chosen, reward, constraints=None, actions=None):
        for a, y in zip(self.agents, reward.tolist()):
            a.update(self._context, np.array([y]))


@dataclass
class Row:
    problem: str
    policy: str
    forgetting: str
    window: str
    regret: float
    ratio: float | None  # median regret / the reference's (None: the reference itself, or its regret <= 0)
    violations: float | None
    violation_ratio: float | None  # median violations / the reference's (guarded problems)
    seconds: float


def _run(env, policy, T: int, seed: int, start: int, stop: int):
    t0 = time.perf_counter()
    trace = simulate(policy, env, T, seed=seed, record=("regret", "violation"))
    seconds = time.perf_counter() - t0
    regret = trace.regret[start:stop].sum(0)  # [R]
    violations = trace.violation[start:stop].double().sum(0)
    return float(regret.median()), float(violations.median()), seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="R = 10, T = 1,000, change at 500")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-peer", action="store_true", help="leave bayesianbandits out")
    parser.add_argument("--binary-only", action="store_true",
                        help="run only the 0/1 problems of issue 43 (news recommender, rare metric, abandoned arm)")
    parser.add_argument("--abandoned-only", action="store_true",
                        help="run only the abandoned-arm problem of issue 43 (PerArmLinear's decay options)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.abandoned_only:
        print(f"drift benchmark, abandoned arm only{' (quick)' if args.quick else ''}: seed {args.seed}; "
              f"torch {torch.__version__}, {os.cpu_count()} cores")
        print(f"load average at start (1 / 5 / 15 min): {_load()}")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _drift_binary import arm_report, sizes

        arm_report(sizes(args.quick), args.seed, lambda line: print(line, file=sys.stderr))
        print(f"load average at end (1 / 5 / 15 min): {_load()}")
        return 0
    if args.binary_only:
        print(f"drift benchmark, 0/1 problems only{' (quick)' if args.quick else ''}: seed {args.seed}; "
              f"torch {torch.__version__}, {os.cpu_count()} cores")
        print(f"load average at start (1 / 5 / 15 min): {_load()}")
        _binary(args)
        print(f"load average at end (1 / 5 / 15 min): {_load()}")
        return 0
    R, T, change = (10, 1000, 500) if args.quick else (100, 4000, 2000)
    window = T - change
    print(f"drift benchmark: R = {R}, T = {T}, change at step {change}, window {window}, seed {args.seed}; "
          f"torch {torch.__version__}, {os.cpu_count()} cores")
    print(f"load average at start (1 / 5 / 15 min): {_load()}")
    sim_seed = args.seed + 1
    peer = None if args.no_peer else _peer_available()

    problems = [  # (label, registry name, options, kind)
        ("kazerouni2017-neurips-abrupt", "kazerouni2017-neurips-abrupt", {"change_step": change}, "abrupt"),
        ("kazerouni2017-neurips-rotating", "kazerouni2017-neurips-rotating", {}, "whole"),
        ("kazerouni2017-neurips (stationary)", "kazerouni2017-neurips", {}, "whole"),
        ("daulton2019-abrupt (constraint)", "daulton2019-abrupt", {"change_step": change}, "abrupt"),
        ("daulton2019-abrupt (all)", "daulton2019-abrupt", {"change_step": change, "drifting": "all"}, "abrupt"),
        ("daulton2019-rotating (all)", "daulton2019-rotating", {}, "whole"),
        ("daulton2019 (stationary)", "daulton2019", {}, "whole"),
    ]
    rows: list[Row] = []
    sweep: list[tuple[str, float, float]] = []
    for label, name, options, kind in problems:
        env = make_problem(name, replications=R, seed=args.seed, **options)
        start, stop = (change, change + window) if kind == "abrupt" else (0, T)
        span = f"[{start}, {stop})"
        guarded = env.num_metrics > 1
        policies = ["ts-asc", "ts"] if guarded else ["ts"]
        for pol in policies:
            ref = ref_viol = None
            for forgetting in (None, FACTOR, ADAPTIVE):
                if pol == "ts":
                    policy = ThompsonSampling(_model(env, 0, forgetting))
                else:
                    policy = TSASC(_model(env, 0, forgetting), [_model(env, 1, forgetting)], alpha=env.alpha)
                regret, viol, seconds = _run(env, policy, T, sim_seed, start, stop)
                if forgetting is None:  # unguarded TS on a guarded problem: its regret is bought by violations
                    ref, ref_viol = (None if pol == "ts" and guarded else regret), viol
                name_of = "none" if forgetting is None else ADAPTIVE if forgetting == ADAPTIVE else f"stabilized {forgetting}"
                rows.append(Row(label, pol, name_of, span,
                                regret, _ratio(regret, ref) if forgetting is not None else None,
                                viol if guarded else None,
                                _ratio(viol, ref_viol) if guarded and forgetting is not None else None, seconds))
                print(f"  ran {label} {pol} forgetting={forgetting}: {seconds:.1f} s", file=sys.stderr)
            if pol == "ts" and not guarded:
                for lam in SWEEP:
                    if lam == FACTOR:
                        sweep.append((label, lam, next(r.ratio for r in rows if r.problem == label and r.policy == pol
                                                       and r.forgetting == f"stabilized {FACTOR}")))
                        continue
                    regret, _, _ = _run(env, ThompsonSampling(_model(env, 0, lam)), T, sim_seed, start, stop)
                    sweep.append((label, lam, _ratio(regret, ref)))
                if peer:
                    seeds = list(env.seeds)
                    regret, _, seconds = _run(env, PeerThompson(env, FACTOR, seeds), T, sim_seed, start, stop)
                    rows.append(Row(label, "bayesianbandits TS", f"stabilized {FACTOR}", span, regret,
                                    _ratio(regret, ref), None, None, seconds))
                    print(f"  ran {label} bayesianbandits: {seconds:.1f} s", file=sys.stderr)

    print()
    print("Median over replications of the regret and of the guardrail's violations summed over the window;")
    print("ratio = median / the same policy's without forgetting (same run, same instances and noise); no regret")
    print("ratio for unguarded TS on a guarded problem (it beats the best feasible action by breaking the")
    print("guardrail: its regret is often negative) nor when the reference is <= 0.")
    head = f"| {'problem':34} | {'policy':18} | {'forgetting':16} | {'window':12} | {'regret':>9} | " \
           f"{'ratio':>6} | {'violations':>10} | {'ratio':>6} | {'seconds':>7} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for r in rows:
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
        viol = "" if r.violations is None else f"{r.violations:.0f}"
        vratio = "" if r.violation_ratio is None else f"{r.violation_ratio:.2f}"
        print(f"| {r.problem:34} | {r.policy:18} | {r.forgetting:16} | {r.window:12} | {r.regret:9.1f} | "
              f"{ratio:>6} | {viol:>10} | {vratio:>6} | {r.seconds:7.1f} |")
    if not peer:
        print("(bayesianbandits left out: " + ("--no-peer" if args.no_peer else "not installed") + ")")

    print()
    print("TS, stabilised forgetting at several factors: median regret / no forgetting's (same run)")
    labels = list(dict.fromkeys(s[0] for s in sweep))
    print(f"| {'lambda':8} | " + " | ".join(f"{lab:34}" for lab in labels) + " |")
    print("|" + "-" * 10 + "|" + "|".join("-" * 36 for _ in labels) + "|")
    for lam in SWEEP:
        cells = [next(v for (lab, lm, v) in sweep if lab == label and lm == lam) for label in labels]
        print(f"| {lam:<8} | " + " | ".join(f"{c:34.2f}" if c is not None else f"{'':34}" for c in cells) + " |")

    print()
    print("Targets (issue 30; regret ratios where the reference regret is > 0):")
    for r in rows:
        if r.ratio is None:
            continue
        if "abrupt" in r.problem and "(constraint)" not in r.problem:  # the reward drifts
            print(f"  after the change, {r.problem}, {r.policy} ({r.forgetting}): ratio {r.ratio:.2f} <= 0.50: "
                  f"{'met' if r.ratio <= 0.5 else 'NOT met'}")
        if "stationary" in r.problem:
            print(f"  stationary, {r.problem}, {r.policy} ({r.forgetting}): ratio {r.ratio:.2f} <= 1.10: "
                  f"{'met' if r.ratio <= 1.10 else 'NOT met'}")
    for r in rows:
        if r.violation_ratio is not None and r.policy == "ts-asc":
            print(f"  guardrail, {r.problem}, ts-asc ({r.forgetting}): violations {r.violations:.0f}, "
                  f"{r.violation_ratio:.2f} x no forgetting's (no target in the issue; reported)")
    _binary(args)
    print(f"load average at end (1 / 5 / 15 min): {_load()}")
    return 0


def _binary(args) -> None:
    """The 0/1 problems of issue 43 (``benchmarks/_drift_binary.py``): their tables and targets."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _drift_binary import report, sizes

    report(sizes(args.quick), args.seed, lambda line: print(line, file=sys.stderr))


def _ratio(value: float, reference: float | None) -> float | None:
    """``value / reference``, or None when the reference is not positive (no meaningful ratio)."""
    if reference is None or not reference > 0:
        return None
    return value / reference


def _peer_available() -> bool:
    try:
        import bayesianbandits  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
