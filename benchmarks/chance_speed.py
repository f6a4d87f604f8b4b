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
* ``chance fresh, laplace``: the same constraint, fresh draws at every decision, the adverse-event
  model on the laplace engine (``inference="laplace"``, the same prior): its draws are Gaussian and
  cost microseconds, so no bank is needed (the single-draw rule's reference stays the Gibbs model).

Columns: ``simulate dec/s`` (``simulate`` of ``R`` replications x ``T`` patients, decisions a second:
``R T / seconds``, the median of the repeats), ``Decider ms`` (median ms of one ``Decider.decide`` +
``feedback`` over a stream of ``T`` patients, one stream, 200 propensity draws: the median over the
decisions of all repeats; ``mean ms``: their mean, which carries the refreshes of the bank, the
cost per decision in the long run) and the ratios of the single-draw rule's rate / time (``x single``: the cost
per decision relative to the single-draw rule; the target is <= 2). Repeats are interleaved (repeat
``i`` measures every row in turn). One torch thread; the load average (``os.getloadavg``) is printed
with the table: the times vary with it, the ratios less.

``serve ms`` (``--serve``, on by default; ``--no-serve`` skips it): ``bayes-safe serve`` of a saved
``Decider`` (``bayes_safe.online.serve.serve`` in a subprocess on 127.0.0.1, port 0, as
``benchmarks/serve.py`` starts it), one client: per patient ``POST /decide`` then ``POST /feedback``
(the outcome applied at once), the client's wall time of the two (the median, and the mean over the
stream); one warm-up ``/decide`` before the stream. A saved state needs an importable prior, so the
served policy's reward model is a conjugate Normal-prior efficacy model (not the horseshoe callable of
``SparseDosing.models``); the adverse-event model is the same logistic Gibbs model.

``run(quick)`` returns the rows of ``benchmarks/run.py`` (issue 42's target: each surface's cost per
decision with ``confidence=0.95`` and ``chance_refresh=SERVING_CHANCE_REFRESH`` at most twice the
single-draw rule's; ``ratio`` = 2 / (cost ratio), > 1 meets it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bayes_safe import TSASC, Constraint, simulate
from bayes_safe.envs.sparse_dosing import SparseDosing
from bayes_safe.online.decider import Decider


def _laplace(ae):
    """The same logistic adverse-event model on the laplace engine (``inference="laplace"``)."""
    from bayes_safe import BayesianLinear

    return BayesianLinear(ae.prior, likelihood="logistic", inference="laplace", batch_shape=ae.batch_shape)


def make_policy(problem: SparseDosing, replications, rule) -> TSASC:
    efficacy, ae = problem.models(replications)
    if rule == "laplace":
        return TSASC(efficacy, [_laplace(ae)], constraints=problem.constraints, metric_names=problem.metric_names)
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


def make_served_policy(problem: SparseDosing, rule) -> TSASC:
    """The policy ``serve`` runs: a conjugate Normal-prior efficacy model (a saved state needs an importable
    prior) and ``SparseDosing``'s logistic Gibbs adverse-event model."""
    import pyro.distributions as dist

    from bayes_safe import BayesianLinear

    _, ae = problem.models(None)
    efficacy = BayesianLinear(dist.Normal(torch.zeros(problem.dim, dtype=torch.float64), 1.0).to_event(1),
                              noise_std=0.5)
    if rule == "single":
        return TSASC(efficacy, [ae], constraints=[Constraint.absolute("adverse_event", at_most=problem.cap)],
                     metric_names=problem.metric_names)
    if rule == "laplace":
        return TSASC(efficacy, [_laplace(ae)], constraints=problem.constraints, metric_names=problem.metric_names)
    return TSASC(efficacy, [ae], constraints=problem.constraints, metric_names=problem.metric_names,
                 chance_refresh=rule)


def time_serve(rule, horizon: int, seed: int) -> list[float]:
    """Seconds of ``POST /decide`` + ``POST /feedback`` per patient against a ``serve`` subprocess of a saved
    ``Decider`` (``make_served_policy``), one client, the outcome applied at once."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import serve as serve_bench

    problem = SparseDosing(1, covariates=11, confidence=0.95)
    with tempfile.TemporaryDirectory(prefix="chance_speed_") as tmp:
        state = Decider(make_served_policy(problem, rule), seed=seed).save(Path(tmp) / "state")
        proc, url = serve_bench.start_server(state, snapshot_every=3600.0)

        async def drive() -> list[float]:
            conn = await serve_bench._RawConnection(url).open()
            g = torch.Generator().manual_seed(seed)
            out = []
            try:
                warm = problem.draw(1, g)
                await conn.post("/decide", {"features": warm.features[0].tolist(), "baseline": int(warm.baseline[0])})
                for _ in range(horizon):
                    units = problem.draw(1, g)
                    payload = {"features": units.features[0].tolist(), "baseline": int(units.baseline[0])}
                    start = time.perf_counter()
                    status, decision = await conn.post("/decide", payload)
                    mid = time.perf_counter()
                    if status != 200:
                        raise RuntimeError(f"/decide: {status} {decision}")
                    outcome = problem.outcomes(units, torch.tensor([decision["action"]]))  # outside the timing
                    restart = time.perf_counter()
                    status, fed = await conn.post("/feedback", {"decision_id": decision["decision_id"],
                                                                "reward": float(outcome[0, 0]),
                                                                "constraints": [float(outcome[0, 1])]})
                    if status != 200:
                        raise RuntimeError(f"/feedback: {status} {fed}")
                    out.append(mid - start + time.perf_counter() - restart)
            finally:
                conn.close()
            return out

        try:
            return asyncio.run(drive())
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def measure(repeats: int, replications: int, horizon: int, refresh, seed: int = 0, serve: bool = True,
            verbose: bool = True) -> dict:
    """Every rule (``single-draw``, ``chance fresh``, ``chance bank m`` for ``m`` in ``refresh``) on every
    surface, ``repeats`` interleaved repeats: ``{"rules": [(name, rule)], "rates": {name: [dec/s]},
    "times": {name: [s]}, "serve": {name: [s]}}``."""
    torch.set_num_threads(1)
    rules = [("single-draw", "single"), ("chance fresh", None)] + [(f"chance bank m={m}", m) for m in refresh]
    rules.append(("chance fresh, laplace", "laplace"))
    rates: dict = {name: [] for name, _ in rules}
    times: dict = {name: [] for name, _ in rules}
    served: dict = {name: [] for name, _ in rules}
    for i in range(repeats):
        for name, rule in rules:
            rates[name].append(time_simulate(rule, replications, horizon, seed + i))
            times[name].extend(time_decider(rule, horizon, seed + i))
            if serve:
                served[name].extend(time_serve(rule, horizon, seed + i))
            if verbose:
                print(f"  repeat {i + 1}/{repeats}: {name} done", file=sys.stderr, flush=True)
    return {"rules": rules, "rates": rates, "times": times, "serve": served if serve else None}


def run(quick: bool = False) -> list[dict]:
    """Rows for ``benchmarks/run.py``: per surface (``simulate``, ``Decider``, ``serve``) the serving rule's
    cost per decision over the single-draw rule's (issue 42 target <= 2; ``simulate``: the rate ratio,
    ``Decider`` and ``serve``: the mean over the stream, which carries the bank's refreshes), and the
    fresh-draw rule's for reference. ``quick``: one repeat of 60 patients; else 3 repeats (the bank's
    first refreshes, at 1, 2, 4, ... rows, weigh more in a shorter stream)."""
    from bayes_safe.policies.ts_asc import SERVING_CHANCE_REFRESH

    repeats, horizon, reps = (1, 60, 8) if quick else (3, 60, 8)
    m = SERVING_CHANCE_REFRESH
    res = measure(repeats, reps, horizon, [m], verbose=False)
    load = round(os.getloadavg()[0], 2)
    bank, single = f"chance bank m={m}", "single-draw"
    rows = []
    for name, label in ((bank, f"confidence=0.95, chance_refresh={m}"),
                        ("chance fresh, laplace", "confidence=0.95, laplace AE model, fresh draws"),
                        ("chance fresh", "confidence=0.95, fresh draws")):
        target = "" if name == "chance fresh" else "<= 2"
        sim = statistics.median(res["rates"][single]) / statistics.median(res["rates"][name])
        rows.append({"benchmark": f"chance_speed: simulate R={reps} x T={horizon}, {label}, cost x single-draw",
                     "value": sim, "unit": "x", "load_avg": load, "target": target,
                     "ratio": 2 / sim if target else None})
        for surface, key in (("Decider", "times"), ("serve (POST /decide + /feedback)", "serve")):
            mean = statistics.fmean(res[key][name]) / statistics.fmean(res[key][single])
            med = statistics.median(res[key][name]) / statistics.median(res[key][single])
            rows.append({"benchmark": f"chance_speed: {surface}, {horizon} decisions, {label}, mean cost x single-draw "
                                      f"(median x{med:.2f}; {1e3 * statistics.fmean(res[key][name]):.1f} vs "
                                      f"{1e3 * statistics.fmean(res[key][single]):.1f} ms)",
                         "value": mean, "unit": "x", "load_avg": load, "target": target,
                         "ratio": 2 / mean if target else None})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, shorter runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replications", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=60, help="patients per replication / decisions of the stream")
    parser.add_argument("--refresh", type=int, nargs="+", default=None,
                        help="chance_refresh values to measure (default: SERVING_CHANCE_REFRESH, the serving setting)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-serve", dest="serve", action="store_false", help="skip the serve column")
    args = parser.parse_args(argv)
    from bayes_safe.policies.ts_asc import SERVING_CHANCE_REFRESH

    repeats, horizon = (1, min(args.horizon, 30)) if args.quick else (args.repeats, args.horizon)
    refresh = args.refresh or [SERVING_CHANCE_REFRESH]
    res = measure(repeats, args.replications, horizon, refresh, args.seed, serve=args.serve)
    rules, rates, times, served = res["rules"], res["rates"], res["times"], res["serve"]
    rate0 = statistics.median(rates["single-draw"])
    ms0 = 1e3 * statistics.median(times["single-draw"])
    print(f"SparseDosing d = 15, Gibbs models; simulate R = {args.replications} x T = {horizon}; Decider"
          f"{' and serve' if served else ''}: one stream of {horizon} decisions; {repeats} repeat(s), medians")
    mean0 = 1e3 * statistics.fmean(times["single-draw"])
    header = (f"{'rule':<20} {'simulate dec/s':>15} {'x single':>9} {'Decider ms':>11} {'x single':>9} "
              f"{'mean ms':>8} {'x single':>9}")
    if served:
        header += f" {'serve ms':>9} {'x single':>9} {'mean ms':>8} {'x single':>9}"
        s_med0 = 1e3 * statistics.median(served["single-draw"])
        s_mean0 = 1e3 * statistics.fmean(served["single-draw"])
    print(header)
    print("-" * len(header))
    for name, _ in rules:
        rate = statistics.median(rates[name])
        ms = 1e3 * statistics.median(times[name])
        mean = 1e3 * statistics.fmean(times[name])
        line = (f"{name:<20} {rate:>15.1f} {rate0 / rate:>9.2f} {ms:>11.2f} {ms / ms0:>9.2f} {mean:>8.2f} "
                f"{mean / mean0:>9.2f}")
        if served:
            s_med, s_mean = 1e3 * statistics.median(served[name]), 1e3 * statistics.fmean(served[name])
            line += f" {s_med:>9.2f} {s_med / s_med0:>9.2f} {s_mean:>8.2f} {s_mean / s_mean0:>9.2f}"
        print(line)
    print("load average (1, 5, 15 min): " + " / ".join(f"{v:.2f}" for v in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
