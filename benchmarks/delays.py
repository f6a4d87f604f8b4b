"""The cost of delayed outcomes in ``simulate`` (issue 45, item 3): ``delays=`` against none.

    .venv/bin/python benchmarks/delays.py           # R = 1,000, T = 400, 5 repeats
    .venv/bin/python benchmarks/delays.py --quick   # R = 1,000, T = 120, 3 repeats
    .venv/bin/python benchmarks/delays.py --harm    # only the harm rows (R = 128; about 2 min of CPU)

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

**The harm target** (the last rows; ``--harm`` runs only them): TS-ASC with the guarded metric long late
against told at once, the same seeds, the share of decisions whose action breaks the bound in expectation
over the last window of the run (the window long passed) and over the first (while the outcomes are out),
per problem, plain and with ``pending="margin"`` (TS-ASC's margin for outcomes still pending):

* ``_pricing.Pricing`` (a 0/1 conversion, a 0/1 refund capped at 2 %; conjugate Gaussian models, noise sd
  0.5 and 0.15): the refund 2,000 decisions late, 8,000 decisions, windows of 2,000;
* ``SparseDosing(covariates=11)`` (d = 15, the AE risk capped at 5 %, its conjugate models): the AE 750
  late, 3,000 patients, windows of 750;
* ``daulton2019`` (a constraint metric at least 0.99 times the baseline's, ``make_policy``'s models):
  the constraint 500 late, 1,500 decisions, windows of 500.

Columns: the late-window share, the first-window share, the paired gap to the policy told at once (points,
with its standard error over replications), the regret per decision in the late window and its ratio to
the policy told at once, the total regret and its ratio, the CPU seconds of the run. Target (issue 45): the
late stream within 2 points of the policy told at once (not worse by more). Full: R = 128; ``--quick``:
R = 16, three quarters of each horizon.
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


def _harm_setup(problem_name: str, R: int, pending: dict):
    """``(problem, TS-ASC, the late metric's name, seed)`` of one harm problem (module docstring)."""
    import pyro.distributions as dist

    from bayes_safe import TSASC, BayesianLinear

    if problem_name == "pricing":
        from _pricing import Pricing

        problem = Pricing()
        problem.replications = R

        def model(noise):
            prior = dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1)
            return BayesianLinear(prior, noise_std=noise, batch_shape=[R])

        return problem, TSASC(model(0.5), [model(0.15)], constraints=list(problem.constraints), **pending), "refund", 0
    if problem_name == "dosing":
        from bayes_safe.envs import SparseDosing

        problem = SparseDosing(replications=R, covariates=11)
        reward, ae = problem.models(R, engine="conjugate")
        return problem, TSASC(reward, [ae], constraints=list(problem.constraints), **pending), "adverse_event", 0
    problem = daulton2019(replications=R, seed=0, alpha=0.01)
    plain = make_policy("ts-asc", problem)
    return (problem, TSASC(plain.reward_model, plain.constraint_models, alpha=plain.alpha.tolist(), **pending),
            "constraint", 1)


#: the harm problems: (name, lag, horizon, what the rows call it)
HARM = (("pricing", 2000, 8000, "pricing, refund <= 2 %"), ("dosing", 750, 3000, "SparseDosing d=15, AE <= 5 %"),
        ("daulton2019", 500, 1500, "daulton2019, constraint >= 0.99 baseline"))
#: the settings of the harm rows: (label, delayed, TS-ASC's pending options)
HARM_SETTINGS = (("at once", False, {}), ("late", True, {}), ("late, pending='margin'", True, {"pending": "margin"}))


def harm_rows(quick: bool = False) -> list[dict]:
    """The harm target: a long delay of the guarded metric against none, late-stream violations, with and
    without ``pending="margin"`` (module docstring)."""
    R_h = 16 if quick else 128
    rows = []
    for problem_name, lag, T_h, label in HARM:
        if quick:
            T_h = T_h * 3 // 4
        late, first, regret, total = {}, {}, {}, {}
        for name, delayed, pending in HARM_SETTINGS:
            problem, policy, metric, seed = _harm_setup(problem_name, R_h, pending)
            cpu = time.process_time()
            trace = simulate(policy, problem, T_h, seed=seed, delays={metric: lag} if delayed else None,
                             progress=False)
            cpu = time.process_time() - cpu
            v = trace.violation.double()
            late[name], first[name] = v[-lag:].mean(0), v[:lag].mean(0)  # per replication
            regret[name], total[name] = trace.regret[-lag:].mean(0), trace.regret.sum(0)
            paired = 100 * (late[name] - late["at once"])  # the same units and seeds: paired by replication
            gap, gap_se = float(paired.mean()), float(paired.std() / R_h ** 0.5)
            ref_regret, ref_total = float(regret["at once"].mean()), float(total["at once"].mean())
            row = {"benchmark": f"TS-ASC {label} R={R_h} T={T_h}, {metric} {lag} late: {name}",
                   "value": 100 * float(late[name].mean()), "unit": "% over the bound, last window",
                   "first_window": 100 * float(first[name].mean()), "gap": gap, "gap_se": gap_se,
                   "regret_late": float(regret[name].mean()), "regret_late_x": float(regret[name].mean()) / ref_regret,
                   "regret_total": float(total[name].mean()), "regret_total_x": float(total[name].mean()) / ref_total,
                   "cpu_s": cpu, "load": os.getloadavg()[0]}
            if delayed:  # the target: the late stream within 2 points of the policy told at once (not worse)
                row.update(target="late - at once <= 2 points", ratio=2.0 / max(gap, 0.01))
            rows.append(row)
            print(f"{label:42} {name:24} late {row['value']:6.2f} %  first {row['first_window']:6.2f} %  "
                  f"gap {gap:+6.2f} +- {gap_se:4.2f}  regret/decision late {row['regret_late']:+.4f} "
                  f"(x{row['regret_late_x']:.2f})  total {row['regret_total']:8.1f} (x{row['regret_total_x']:.2f})  "
                  f"cpu {cpu:5.1f} s  load {row['load']:.2f}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument("--harm", action="store_true", help="only the harm rows (the late-stream target)")
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; torch {torch.__version__}",
          flush=True)
    if args.harm:
        torch.set_num_threads(1)
        harm_rows(quick=args.quick)
    else:
        run(quick=args.quick)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
