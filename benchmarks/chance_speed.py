"""Chance constraints at the single-draw rule's speed (issue 42, item 2).

    .venv/bin/python benchmarks/chance_speed.py              # 3 repeats
    .venv/bin/python benchmarks/chance_speed.py --quick      # 1 short repeat
    .venv/bin/python benchmarks/chance_speed.py --refresh 4 16 32

Problem: ``bayes_safe.envs.SparseDosing`` at ``d = 15`` (11 covariates, 7 doses), its Gibbs models
(a horseshoe efficacy model, a logistic adverse-event model, ``SparseDosing.models()``). Rules, each
a ``TSASC`` on fresh models:

* ``single-draw``: the AE cap as a single-draw constraint (``Constraint.absolute("adverse_event",
  at_most=0.05)``, no ``confidence``): one draw of each model per decision;
* ``chance fresh``: the declared ``confidence=0.95`` with ``chance_refresh=None``: 64 fresh joint draws
  of the AE model at every decision (the rule before issue 42);
* ``chance bank m``: the same constraint with ``chance_refresh=m``: the 64 draws are a cached bank of
  weight draws, drawn anew once the AE model learnt ``m`` rows (or doubled its rows) since.

Columns: ``simulate dec/s`` (``simulate`` of ``R`` replications x ``T`` patients, decisions a second:
``R T / seconds``, the median of the repeats), ``Decider ms`` (median ms of one ``Decider.decide`` +
``feedback`` over a stream of ``T`` patients, one stream, 200 propensity draws: the median over the
decisions of all repeats; ``mean ms``: their mean, which carries the refreshes of the bank, the
cost per decision in the long run) and the ratios of the single-draw rule's rate / time (``x single``: the cost
per decision relative to the single-draw rule; the target is <= 2). Repeats are interleaved (repeat
``i`` measures every row in turn). One torch thread; the load average (``os.getloadavg``) is printed
with the table: the times vary with it, the ratios less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from bayes_safe import TSASC, Constraint, simulate
from bayes_safe.envs.sparse_dosing import SparseDosing
from bayes_safe.online.decider import Decider


def make_policy(problem: SparseDosing, replications, rule) -> TSASC:
    efficacy, ae = problem.models(replications)
    if rule == "single":
        constraints = [Constraint.absolute("adverse_event", at_most=problem.cap)]
        return TSASC(efficacy, [ae], constraints=constraints, metric_names=problem.metric_names)
    return TSASC(efficacy, [ae], constraints=problem.constraints, metric_names=problem.metric_names,
                 chance_refresh=rule)


def time_simulate(rule, replications: int, horizon: int, seed: int) -> float:
    problem = SparseDosing(replications, covariates=11, confidence=0.95)
    policy = make_policy(problem, replications, rule)
    start = time.perf_counter()
    simulate(policy, problem, horizon, seed=seed, progress=False)
    return replications * horizon / (time.perf_counter() - start)


def time_decider(rule, horizon: int, seed: int) -> list[float]:
    problem = SparseDosing(1, covariates=11, confidence=0.95)
    decider = Decider(make_policy(problem, None, rule), seed=seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(horizon):
        units = problem.draw(1, g)
        features, baseline = units.features[0].numpy(), int(units.baseline[0])
        start = time.perf_counter()
        decision = decider.decide(features, baseline)
        outcome = problem.outcomes(units, torch.tensor([decision.action]))  # the truth, outside the timing
        mid = time.perf_counter()
        decider.feedback(decision.decision_id, float(outcome[0, 0]), [float(outcome[0, 1])])
        out.append(mid - start + time.perf_counter() - mid)
        del outcome
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, shorter runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replications", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=60, help="patients per replication / decisions of the stream")
    parser.add_argument("--refresh", type=int, nargs="+", default=None,
                        help="chance_refresh values to measure (default: the library's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from bayes_safe.policies.ts_asc import CHANCE_REFRESH_DEFAULT

    repeats, horizon = (1, min(args.horizon, 30)) if args.quick else (args.repeats, args.horizon)
    refresh = args.refresh or [CHANCE_REFRESH_DEFAULT]
    rules = [("single-draw", "single"), ("chance fresh", None)] + [(f"chance bank m={m}", m) for m in refresh]
    rates: dict = {name: [] for name, _ in rules}
    times: dict = {name: [] for name, _ in rules}
    for i in range(repeats):
        for name, rule in rules:
            rates[name].append(time_simulate(rule, args.replications, horizon, args.seed + i))
            times[name].extend(time_decider(rule, horizon, args.seed + i))
            print(f"  repeat {i + 1}/{repeats}: {name} done", file=sys.stderr, flush=True)
    rate0 = statistics.median(rates["single-draw"])
    ms0 = 1e3 * statistics.median(times["single-draw"])
    print(f"SparseDosing d = 15, Gibbs models; simulate R = {args.replications} x T = {horizon}; Decider: one stream "
          f"of {horizon} decisions; {repeats} repeat(s), medians")
    mean0 = 1e3 * statistics.fmean(times["single-draw"])
    header = (f"{'rule':<20} {'simulate dec/s':>15} {'x single':>9} {'Decider ms':>11} {'x single':>9} "
              f"{'mean ms':>8} {'x single':>9}")
    print(header)
    print("-" * len(header))
    for name, _ in rules:
        rate = statistics.median(rates[name])
        ms = 1e3 * statistics.median(times[name])
        mean = 1e3 * statistics.fmean(times[name])
        print(f"{name:<20} {rate:>15.1f} {rate0 / rate:>9.2f} {ms:>11.2f} {ms / ms0:>9.2f} {mean:>8.2f} "
              f"{mean / mean0:>9.2f}")
    print("load average (1, 5, 15 min): " + " / ".join(f"{v:.2f}" for v in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
