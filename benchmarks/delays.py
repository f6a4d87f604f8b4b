"""The cost of delayed outcomes in ``simulate`` (issue 45, item 3): ``delays=`` against none.

    .venv/bin/python benchmarks/delays.py           # R = 1,000, T = 400, 5 repeats
    .venv/bin/python benchmarks/delays.py --quick   # R = 1,000, T = 120, 3 repeats

The paper's problem (``daulton2019``: K = 100 arms, d = 4, a reward and one constraint metric)
at R = 1,000 replications, TS-ASC and Thompson sampling (ridge conjugate models, the
``make_policy`` defaults). Per policy, one row per setting of ``delays``:

* ``none``: no ``delays`` (the reference of the ratios);
* ``lag 0``: every metric with lag 0 (the loop's own update, plus the learning record);
* ``both 20``: reward and constraint 20 steps late (the policy's ``update`` takes each decision
  20 steps late, whole);
* ``constraint T/2``: the constraint metric half a run late, the reward at once (each model learns
  its metric when it arrives; half the constraint outcomes still pending at the end);
* ``geometric``: the constraint metric after a Geometric(0.05) lag (mean 19 steps), drawn per
  decision (random lags: the rows due at a step learned together by a subset update);
* ``reward geometric``: the reward after a Geometric(0.05) lag (Thompson sampling's only metric).

Columns: the median CPU time of the process over the whole ``simulate`` call (``time.process_time``:
what the run costs, less sensitive than the wall time to other work on a shared machine) and its
ratio to ``none`` measured in the same run (the target's figure), the median wall time and its
ratio, the policy's delivery mode (``attrs["delivery"]``), and the 1-minute load average when the
row was printed. The settings are interleaved within each repeat, in alternating order, so a
change of load falls on all of them. Target (issue 45): ``simulate`` with delays at R = 1,000 costs
at most 1.5x ``simulate`` without. One torch thread (as ``simulate`` runs).

**The harm target** (the last rows): TS-ASC on ``_pricing.Pricing`` (a 0/1 conversion, a 0/1 refund
capped at 2 %; conjugate Gaussian models, noise sd 0.5 and 0.15) with the refund 2,000 decisions late
against at once, the same seeds: the share of decisions whose price breaks the cap in expectation
over the last 2,000 steps of 8,000 (the window long passed), and over the first 2,000 (what a late
harm signal costs while it is late). Target: the late-stream shares within 2 points. Full: R = 128
(the paired gap's standard error about 1.3 points; at R = 32 it is 2.6); ``--quick``: R = 16, 6,000
steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from bayes_safe import simulate
from bayes_safe.envs import daulton2019
from bayes_safe.factory import make_policy

R = 1_000


def _settings(T: int) -> dict[str, dict | None]:
    geometric = torch.distributions.Geometric(probs=torch.tensor(0.05))
    return {"none": None, "lag 0": {"reward": 0, "constraint": 0}, "both 20": {"reward": 20, "constraint": 20},
            "constraint T/2": {"constraint": T // 2}, "geometric": {"constraint": geometric},
            "reward geometric": {"reward": geometric}}


def _time(policy_name: str, T: int, delays) -> tuple[float, float, str]:
    env = daulton2019(replications=R, seed=0, alpha=0.01)
    policy = make_policy(policy_name, env)
    cpu, wall = time.process_time(), time.perf_counter()
    trace = simulate(policy, env, T, seed=1, delays=delays, progress=False)
    return time.process_time() - cpu, time.perf_counter() - wall, trace.attrs.get("delivery", "-")


def run(quick: bool = False) -> list[dict]:
    """Measure every (policy, setting) cell and print the table; the rows."""
    torch.set_num_threads(1)
    T, repeats = (120, 3) if quick else (400, 5)
    rows = []
    print(f"simulate with delays, daulton2019 R={R}, T={T}, median of {repeats} (settings interleaved)", flush=True)
    print(f"{'policy':8} {'setting':17} {'cpu s':>7} {'x none':>7} {'wall s':>7} {'x none':>7} {'delivery':>9} "
          f"{'target':>7} {'load':>5}")
    for policy_name in ("ts-asc", "ts"):
        settings = _settings(T)
        if policy_name == "ts":
            settings.pop("geometric")  # a metric Thompson sampling does not learn: the same run as "none"
        cpu = {name: [] for name in settings}
        wall = {name: [] for name in settings}
        modes = {}
        _time(policy_name, 5, None)  # warm-up (imports, first allocations)
        for i in range(repeats):
            order = list(settings.items())
            for name, delays in order if i % 2 == 0 else order[::-1]:
                c, w, modes[name] = _time(policy_name, T, delays)
                cpu[name].append(c)
                wall[name].append(w)
        ref_cpu, ref_wall = statistics.median(cpu["none"]), statistics.median(wall["none"])
        for name in settings:
            c, w = statistics.median(cpu[name]), statistics.median(wall[name])
            ratio = c / ref_cpu
            target = "-" if name == "none" else ("met" if ratio <= 1.5 else "MISSED")
            load = os.getloadavg()[0]
            # benchmarks/run.py's row: the CPU seconds, the target, ratio = target over value (> 1: met)
            rows.append({"benchmark": f"simulate {policy_name} R={R} T={T}, delays: {name}", "value": c, "unit": "CPU s",
                         "x_none": ratio, "wall_s": w, "wall_x_none": w / ref_wall, "delivery": modes[name],
                         "load": load, "target": "" if name == "none" else "<= 1.5x none",
                         "ratio": "" if name == "none" else 1.5 / ratio})
            print(f"{policy_name:8} {name:17} {c:7.3f} {ratio:7.2f} {w:7.3f} {w / ref_wall:7.2f} {modes[name]:>9} "
                  f"{target:>7} {load:5.2f}", flush=True)
    return rows + harm_rows(quick)


def harm_rows(quick: bool = False) -> list[dict]:
    """The harm target: a 2,000-decision refund delay against none, late-stream violations (module docstring)."""
    import pyro.distributions as dist
    from _pricing import Pricing

    from bayes_safe import TSASC, BayesianLinear

    R_h, T_h, lag = (16, 6000, 2000) if quick else (128, 8000, 2000)
    problem = Pricing()
    problem.replications = R_h
    shares, per_rep = {}, {}
    for name, delays in (("at once", None), ("2,000 late", {"refund": lag})):
        def model(noise):
            prior = dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1)
            return BayesianLinear(prior, noise_std=noise, batch_shape=[R_h])

        policy = TSASC(model(0.5), [model(0.15)], constraints=list(problem.constraints))
        trace = simulate(policy, problem, T_h, seed=0, delays=delays, progress=False)
        v = trace.violation.double()
        shares[name] = (float(v[-2000:].mean()), float(v[:2000].mean()))
        per_rep[name] = v[-2000:].mean(0)
    paired = 100 * (per_rep["2,000 late"] - per_rep["at once"])  # the same units and seeds: paired by replication
    gap, gap_se = float(paired.mean().abs()), float(paired.std() / R_h ** 0.5)
    load = os.getloadavg()[0]
    rows = [{"benchmark": f"TS-ASC pricing R={R_h} T={T_h}, refund {name}: share over the 2 % cap, last 2,000 steps",
             "value": 100 * late, "unit": "%", "first_2000": 100 * early, "load": load} for name, (late, early)
            in shares.items()]
    rows.append({"benchmark": "  late-stream gap, refund 2,000 late against at once", "value": gap, "unit": "points",
                 "se": gap_se, "target": "<= 2 points", "ratio": 2.0 / max(gap, 1e-9), "load": load})
    for r in rows:
        print(f"{r['benchmark']}: {r['value']:.2f} {r['unit']}" + (f" (first 2,000: {r['first_2000']:.2f} %)"
                                                                    if "first_2000" in r else ""), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; torch {torch.__version__}",
          flush=True)
    run(quick=args.quick)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
