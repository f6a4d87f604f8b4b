"""What one served decision costs with each engine: ``Decider.decide`` + ``feedback`` in process.

    .venv/bin/python benchmarks/engine_costs.py            # 300 decisions per engine (Gibbs 30)
    .venv/bin/python benchmarks/engine_costs.py --quick    # 100 decisions (Gibbs 10)

The figures behind the production guide's "Which engine to serve" table (issue 42). One problem
size for all: ``d = 20`` features, ``K = 20`` candidates a decision, each model warm-started on
``--rows`` (2,000) logged rows in one ``update``, then served by ``ThompsonSampling`` in a
``Decider`` (200 propensity draws, no log), each decision's outcome learned at once. Rows:

* ``Gaussian reward, conjugate``: ``BayesianLinear(Normal prior, noise_std=0.5)``;
* ``Gaussian reward, NIG``: the same with ``noise_prior=InverseGamma(2, 0.5)`` (unknown noise);
* ``0/1 click, Normal prior, laplace`` / ``horseshoe prior, laplace``:
  ``BayesianLinear(prior, likelihood="logistic", inference="laplace")``;
* ``0/1 click, Normal prior, gibbs``: the Polya-Gamma chain on the same rows (its sweep is
  ``O(n d^2)``: the cost grows with ``--rows``);
* ``per-arm, conjugate``: ``PerArmLinear(Normal prior, num_arms=K, noise_std=0.5)`` on one context
  vector a decision;
* ``0/1, probit GP``: ``SuccessProbability(ProbitGP(d, hidden=(16, 4)))`` fitted on the warm rows.

Each row: the first decision (it pays a Gibbs burn-in, a factorisation) and the median of the
rest, in ms; one torch thread; the 1-minute load average. ``run(quick)`` returns the rows for
``benchmarks/run.py``. A chance constraint's cost and the sparse d = 90 model are measured by
``chance_speed.py`` and ``sparse_logistic.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import pyro
import pyro.distributions as dist
import torch

from bayes_safe.models import BayesianLinear
from bayes_safe.online import Decider
from bayes_safe.policies import ThompsonSampling

F64 = torch.float64
D, K = 20, 20


def horseshoe():
    tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(1.0, dtype=F64)))
    lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(D, dtype=F64)).to_event(1))
    return pyro.sample("w", dist.Normal(torch.zeros(D, dtype=F64), tau * lam).to_event(1))


def _normal(scale=1.0):
    return dist.Normal(torch.zeros(D, dtype=F64), scale).to_event(1)


def _model(kind: str):
    if kind == "conjugate":
        return BayesianLinear(_normal(), noise_std=0.5)
    if kind == "nig":
        return BayesianLinear(_normal(), noise_prior=dist.InverseGamma(2.0, 0.5))
    if kind == "laplace":
        return BayesianLinear(_normal(), likelihood="logistic", inference="laplace")
    if kind == "laplace-horseshoe":
        return BayesianLinear(horseshoe, dim=D, likelihood="logistic", inference="laplace")
    if kind == "gibbs":
        return BayesianLinear(_normal(), likelihood="logistic", inference="gibbs")
    if kind == "per-arm":
        from bayes_safe.models import PerArmLinear

        return PerArmLinear(_normal(), num_arms=K, noise_std=0.5)
    if kind == "gp":
        from bayes_safe.models import ProbitGP

        return ProbitGP(D, hidden=(16, 4), activation="tanh", refit_every=None, nn_epochs=2, nn_min_steps=30,
                        gp_epochs=1, seed=0)
    raise ValueError(kind)


ROWS = (("Gaussian reward, conjugate", "conjugate"), ("Gaussian reward, NIG (unknown noise)", "nig"),
        ("0/1 click, Normal prior, laplace", "laplace"), ("0/1 click, horseshoe prior, laplace", "laplace-horseshoe"),
        ("0/1 click, Normal prior, gibbs", "gibbs"), ("per-arm, conjugate", "per-arm"), ("0/1, probit GP", "gp"))


def time_engine(kind: str, rows: int, decisions: int, seed: int = 0) -> list[float]:
    """Seconds of ``decide`` + ``feedback`` for ``decisions`` decisions after a warm start on ``rows`` rows."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D, generator=g, dtype=F64) / D ** 0.5
    binary = kind not in ("conjugate", "nig", "per-arm")
    model = _model(kind)
    rng = np.random.default_rng(seed)
    if kind == "per-arm":
        W = torch.randn(K, D, generator=g, dtype=F64) / D ** 0.5
        X = torch.randn(rows, D, generator=g, dtype=F64)
        a = torch.randint(0, K, (rows,), generator=g)
        y = (X * W[a]).sum(-1) + 0.5 * torch.randn(rows, generator=g, dtype=F64)
        for t in range(rows):  # one context a row (the per-arm model's update shape)
            model.update(X[t], y[t], actions=a[t])
    else:
        X = torch.randn(rows, D, generator=g, dtype=F64)
        f = X @ w
        y = torch.bernoulli(torch.sigmoid(f), generator=g) if binary else f + 0.5 * torch.randn(rows, generator=g, dtype=F64)
        model.update(X, y)
        if kind == "gp":
            model.fit()
            from bayes_safe.models import SuccessProbability

            model = SuccessProbability(model)
    decider = Decider(ThompsonSampling(model), num_draws=200, seed=seed)
    out = []
    for _ in range(decisions):
        if kind == "per-arm":
            x = rng.normal(size=D)
            start = time.perf_counter()
            dec = decider.decide(x)
            r = float(x @ W[dec.action].numpy() + 0.5 * rng.normal())
        else:
            feats = rng.normal(size=(K, D))
            start = time.perf_counter()
            dec = decider.decide(feats)
            mean = float(feats[dec.action] @ w.numpy())
            r = float(rng.random() < 1 / (1 + np.exp(-mean))) if binary else mean + 0.5 * float(rng.normal())
        decider.feedback(dec.decision_id, r)
        out.append(time.perf_counter() - start)
    return out


def measure(rows: int = 2000, decisions: int = 300, gibbs_decisions: int = 30) -> list[dict]:
    found = []
    time_engine("conjugate", 50, 3)  # the process's first decision (imports, first calls) outside every row
    for name, kind in ROWS:
        try:
            times = time_engine(kind, rows, gibbs_decisions if kind == "gibbs" else decisions)
        except Exception as exc:  # noqa: BLE001 - one engine's failure is a row, not the end of the run
            found.append({"row": name, "error": f"{type(exc).__name__}: {exc}"[:120]})
            continue
        found.append({"row": name, "first_ms": 1e3 * times[0], "median_ms": 1e3 * statistics.median(times[1:]),
                      "p90_ms": 1e3 * float(np.percentile(times[1:], 90)), "load": os.getloadavg()[0]})
    return found


def run(quick: bool = False) -> list[dict]:
    """Rows for ``benchmarks/run.py``: the median ms per decision (decide + feedback) of each engine."""
    rows = 2000
    out = []
    for r in measure(rows, 100 if quick else 300, 10 if quick else 30):
        label = f"engine_costs d={D} K={K} {rows:,} warm rows, Decider: {r['row']}"
        if "error" in r:
            out.append({"benchmark": label, "value": None, "unit": r["error"], "target": "", "ratio": None})
            continue
        out.append({"benchmark": label, "value": r["median_ms"], "unit": "ms", "first_ms": r["first_ms"],
                    "p90_ms": r["p90_ms"], "load_avg": round(r["load"], 2), "target": "", "ratio": None})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args(argv)
    decisions, gibbs = (100, 10) if args.quick else (300, 30)
    print(f"d = {D}, K = {K}, {args.rows} warm rows, ThompsonSampling in a Decider (200 draws, no log), one torch "
          f"thread; torch {torch.__version__}, {os.cpu_count()} cores")
    print(f"{'engine':40s} {'first ms':>9s} {'median ms':>10s} {'p90 ms':>8s} {'load':>5s}")
    for r in measure(args.rows, decisions, gibbs):
        if "error" in r:
            print(f"{r['row']:40s} {r['error']}")
        else:
            print(f"{r['row']:40s} {r['first_ms']:9.2f} {r['median_ms']:10.2f} {r['p90_ms']:8.2f} {r['load']:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
