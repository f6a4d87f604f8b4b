"""Simulation at scale (issue 20): decisions/s of ``simulate`` over a grid of R, K and d.

    .venv/bin/python benchmarks/scaling.py           # the grid, 3 repeats per cell
    .venv/bin/python benchmarks/scaling.py --quick   # fewer cells, shorter runs, 2 repeats
    .venv/bin/python benchmarks/scaling.py --large   # the cells above 64 MiB of features (up to 1.2 GB)

Thompson sampling with a shared-weight conjugate Gaussian posterior (``BayesianLinear``, known
noise) on a linear bandit with ``K`` fixed arms in ``R^d`` (features and weights ``N(0, 1)``),
``R`` replications in lockstep. One row per cell (R, K, d):

* ``simulate``: steady decisions/s of ``simulate`` (full record): ``(T - 1) R`` over the
  loop time of a ``T``-step run minus that of a 1-step run (``attrs["elapsed_seconds"]``), so
  that the start-up (stream creation, first factorisation), reported apart as ``step0``, does
  not weigh on short runs;
* ``policy``: decisions/s of the policy alone, ``select`` + ``update`` on the same problem,
  timed around those two calls only (the problem's draws and outcomes and the gather of the
  chosen rows are excluded), steps 1 to ``T - 1``, in the same inference-mode / one-thread
  setting as ``simulate``;
* ``numpy``: the reference measured in the same run: a plain numpy loop at R = 1 (``[d, d]``
  arrays), numpy batched over replications (stacked ``linalg``) at R >= 100 (the loop of
  ``benchmarks/linear_ts.py``): Cholesky, solves, ``[R, K]`` scores, argmax, rank-one update;
* ``sim/numpy`` and ``sim/policy``: the ratios;
* ``floor/numpy`` and ``sim/floor`` (R = 1 rows): ``torch_floor``, the same loop written by hand in
  torch with no library code, over the numpy loop (the most any torch implementation of these
  operations reaches at R = 1) and ``simulate`` over it (the share of that floor reached);
* ``step0 s``: wall time of ``simulate(..., horizon=1)`` from a fresh policy (seeding,
  stream creation, first draws, first factorisation, recording set-up), and ``step0 cpu``
  the process CPU time of the same call (what the wall time would be on an idle machine,
  short of cache and page-fault effects);
* ``peak/trace``: the growth of the process's peak resident memory during the ``simulate``
  run (``/proc/self/clear_refs`` resets the peak first) over the returned Trace's size. In the
  benchmark's own process memory freed by earlier cells is reused, which hides part of the
  growth, so the memory target cell is measured in a fresh process where nothing of the
  library has run before (``--memory R K d T SEED``); other cells' figures are indicative;
* ``load``: the 1-minute load average when the row was measured.

Rates and times are medians over the repeats. Cells whose ``[R, K, d]`` features exceed
64 MiB are skipped (the machine is shared), except the two target cells (R = 10,000 with
K = 100, d = 4 and K = 10, d = 64). One torch thread throughout (``torch.set_num_threads(1)``).

``--large`` measures the skipped cells of the R >= 100 target instead (K in {100, 1,000}, d in
{4, 16, 64}; features of 122 MiB to 1.2 GB, held three times: the problem's, the transposed copy
scoring reads, numpy's), all but R = 10,000, K = 1,000, d = 64 (4.9 GB of features, 15 GB held).
A run there has few steps and a start-up (the transposed copy, first-touch page faults) that
varies by tenths of a second between runs, so the T-step-minus-1-step difference is not used:
``simulate`` is timed per step through its ``callback`` (which adds a gather of the step's means
and a dict, a few microseconds against steps of 30 ms and more) and the rate is ``R`` over the
median step after the first; numpy is timed over 10 steps.

Targets (issue 20): R = 1: simulate >= 0.8x the numpy loop; R >= 100, K in {100, 1000},
d in {4, 16, 64}: >= 1.2x batched numpy; R = 10,000: simulate >= 0.8x the policy alone;
step 0 at R = 10,000, d = 64 < 0.5 s; peak memory at R = 10,000, K = 100, d = 4, T = 200
at most 2x the Trace.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyro.distributions as dist
from linear_ts import numpy_reference as numpy_batched

from bayes_safe import BayesianLinear, ThompsonSampling, simulate
from bayes_safe._validation import trusted_inputs
from bayes_safe.envs.linear import LinearBandit
from bayes_safe.random import ReplicationRNG, replication_seeds
from bayes_safe.threads import single_thread

FEATURE_BYTES_CAP = 64 << 20
TARGET_CELLS = {(10_000, 100, 4), (10_000, 10, 64)}


def problem(R: int, K: int, d: int, seed: int = 0) -> LinearBandit:
    """``R`` instances of ``K`` arms in ``R^d``, features and weights ``N(0, 1)``, noise sd 1."""
    g = torch.Generator().manual_seed(seed)
    return LinearBandit(name="scaling", arm_features=torch.randn(R, K, d, generator=g, dtype=torch.float64),
                        parameters=torch.randn(R, 1, d, generator=g, dtype=torch.float64),
                        noise_std=torch.ones(1, dtype=torch.float64),
                        baseline_action=torch.zeros(R, dtype=torch.long), parameter_std=1.0)


def policy(R: int, d: int) -> ThompsonSampling:
    prior = dist.Normal(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)).expand([d]).to_event(1)
    return ThompsonSampling(BayesianLinear(prior, noise_std=1.0, batch_shape=[R]))


def numpy_plain(steps: int, K: int, d: int, seed: int = 0) -> float:
    """Decisions/s of a plain one-replication numpy TS loop (``[d, d]`` arrays, no batch axis)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((K, d))
    theta = rng.standard_normal(d)
    prec, b = np.eye(d), np.zeros(d)
    start = time.perf_counter()
    for _ in range(steps):
        L = np.linalg.cholesky(prec)
        mean = np.linalg.solve(prec, b)
        w = mean + np.linalg.solve(L.T, rng.standard_normal(d))
        a = int(np.argmax(X @ w))
        x = X[a]
        y = x @ theta + rng.standard_normal()
        prec += np.outer(x, x)
        b += x * y
    return steps / (time.perf_counter() - start)


def torch_floor(steps: int, K: int, d: int, seed: int = 0) -> float:
    """Decisions/s of the same one-replication loop written by hand in torch: what torch's per-call
    costs allow at R = 1 with no library code at all.

    The maths of the numpy loop and of ``simulate``'s lean path (Cholesky, two triangular solves,
    ``[1, K]`` scores, argmax, the outcome, the rank-one update and one record per step) in 13
    tensor operations of 1.3 to 3 us each, one thread, inference mode, random numbers from one
    ``torch.Generator`` (cheaper than the library's per-replication streams), no checks, no
    trace. The library's R = 1 rate over this one is the share of the floor it reaches.
    """
    with torch.inference_mode():
        g = torch.Generator().manual_seed(seed)
        X = torch.randn(1, K, d, generator=g, dtype=torch.float64)
        Xt = X.mT.contiguous()
        theta = torch.randn(1, d, generator=g, dtype=torch.float64)
        means = (X * theta[:, None, :]).sum(-1)  # [1, K]
        prec, eta = torch.eye(d, dtype=torch.float64)[None].clone(), torch.zeros(1, d, 1, dtype=torch.float64)
        L = torch.linalg.cholesky(prec)
        u = torch.linalg.solve_triangular(L, eta, upper=False)
        scores = torch.empty(1, 1, K, dtype=torch.float64)
        actions, rewards = torch.empty(steps, dtype=torch.long), torch.empty(steps, dtype=torch.float64)
        start = time.perf_counter()
        for t in range(steps):
            z = torch.randn(1, d, 1, generator=g, dtype=torch.float64)
            w = torch.linalg.solve_triangular(L.mT, u + z, upper=True)
            torch.bmm(w.mT, Xt, out=scores)
            a = int(scores.argmax())
            x = X[:, a]  # [1, d]
            y = means[:, a] + torch.randn(1, generator=g, dtype=torch.float64)
            prec.addcmul_(x[:, :, None], x[:, None, :])
            eta.addcmul_(y[:, None, None], x[:, :, None])
            L, _ = torch.linalg.cholesky_ex(prec)
            u = torch.linalg.solve_triangular(L, eta, upper=False)
            actions[t], rewards[t] = a, y[0]
        return steps / (time.perf_counter() - start)


def _rss_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def simulate_rate(R: int, K: int, d: int, T: int, seed: int) -> tuple[float, float | None, float, float]:
    """(steady decisions/s of ``simulate``, peak memory growth over the Trace's size or None,
    step-0 wall seconds, step-0 CPU seconds)."""
    env, pol = problem(R, K, d, seed), policy(R, d)
    wall, cpu = time.perf_counter(), time.process_time()
    first = simulate(pol, env, 1, seed=seed + 1)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    env, pol = problem(R, K, d, seed), policy(R, d)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set to the current one
        before = _rss_kib("VmRSS")
    except OSError:
        before = None
    trace = simulate(pol, env, T, seed=seed + 1)
    growth = None
    if before is not None:
        size = sum(getattr(trace, f).numel() * getattr(trace, f).element_size() for f in trace.recorded)
        growth = (_rss_kib("VmHWM") - before) * 1024 / size
    steady = trace.attrs["elapsed_seconds"] - first.attrs["elapsed_seconds"]
    rate = (T - 1) * R / steady if steady > 0 else trace.attrs["decisions_per_second"]
    return rate, growth, wall, cpu


def policy_rate(R: int, K: int, d: int, T: int, seed: int) -> float:
    """Decisions/s of ``select`` + ``update`` alone on the problem's steps (draws and outcomes not timed)."""
    env, pol = problem(R, K, d, seed), policy(R, d)
    rng = ReplicationRNG(replication_seeds(seed + 1, R))
    rows = torch.arange(R)
    spent = 0.0
    with single_thread(), torch.inference_mode(), trusted_inputs():
        for t in range(T):
            units = env.draw(R, rng)
            start = time.perf_counter()
            a = pol.select(units.features, units.baseline, generator=rng, valid=units.valid)
            spent += (time.perf_counter() - start) if t else 0.0
            obs = env.outcomes(units, a)
            x = units.features[rows, a]
            start = time.perf_counter()
            pol.update(x, obs[:, 0], None, actions=a)
            spent += (time.perf_counter() - start) if t else 0.0
    return (T - 1) * R / spent


def fresh_process_peak(R: int, K: int, d: int, T: int, seed: int) -> float | None:
    """``peak/trace`` of one ``simulate`` run in a new Python process (``--memory``)."""
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--memory", str(R), str(K), str(d), str(T), str(seed)],
                         capture_output=True, text=True, check=False)
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def grid(quick: bool) -> list[tuple[int, int, int]]:
    Rs = (1, 100, 1_000, 10_000)
    Ks = (10, 100, 1_000)
    ds = (4, 16, 64)
    if quick:
        cells = [(1, 100, 4), (1, 100, 16), (1, 1_000, 4), (100, 100, 4), (100, 1_000, 16), (1_000, 100, 4),
                 (1_000, 100, 64), (10_000, 100, 4), (10_000, 10, 64)]
        return cells
    cells = [(R, K, d) for R in Rs for K in Ks for d in ds
             if R * K * d * 8 <= FEATURE_BYTES_CAP or (R, K, d) in TARGET_CELLS]
    return cells


def horizon(R: int, K: int, d: int, quick: bool) -> int:
    """Steps per run: about the same work per run in every cell (at least 6 steps); T = 200 at
    the memory target cell (R = 10,000, K = 100, d = 4)."""
    if (R, K, d) == (10_000, 100, 4):
        return 200
    work = 1 + (K * d + d**3 / 3) / 400  # ~2 for K = 100, d = 4
    budget = 100_000 if quick else 300_000
    return int(min(2_000 if quick else 5_000, max(6, budget / (R * work))))


def targets(R: int, K: int, d: int, sim: float, ref: float, pol: float, step0: float, mem: float | None, T: int) -> str:
    out = []
    if R == 1:
        out.append(f"sim>=0.8x numpy: {'met' if sim >= 0.8 * ref else 'MISSED'}")
    elif K in (100, 1_000):
        out.append(f"sim>=1.2x numpy: {'met' if sim >= 1.2 * ref else 'MISSED'}")
    if R == 10_000:
        out.append(f"sim>=0.8x policy: {'met' if sim >= 0.8 * pol else 'MISSED'}")
        if d == 64:
            out.append(f"step0<0.5s: {'met' if step0 < 0.5 else 'MISSED'} (wall)")
        if (K, d, T) == (100, 4, 200) and mem is not None:
            out.append(f"peak<=2x trace: {'met' if mem <= 2 else 'MISSED'}")
    return "; ".join(out)


def measure(R: int, K: int, d: int, repeats: int, quick: bool) -> dict:
    T = horizon(R, K, d, quick)
    sims, mems, pols, refs, step0s, cpus, floors = [], [], [], [], [], [], []
    for i in range(repeats):
        rate, mem, wall, cpu = simulate_rate(R, K, d, T, seed=i)
        sims.append(rate)
        step0s.append(wall)
        cpus.append(cpu)
        if mem is not None:
            mems.append(mem)
        pols.append(policy_rate(R, K, d, T, seed=i))
        refs.append(numpy_plain(T, K, d, seed=i) if R == 1 else numpy_batched(R, T, seed=i, num_arms=K, dim=d))
        if R == 1:
            floors.append(torch_floor(T, K, d, seed=i))
    sim, pol, ref, step0, cpu = (statistics.median(v) for v in (sims, pols, refs, step0s, cpus))
    floor = statistics.median(floors) if floors else None
    if (R, K, d, T) == (10_000, 100, 4, 200):
        mems = [fresh_process_peak(R, K, d, T, seed=i) for i in range(repeats)]
        mems = [m for m in mems if m is not None]
    mem = statistics.median(mems) if mems else None
    return {"R": R, "K": K, "d": d, "T": T, "simulate/s": sim, "policy/s": pol, "numpy/s": ref,
            "sim/numpy": sim / ref, "sim/policy": sim / pol, "floor/numpy": None if floor is None else floor / ref,
            "sim/floor": None if floor is None else sim / floor, "step0 s": step0, "step0 cpu": cpu, "peak/trace": mem,
            "load": os.getloadavg()[0], "targets": targets(R, K, d, sim, ref, pol, step0, mem, T)}


LARGE_CELLS = [(1_000, 1_000, 16), (1_000, 1_000, 64), (10_000, 100, 16), (10_000, 100, 64), (10_000, 1_000, 4),
               (10_000, 1_000, 16)]


def measure_large(R: int, K: int, d: int, repeats: int, T: int = 12) -> dict:
    """One ``--large`` row: ``simulate``'s rate from its median step time (see the module docstring)."""
    sims, refs = [], []
    for i in range(repeats):
        env, pol = problem(R, K, d, i), policy(R, d)
        stamps: list[float] = []
        simulate(pol, env, T, seed=i + 1, record=("actions", "regret"), callback=lambda t, info, out=stamps: out.append(time.perf_counter()))
        del env, pol
        sims.append(R / statistics.median(b - a for a, b in itertools.pairwise(stamps)))
        refs.append(numpy_batched(R, 10, seed=i, num_arms=K, dim=d))
    sim, ref = statistics.median(sims), statistics.median(refs)
    return {"R": R, "K": K, "d": d, "T": T, "simulate/s": sim, "numpy/s": ref, "sim/numpy": sim / ref,
            "load": os.getloadavg()[0], "targets": f"sim>=1.2x numpy: {'met' if sim >= 1.2 * ref else 'MISSED'}"}


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def print_row(row: dict, header: bool) -> None:
    cols = list(row)
    widths = {c: max(len(c), 10) for c in cols}
    widths["targets"] = 0
    if header:
        print(" | ".join(c.ljust(widths[c]) for c in cols), flush=True)
        print("-|-".join("-" * max(widths[c], 7) for c in cols), flush=True)
    print(" | ".join(_fmt(row[c]).ljust(widths[c]) for c in cols), flush=True)


def run(quick: bool = False, repeats: int | None = None, large: bool = False) -> list[dict]:
    """Measure every cell of the grid, or the large cells (printing each row as it is measured); the rows."""
    torch.set_num_threads(1)
    repeats = repeats or (2 if quick else 3)
    rows = []
    for i, (R, K, d) in enumerate(LARGE_CELLS if large else grid(quick)):
        rows.append(measure_large(R, K, d, repeats) if large else measure(R, K, d, repeats, quick))
        print_row(rows[-1], header=i == 0)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer cells, shorter runs, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per cell (default 3, 2 with --quick)")
    parser.add_argument("--large", action="store_true", help="the R >= 100 cells above 64 MiB of features instead")
    parser.add_argument("--memory", nargs=5, type=int, metavar=("R", "K", "d", "T", "SEED"),
                        help="only print peak/trace of one simulate run in this (fresh) process")
    args = parser.parse_args(argv)
    if args.memory:
        R, K, d, T, seed = args.memory
        torch.set_num_threads(1)
        env, pol = problem(R, K, d, seed), policy(R, d)
        Path("/proc/self/clear_refs").write_text("5")  # nothing of the library has run in this process yet
        before = _rss_kib("VmRSS")
        trace = simulate(pol, env, T, seed=seed + 1)
        size = sum(getattr(trace, f).numel() * getattr(trace, f).element_size() for f in trace.recorded)
        print((_rss_kib("VmHWM") - before) * 1024 / size)
        return 0
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats: expected an int >= 1")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; torch {torch.__version__}, "
          f"numpy {np.__version__}", flush=True)
    run(quick=args.quick, repeats=args.repeats, large=args.large)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
