"""``ConservativeTS`` decision by decision in a user's loop (issue 42 item 3): its one-stream fast path
against its general path and against its numpy twin ``StreamingConservativeTS``.

    .venv/bin/python benchmarks/conservative_speed.py            # 5 repeats
    .venv/bin/python benchmarks/conservative_speed.py --quick    # 3 short repeats

The problem is the bake-off's size (``benchmarks/bakeoff.py``'s letter-sized stream): K = 26 arms,
d = 17 (16 standardised features and a constant), a synthetic multinomial-logit stream, the
baseline a weaker linear classifier (4 of the 16 features), ``calibrated_per_arm`` fitted on a
warm slice of 500 rows. Each row runs the bake-off's own harness class (``bakeoff.py``), one
``select`` and one ``update`` per decision, batch of one stream:

* ``ConservativeTS (fast path)``: ``BayesSafeConservativeTS`` (realised budget, alpha = 0.1,
  ``variance_scale = 1 / T``): ``torch.from_numpy(x)``, ``policy.select(x.expand(K, d), int(b),
  generator=g)``, ``policy.update(x, torch.tensor(r), actions=a)``;
* ``ConservativeTS (general path)``: the same policy with ``fast_path = False``, the code path every
  decision took before the fast path (the same decisions, the same numbers);
* ``ConservativeTS expected (fast path)``: the same with ``budget="expected"``;
* ``StreamingConservativeTS``: ``BayesSafeStreamingConservativeTS``, the numpy twin (the
  reference: ``vs streaming`` is a row's rate over its rate in the same repeat's run).

Rows are interleaved (repeat ``i`` measures every row in turn, so a change of the machine's load
hits all of them alike); each figure is the median over the repeats, one torch thread. ``per CPU
s`` is the rate over the process's CPU time during the loop (what the rate would be with a core to
itself; the machine has 2 shared cores); the 1-minute load average is printed at the start, the
end and per row. Target: the fast path at least 0.25x ``StreamingConservativeTS`` (``vs
streaming``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

K, D, WARM = 26, 17, 500
TARGET = 0.25


def _load() -> float:
    return os.getloadavg()[0]


def stream(n: int, seed: int = 0):
    """``(X [n, D], labels [n], baseline [n])``: a multinomial-logit stream with a constant feature."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D - 1, K))
    Z = rng.normal(size=(n, D - 1))
    y = np.argmax(Z @ W + rng.gumbel(size=(n, K)), axis=1)
    baseline = np.argmax(Z[:, :4] @ W[:4], axis=1)
    return np.hstack([Z, np.ones((n, 1))]), y, baseline


def learner(kind: str, X, y, seed: int):
    import bakeoff

    warm = (X[:WARM], y[:WARM])
    if kind == "streaming":
        return bakeoff.BayesSafeStreamingConservativeTS(D, K, seed, warm)
    out = bakeoff.BayesSafeConservativeTS(D, K, seed, warm, budget="expected" if kind == "expected" else "realised")
    out.policy.fast_path = kind != "general"
    return out


def run_one(kind: str, X, y, baseline, steps: int, seed: int) -> tuple[float, float, int]:
    """``(decisions / s, decisions / CPU s, explored)`` over ``steps`` decisions after the warm slice."""
    torch.set_num_threads(1)
    agent = learner(kind, X, y, seed)
    wall, cpu = time.perf_counter(), time.process_time()
    for t in range(WARM, WARM + steps):
        x = X[t]
        a = agent.act(x, int(baseline[t]), 1.0)
        agent.learn(x, a, float(a == y[t]))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    policy = agent.policy
    return steps / wall, steps / max(cpu, 1e-9), int(policy.explored)


ROWS = (("ConservativeTS (fast path)", "fast"), ("ConservativeTS (general path)", "general"),
        ("ConservativeTS expected (fast path)", "expected"), ("StreamingConservativeTS", "streaming"))


def measure(quick: bool = False, repeats: int | None = None) -> list[dict]:
    """The table of ``main``: one dict per row of ``ROWS`` (``row``, ``rate``, ``cpu_rate``, ``vs`` ...)."""
    repeats = repeats or (3 if quick else 5)
    steps = {"fast": 1500, "expected": 1500, "general": 300, "streaming": 3000} if quick else \
        {"fast": 4000, "expected": 4000, "general": 800, "streaming": 8000}
    X, y, baseline = stream(WARM + max(steps.values()))
    found: dict[str, list] = {kind: [] for _, kind in ROWS}
    for i in range(repeats):
        for _, kind in ROWS:
            found[kind].append((*run_one(kind, X, y, baseline, steps[kind], seed=i), _load()))
    ref = statistics.median(r[0] for r in found["streaming"])
    ref_cpu = statistics.median(r[1] for r in found["streaming"])
    rows = []
    for name, kind in ROWS:
        rate = statistics.median(r[0] for r in found[kind])
        cpu = statistics.median(r[1] for r in found[kind])
        rows.append({"row": name, "steps": steps[kind], "rate": rate, "cpu_rate": cpu, "vs": rate / ref,
                     "cpu_vs": cpu / ref_cpu, "explored": found[kind][0][2],
                     "load": statistics.median(r[3] for r in found[kind])})
    return rows


def run(quick: bool = False) -> list[dict]:
    """Rows for ``benchmarks/run.py``: each row's decisions a second, ``vs_streaming`` (its rate over
    ``StreamingConservativeTS``'s) and, for the fast path, issue 42's target (>= 0.25x the numpy twin;
    ``ratio`` = ``vs_streaming`` / 0.25)."""
    out = []
    for r in measure(quick):
        fast = r["row"] == ROWS[0][0]
        out.append({"benchmark": f"conservative_speed K={K} d={D}: {r['row']}", "value": r["rate"],
                    "unit": "decisions/s", "per_cpu_s": r["cpu_rate"], "vs_streaming": round(r["vs"], 2),
                    "load_avg": round(r["load"], 2), "target": f">= {TARGET}x streaming" if fast else "",
                    "ratio": r["vs"] / TARGET if fast else None})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 short repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    print(f"K = {K}, d = {D}, one torch thread; load average (1 min) at the start: {_load():.2f}")
    rows = measure(args.quick, args.repeats)
    print(f"{'row':38s} {'steps':>6s} {'per s':>9s} {'per CPU s':>10s} {'vs streaming':>13s} {'(CPU)':>6s} "
          f"{'explored':>9s} {'load':>5s}")
    for r in rows:
        print(f"{r['row']:38s} {r['steps']:6d} {r['rate']:9,.0f} {r['cpu_rate']:10,.0f} {r['vs']:13.2f} "
              f"{r['cpu_vs']:6.2f} {r['explored']:9d} {r['load']:5.2f}")
    fast = rows[0]
    print(f"load average at the end: {_load():.2f}; fast path {fast['rate'] / rows[1]['rate']:.1f}x the general "
          f"path; target {TARGET}x StreamingConservativeTS: {'met' if fast['vs'] >= TARGET else 'not met'} "
          f"({fast['vs']:.2f}x, CPU {fast['cpu_vs']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
