"""One stream at decision speed (issue 27): the public ``select`` + ``update`` loop at R = 1 and
``Decider.decide`` + ``feedback`` in process.

    .venv/bin/python benchmarks/single_stream.py            # 5 repeats
    .venv/bin/python benchmarks/single_stream.py --quick    # 3 short repeats

Rows, measured in one run, each the median of the repeats, interleaved (repeat ``i`` measures
every row in turn, so a change of the machine's load hits all of them alike), one torch thread:

* ``numpy loop``: the reference, a plain one-replication numpy Thompson loop over K = 100 arms in
  R^4 (``benchmarks/scaling.py``'s ``numpy_plain``: Cholesky, two solves, scores, argmax, the
  outcome, the rank-one update);
* ``simulate lean path``: ``simulate`` of ``ThompsonSampling`` over a conjugate known-noise
  ``BayesianLinear`` (``batch_shape=[1]``) on ``kazerouni2017_neurips`` (K = 100, d = 4, R = 1),
  whose loop takes the lean path (``models.linear._ThompsonStep``): decisions/s from
  ``trace.attrs``;
* ``public TS select+update``: a user's own loop on the same problem and posterior, outside any
  library context (no inference mode, no trusted inputs): ``a = policy.select(X, baseline,
  generator=g)``, the outcome computed by the user in torch, ``policy.update(X[:, a], y)``;
* ``simulate TS-ASC`` and ``public TS-ASC select+update``: the same for ``TSASC`` (alpha = 0.1,
  two conjugate models) on ``daulton2019`` (K = 100, d = 4, a reward and a constraint metric);
  ``simulate`` has no lean path for TS-ASC (its general path, trusted inputs, inference mode) and
  is the reference of the public TS-ASC loop;
* ``the same loop inside torch.inference_mode()``: the public TS loop as above, run by its user
  inside ``torch.inference_mode()`` as ``simulate`` runs its own loop (no autograd bookkeeping per
  tensor operation): how much of the remaining distance to the lean path is that bookkeeping
  rather than the library's checks (not a target: a user's loop is not expected to do this);
* ``Decider decide+feedback``: conjugate TS-ASC (two ``BayesianLinear``, noise sd 0.5, d = 4),
  5 candidates as a numpy array, baseline 0, 200 propensity draws, ``update_every = 1``; each
  decision is followed at once by its feedback (a float reward and one constraint value), without
  a log and with a SQLite ``DecisionLog`` (one committed transaction per decision and per feedback);
* ``... with a logistic (Gibbs) constraint``: the same with the constraint model a logistic
  ``BayesianLinear`` (the Gibbs engine, Pólya-Gamma augmentation) told 0/1 outcomes: 1,000
  decisions after 20 (a sweep costs O(n) in the observations so far: the rate is that of a
  stream's first thousand decisions).

Targets (issue 27 item 3): the public loop at R = 1 at least 0.8x ``simulate``'s lean path on
the same problem (TS-ASC: against ``simulate`` of TS-ASC); ``Decider.decide`` + ``feedback`` at
least 5,000 per second without a log and 3,000 with SQLite (issue 42), 1,000 with the logistic constraint. ``vs ref`` is the rate over the row's reference measured in the same
run; ``ratio`` the rate over the target (>= 1: met). The 1-minute load average is printed at the
start, the end and per row (the machine has 2 cores; other jobs may share it). On a shared machine
the process does not have a core to itself: ``per CPU s`` is the rate over the process's share
of a core during the measurement (its CPU time over the wall time of the call, set-up included),
what the rate would be on an idle machine short of cache effects, with ``cpu vs ref`` and
``ratio (CPU)`` the same ratios on those rates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET_VS_LEAN = 0.8
TARGET_DECIDER = 5_000
TARGET_DECIDER_LOG = 3_000  # with an SQLite log (issue 42)
TARGET_DECIDER_GIBBS = 1_000


def _prior(d: int):
    import pyro.distributions as dist

    return dist.Normal(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)).expand([d]).to_event(1)


def numpy_loop(steps: int, seed: int) -> float:
    from scaling import numpy_plain

    return numpy_plain(steps, 100, 4, seed=seed)


def simulate_rate(kind: str, steps: int, seed: int) -> float:
    from bayes_safe import simulate
    from bayes_safe.envs import daulton2019, kazerouni2017_neurips
    from bayes_safe.factory import make_policy

    env = kazerouni2017_neurips(replications=1, seed=seed) if kind == "ts" else daulton2019(replications=1, seed=seed)
    policy = make_policy("ts", env) if kind == "ts" else make_policy("ts-asc", env, alpha=0.1)
    trace = simulate(policy, env, steps, seed=seed + 1, record=("actions", "regret"))
    return trace.attrs["decisions_per_second"]


def public_loop(kind: str, steps: int, seed: int) -> float:
    """Decisions/s of a user's loop of ``policy.select`` + ``policy.update`` (outcomes included)."""
    from bayes_safe import TSASC, BayesianLinear, ThompsonSampling
    from bayes_safe.envs import daulton2019, kazerouni2017_neurips

    env = kazerouni2017_neurips(replications=1, seed=seed) if kind == "ts" else daulton2019(replications=1, seed=seed)
    X = env.arm_features.clone()  # [1, K, d]
    theta = env.parameters[0].clone()  # [M, d]
    noise = float(env.noise_std[0])
    baseline = env.baseline_action.clone()  # [1]
    d = X.shape[-1]
    if kind == "ts":
        policy = ThompsonSampling(BayesianLinear(_prior(d), noise_std=noise, batch_shape=[1]))
    else:
        policy = TSASC(BayesianLinear(_prior(d), noise_std=noise, batch_shape=[1]),
                       [BayesianLinear(_prior(d), noise_std=noise, batch_shape=[1])], alpha=0.1)
    means = X[0] @ theta.T  # [K, M]
    g = torch.Generator().manual_seed(seed + 1)
    start = time.perf_counter()
    if kind == "ts":
        for _ in range(steps):
            a = int(policy.select(X, baseline, generator=g))
            y = means[a, :1] + noise * torch.randn(1, generator=g, dtype=torch.float64)
            policy.update(X[:, a], y)
    else:
        for _ in range(steps):
            a = int(policy.select(X, baseline, generator=g))
            y = means[a] + noise * torch.randn(2, generator=g, dtype=torch.float64)
            policy.update(X[:, a], y[:1], y[None, 1:])
    return steps / (time.perf_counter() - start)


def _inference(fn, *args):
    """``fn(*args)`` inside ``torch.inference_mode()`` (what ``simulate`` runs its loop in)."""
    with torch.inference_mode():
        return fn(*args)


def decider_rate(decisions: int, seed: int, with_log: bool, constraint: str = "gaussian") -> float:
    """``Decider.decide`` + ``feedback`` per second, TS-ASC, d = 4, 5 candidates, 200 draws; the
    constraint model conjugate (``"gaussian"``) or logistic (the Gibbs engine, 0/1 outcomes)."""
    import pyro.distributions as dist

    from bayes_safe import TSASC, BayesianLinear
    from bayes_safe.online import Decider, DecisionLog

    def model(likelihood="gaussian"):
        prior = dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1)
        if likelihood == "gaussian":
            return BayesianLinear(prior, noise_std=0.5, batch_shape=[1])
        return BayesianLinear(prior, likelihood=likelihood, batch_shape=[1])

    rng = np.random.default_rng(seed)
    contexts = [rng.normal(size=(5, 4)) for _ in range(decisions + 20)]
    outcomes = rng.normal(size=(decisions + 20, 2))
    if constraint != "gaussian":
        outcomes[:, 1] = outcomes[:, 1] > 0.5  # a 0/1 guardrail metric (about 31 % ones)
    outcomes = outcomes.tolist()
    with tempfile.TemporaryDirectory(prefix="single_stream_") as tmp:
        log = DecisionLog(Path(tmp) / "log.sqlite") if with_log else None
        decider = Decider(TSASC(model(), [model(constraint)], alpha=0.1), num_draws=200, log=log, seed=seed)
        for i in range(20):  # warm-up (first factorisations, SQLite pages)
            dec = decider.decide(contexts[i], baseline=0)
            decider.feedback(dec.decision_id, outcomes[i][0], [outcomes[i][1]])
        start = time.perf_counter()
        for i in range(20, decisions + 20):
            dec = decider.decide(contexts[i], baseline=0)
            decider.feedback(dec.decision_id, outcomes[i][0], [outcomes[i][1]])
        rate = decisions / (time.perf_counter() - start)
        if log is not None:
            log.close()
    return rate


ROWS = [
    # (name, function(quick, seed) -> decisions/s, the name of its reference row or None)
    ("numpy loop, TS K=100 d=4 (reference)", lambda q, s: numpy_loop(2_000 if q else 10_000, s), None),
    ("simulate lean path, TS K=100 d=4 R=1", lambda q, s: simulate_rate("ts", 2_000 if q else 10_000, s),
     "numpy loop, TS K=100 d=4 (reference)"),
    ("public TS select+update, K=100 d=4 R=1", lambda q, s: public_loop("ts", 2_000 if q else 10_000, s),
     "simulate lean path, TS K=100 d=4 R=1"),
    ("  the same loop inside torch.inference_mode() (not a target)",
     lambda q, s: _inference(public_loop, "ts", 2_000 if q else 10_000, s), "simulate lean path, TS K=100 d=4 R=1"),
    ("simulate TS-ASC (general path), K=100 d=4 R=1", lambda q, s: simulate_rate("ts-asc", 1_000 if q else 5_000, s),
     "simulate lean path, TS K=100 d=4 R=1"),
    ("public TS-ASC select+update, K=100 d=4 R=1", lambda q, s: public_loop("ts-asc", 1_000 if q else 5_000, s),
     "simulate TS-ASC (general path), K=100 d=4 R=1"),
    ("Decider decide+feedback, TS-ASC d=4 K=5 S=200, no log", lambda q, s: decider_rate(500 if q else 3_000, s, False),
     None),
    ("Decider decide+feedback, TS-ASC d=4 K=5 S=200, SQLite log",
     lambda q, s: decider_rate(500 if q else 3_000, s, True), None),
    ("Decider decide+feedback, TS-ASC with a logistic (Gibbs) constraint, no log",
     lambda q, s: decider_rate(300 if q else 1_000, s, False, "logistic"), None),
]


def run(quick: bool = False, repeats: int | None = None) -> list[dict]:
    """The rows (``benchmarks/run.py`` format: ``benchmark``, ``value``, ``unit``, ``target``, ``ratio``,
    plus ``vs ref`` and ``load``)."""
    torch.set_num_threads(1)
    repeats = repeats or (3 if quick else 5)
    rates: dict[str, list[float]] = {name: [] for name, *_ in ROWS}
    loads: list[float] = []
    shares: dict[str, list[float]] = {name: [] for name, *_ in ROWS}
    for i in range(repeats):
        for name, fn, _ in ROWS:
            wall, cpu = time.perf_counter(), time.process_time()
            rates[name].append(fn(quick, i))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            shares[name].append(min(1.0, cpu / wall))  # the process's share of a core during the call
        loads.append(os.getloadavg()[0])
    med = {name: statistics.median(v) for name, v in rates.items()}
    # what the rate would be with a core to itself: the rate over the CPU share (medians of the repeats)
    idle = {name: statistics.median(r / s for r, s in zip(rates[name], shares[name])) for name in rates}
    out = []
    for name, _, ref in ROWS:
        value = med[name]
        row = {"benchmark": name, "value": value, "unit": "decisions/s", "vs ref": None if ref is None else value / med[ref],
               "per CPU s": idle[name], "cpu vs ref": None if ref is None else idle[name] / idle[ref],
               "load": statistics.median(loads), "target": "", "ratio": None, "ratio (CPU)": None}
        if name.startswith("public"):
            row["target"] = f">= {TARGET_VS_LEAN}x {ref.split(',')[0]}"
            row["ratio"] = value / (TARGET_VS_LEAN * med[ref])
            row["ratio (CPU)"] = idle[name] / (TARGET_VS_LEAN * idle[ref])
        elif name.startswith("Decider"):
            target = (TARGET_DECIDER_GIBBS if "Gibbs" in name else TARGET_DECIDER_LOG if "SQLite" in name
                      else TARGET_DECIDER)
            row["target"] = f">= {target:,}/s"
            row["ratio"] = value / target
            row["ratio (CPU)"] = idle[name] / target
        out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter runs, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per row (default 5, 3 with --quick)")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats: expected an int >= 1")
    from run import print_table

    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; torch {torch.__version__}, "
          f"numpy {np.__version__}", flush=True)
    rows = run(quick=args.quick, repeats=args.repeats)
    print_table(rows, headers=("benchmark", "value", "unit", "vs ref", "per CPU s", "cpu vs ref", "load", "target", "ratio",
                               "ratio (CPU)"))
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
