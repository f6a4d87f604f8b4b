"""A decision log's propensities under another policy, batched (issue 41 item 6).

    .venv/bin/python benchmarks/log_propensities.py            # 20,000 rows, 3 repeats
    .venv/bin/python benchmarks/log_propensities.py --quick    # 2,000 rows, 2 repeats

``DecisionLog.target_probabilities`` and the decision-log tuner (``LoggedAlpha``) need a target
policy's probability of every action at every logged decision. They asked
``policy.action_probabilities`` one logged row at a time (20,000 rows x 100 draws of a conjugate
TS-ASC at d = 90, K = 20: 64.7 s); they now call ``Policy.row_probabilities``, which asks for many
rows per call when the policy and its models allow it (``BayesianLinear._row_draws_at``: each
row's draws independent of the other rows', the law of the per-row call).

Rows of the table, one torch thread, each the median of the repeats (interleaved: repeat ``i``
measures every row in turn):

* ``TS-ASC conjugate``: TS-ASC (alpha = 0.1) over two conjugate known-noise ``BayesianLinear``
  without a batch shape, each fitted to 2,000 observations; ``rows`` candidate sets of ``K``
  candidates in R^d, a baseline each;
* ``... batch_shape [1]``: the same models built with ``batch_shape=[1]`` (what a ``Decider`` also
  serves);
* ``... NIG reward``: the reward model Normal-Inverse-Gamma (an unknown noise variance);
* ``... declared chance cap``: TS-ASC with a declared ``absolute("harm", at_most=0.3,
  confidence=0.9)`` (the decision-log tuner's constraints mode: the guarded path, closed-form
  chance probabilities);
* ``Gibbs (row by row)``: the reward model a Laplace-prior Gibbs model: a chain engine, asked one
  row at a time as before (both columns the per-row path; ``--gibbs-rows`` rows, extrapolated).

``old s`` is the per-row loop (``row_probabilities(..., batched=False)``, the numbers of the old
code) timed on ``--old-rows`` rows and extrapolated to ``rows``; ``new s`` the default path on all
``rows``; ``ratio`` = old / new. Target: 20,000 rows x 100 draws at d = 90, K = 20 in <= 3 s for
the conjugate models. The 1-minute load average is printed per row and at the start and the end
(the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyro.distributions as dist

from bayes_safe.envs import Constraint
from bayes_safe.models import BayesianLinear
from bayes_safe.policies import TSASC

F64 = torch.float64


def _model(d: int, batch_shape=(), kind: str = "conjugate", seed: int = 0) -> BayesianLinear:
    g = torch.Generator().manual_seed(seed)
    loc = torch.zeros(d, dtype=F64)
    if kind == "gibbs":
        m = BayesianLinear(dist.Laplace(loc, 1.0).to_event(1), noise_std=0.5, inference="gibbs", batch_shape=batch_shape)
        n = 200
    elif kind == "nig":
        m = BayesianLinear(dist.Normal(loc, 1.0).to_event(1), noise_prior=dist.InverseGamma(2.0, 0.5), batch_shape=batch_shape)
        n = 2000
    else:
        m = BayesianLinear(dist.Normal(loc, 1.0).to_event(1), noise_std=0.5, batch_shape=batch_shape)
        n = 2000
    w = torch.randn(d, generator=g, dtype=F64) / d ** 0.5
    X = torch.randn(n, d, generator=g, dtype=F64)
    y = X @ w + 0.5 * torch.randn(n, generator=g, dtype=F64)
    if batch_shape:
        m.update(X[None], y[None])
    else:
        m.update(X, y)
    return m


def _policy(d: int, kind: str) -> TSASC:
    shape = [1] if kind == "batch1" else []
    reward = _model(d, shape, {"nig": "nig", "gibbs": "gibbs"}.get(kind, "conjugate"), seed=1)
    if kind == "declared":  # the tuner's constraints mode: TS-ASC off the paper path (a chance cap, closed form)
        cap = Constraint.absolute("harm", at_most=0.3, confidence=0.9)
        return TSASC(reward, [_model(d, shape, seed=2)], constraints=[cap], metric_names=["reward", "harm"])
    return TSASC(reward, [_model(d, shape, seed=2)], alpha=0.1)


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


KINDS = {"TS-ASC conjugate": "conjugate", "TS-ASC conjugate, batch_shape [1]": "batch1",
         "TS-ASC, NIG reward": "nig", "TS-ASC declared chance cap": "declared", "Gibbs reward (row by row)": "gibbs"}
#: seconds for 20,000 rows x 100 draws at d = 90, K = 20 with the conjugate models (issue 41 item 6)
TARGET_S = 3.0


def measure(rows: int = 20_000, draws: int = 100, dim: int = 90, actions: int = 20, repeats: int = 3,
            old_rows: int = 400, gibbs_rows: int = 40) -> dict:
    """``{name: (old s, new s, load)}`` for every policy of ``KINDS``: medians of ``repeats`` interleaved
    repeats (the module docstring)."""
    torch.set_num_threads(1)
    n, S, d, K = rows, draws, dim, actions
    g = torch.Generator().manual_seed(0)
    features = torch.randn(n, K, d, generator=g, dtype=F64) / d ** 0.5
    sizes = torch.randint(K // 2, K + 1, (n,), generator=g)  # ragged: K/2 .. K candidates (padded to K)
    sizes[0] = K
    baseline = torch.zeros(n, dtype=torch.long)
    policies = {name: _policy(d, kind) for name, kind in KINDS.items()}
    old = {name: [] for name in KINDS}
    new = {name: [] for name in KINDS}
    loads = {name: [] for name in KINDS}
    for _ in range(repeats):
        for name, policy in policies.items():
            m = gibbs_rows if KINDS[name] == "gibbs" else min(n, old_rows)

            def per_row(policy=policy, m=m):
                policy.row_probabilities(features[:m], baseline[:m], num_actions=sizes[:m], num_draws=S, seed=0,
                                         batched=False)

            old[name].append(_time(per_row) * n / m)
            if KINDS[name] == "gibbs":
                new[name].append(old[name][-1])  # the chain engine keeps the per-row path
            else:
                new[name].append(_time(lambda policy=policy: policy.row_probabilities(
                    features, baseline, num_actions=sizes, num_draws=S, seed=0)))
            loads[name].append(os.getloadavg()[0])
    return {name: (statistics.median(old[name]), statistics.median(new[name]), statistics.median(loads[name]))
            for name in KINDS}


def run(quick: bool = False) -> list[dict]:
    """Rows for ``benchmarks/run.py``: seconds for the log's propensities under each policy (the batched
    path), ``vs_per_row`` = the per-row loop's seconds over them; the conjugate row against the 3 s target
    (scaled to the rows measured: ``quick`` is 2,000 rows, 2 repeats, so its target is 0.3 s)."""
    rows_n, repeats, old_rows = (2_000, 2, 200) if quick else (20_000, 3, 400)
    found = measure(rows=rows_n, repeats=repeats, old_rows=old_rows)
    out = []
    for name, (old, new, load) in found.items():
        target = TARGET_S * rows_n / 20_000 if KINDS[name] == "conjugate" else None
        out.append({"benchmark": f"log_propensities {rows_n:,} rows x 100 draws d=90 K=20: {name}", "value": new,
                    "unit": "s", "vs_per_row": round(old / new, 1), "load_avg": round(load, 2),
                    "target": f"<= {target:g}" if target else "", "ratio": target / new if target else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--dim", type=int, default=90)
    ap.add_argument("--actions", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--old-rows", type=int, default=400, help="rows the per-row loop is timed on (extrapolated)")
    ap.add_argument("--gibbs-rows", type=int, default=40, help="rows the Gibbs row is timed on (extrapolated)")
    ap.add_argument("--quick", action="store_true", help="2,000 rows, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.repeats, args.old_rows = 2_000, 2, 200
    n, S, d, K = args.rows, args.draws, args.dim, args.actions
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; torch {torch.__version__}, "
          f"1 thread; rows {n}, draws {S}, d {d}, K {K}", flush=True)
    found = measure(n, S, d, K, args.repeats, args.old_rows, args.gibbs_rows)
    header = f"{'policy':38s} {'rows':>7s} {'draws':>5s} {'d':>4s} {'K':>4s} {'old s':>9s} {'new s':>8s} {'ratio':>7s} {'load':>5s}"
    print(header)
    print("-" * len(header))
    for name, (o, w, load) in found.items():
        print(f"{name:38s} {n:7d} {S:5d} {d:4d} {K:4d} {o:9.2f} {w:8.2f} {o / w:7.1f} {load:5.2f}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
