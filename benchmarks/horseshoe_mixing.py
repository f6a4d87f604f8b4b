"""Mixing of the Gibbs engine's horseshoe on a sparse logistic problem: the global scale ``tau``.

    .venv/bin/python benchmarks/horseshoe_mixing.py            # 4 chains x 1,000 draws
    .venv/bin/python benchmarks/horseshoe_mixing.py --quick    # 4 chains x 300 draws

Problem (seeded): ``d = 90`` features ``x ~ N(0, I)``, 3,000 rows, 0/1 outcomes
``y ~ Bernoulli(sigmoid(x^T w))`` with 5 nonzero weights (1.5, -1.2, 1.0, -0.8, 0.6; the other
85 are 0); prior ``w_j ~ N(0, tau^2 lam_j^2)``, ``lam_j ~ C+(0, 1)``, ``tau ~ C+(0, 1)``
(``BayesianLinear(horseshoe, likelihood="logistic")``, Polya-Gamma augmentation). Four chains
run as one batch of four replications of the engine (vectorised), all from the engine's initial
state (``tau = 1``, ``lam = 1``, ``w = 0``), each with its own random numbers; ``warm_up``
sweeps (200) are discarded, then ``draws`` sweeps are kept (1,000; 300 with ``--quick``).

Two schemes for ``tau``, measured in the same run on the same data and random seed:

* ``marginal`` (the default): ``tau`` drawn with ``w`` integrated out given the Polya-Gamma
  latents (Metropolis-Hastings on ``log tau``), then ``w | tau`` (Johndrow, Orenstein &
  Bhattacharya 2020, Sec. 2.1);
* ``conditional``: the older per-coordinate step ``tau^2 | w, lam, xi ~ IG`` (Makalic &
  Schmidt 2016), ``GibbsLinearPosterior(tau_scheme="conditional")``.

Columns: ``tau_rhat`` and ``tau_ess_bulk`` / ``tau_ess_tail`` (ArviZ, rank-normalised split
r-hat and ESS over the 4 chains), ``w_rhat_fail`` (share of the 90 weights with r-hat > 1.01),
``w_ess_min`` (smallest bulk ESS of a weight), ``ms_per_sweep`` and ``cpu_ms_per_sweep`` (wall
and CPU time of one sweep of the 4-chain batch, one intra-op thread; the CPU time is the steadier
figure on a shared machine), ``tau_ess_per_cpu_s`` (bulk ESS of ``tau`` per CPU second of the kept
sweeps), ``accept`` (mean MH acceptance of ``tau`` proposals, the
marginal scheme only), and the ratios marginal / conditional. A second table gives the CPU time
of one sweep of one chain on a small problem (d = 4, n = 100), both schemes. Target (marginal scheme, 4 x
1,000): ``tau`` r-hat <= 1.01 and bulk ESS >= 400. The load average (``os.getloadavg``) is
printed with the table: on a shared machine the times vary with it, the r-hat and ESS do not.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyro
import pyro.distributions as dist
import torch

from bayes_safe import BayesianLinear

D, N, CHAINS, WARM_UP = 90, 3000, 4, 200
TRUE = (1.5, -1.2, 1.0, -0.8, 0.6)
TARGET_RHAT, TARGET_ESS = 1.01, 400.0


def horseshoe(d: int = D):
    """The horseshoe prior as a callable Pyro model (the centred form the Gibbs engine recognises)."""

    def prior():
        tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(1.0, dtype=torch.float64)))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d, dtype=torch.float64)).to_event(1))
        return pyro.sample("w", dist.Normal(torch.zeros(d, dtype=torch.float64), tau * lam).to_event(1))

    return prior


def problem(seed: int = 0, d: int = D, n: int = N, true=TRUE):
    """``(X [n, d], y [n], w_true [d])``: the seeded sparse logistic data."""
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(d, dtype=torch.float64)
    w[: len(true)] = torch.tensor(true, dtype=torch.float64)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    p = torch.sigmoid(X @ w)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).double()
    return X, y, w


def run_chains(X, y, scheme: str, draws: int, warm_up: int = WARM_UP, chains: int = CHAINS, seed: int = 1,
               d: int = D, likelihood: str = "logistic", noise_std: float | None = None):
    """Run ``chains`` chains (one batch) of the Gibbs engine's horseshoe; returns ``(tau [C, S], w [C, S, d],
    wall seconds per sweep, CPU seconds per sweep, mean acceptance of tau or nan)``."""
    kwargs = {"likelihood": likelihood} if noise_std is None else {"noise_std": noise_std}
    model = BayesianLinear(horseshoe(d), dim=d, batch_shape=[chains], **kwargs)
    engine = model.engine
    if engine.prior.kind != "horseshoe":
        raise RuntimeError(f"expected the Gibbs engine's horseshoe, got {model.engine_name} / {engine.prior.kind}")
    engine.tau_scheme = scheme
    model.update(X.expand(chains, *X.shape), y.expand(chains, *y.shape))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(warm_up):
        engine.sweep(engine.state, gen, "warm-up")
    taus, ws, acc = [], [], []
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(draws):
        engine.sweep(engine.state, gen, "draws")
        taus.append(engine.state.aux["tau2"].sqrt())
        ws.append(engine.state.w.clone())
        if engine.last_tau_accept is not None and scheme == "marginal":
            acc.append(engine.last_tau_accept)
    per_sweep = (time.perf_counter() - start) / draws
    cpu_per_sweep = (time.process_time() - cpu) / draws
    tau = torch.stack(taus, 1).numpy()  # [C, S]
    w = torch.stack(ws, 1).numpy()  # [C, S, d]
    accept = float(torch.stack(acc).mean()) if acc else float("nan")
    return tau, w, per_sweep, cpu_per_sweep, accept


def mixing(tau: np.ndarray, w: np.ndarray) -> dict:
    """r-hat and ESS of ``tau [C, S]`` and of each weight of ``w [C, S, d]`` (ArviZ)."""
    import arviz as az

    w_rhat = np.array([float(az.rhat(w[..., j])) for j in range(w.shape[-1])])
    w_ess = np.array([float(az.ess(w[..., j], method="bulk")) for j in range(w.shape[-1])])
    return {"tau_rhat": float(az.rhat(tau)), "tau_ess_bulk": float(az.ess(tau, method="bulk")),
            "tau_ess_tail": float(az.ess(tau, method="tail")), "w_rhat_fail": float((w_rhat > 1.01).mean()),
            "w_ess_min": float(w_ess.min()), "tau_mean": float(tau.mean())}


def run(quick: bool = False) -> list[dict]:
    """The benchmark's rows (``benchmarks/run.py`` convention): one per scheme, then the ratios."""
    torch.set_num_threads(1)
    draws = 300 if quick else 1000
    X, y, _ = problem()
    rows = []
    for scheme in ("marginal", "conditional"):
        tau, w, per_sweep, cpu_per_sweep, accept = run_chains(X, y, scheme, draws)
        row = {"scheme": scheme, "draws": f"{CHAINS} x {draws}", **mixing(tau, w),
               "ms_per_sweep": 1000.0 * per_sweep, "cpu_ms_per_sweep": 1000.0 * cpu_per_sweep, "accept": accept}
        row["tau_ess_per_cpu_s"] = row["tau_ess_bulk"] / (cpu_per_sweep * draws)
        rows.append(row)
    new, old = rows
    rows.append({"scheme": "marginal / conditional", "draws": "",
                 **{k: new[k] / old[k] if old[k] else float("inf")
                    for k in ("tau_rhat", "tau_ess_bulk", "tau_ess_tail", "w_ess_min", "ms_per_sweep",
                              "cpu_ms_per_sweep", "tau_ess_per_cpu_s")},
                 "w_rhat_fail": float("nan"), "tau_mean": float("nan"), "accept": float("nan")})
    met = new["tau_rhat"] <= TARGET_RHAT and new["tau_ess_bulk"] >= TARGET_ESS
    for r in rows:
        r.update(benchmark="horseshoe_mixing", target=f"tau r-hat <= {TARGET_RHAT}, bulk ESS >= {TARGET_ESS:.0f}")
    new["met"] = ("yes" if met else "no") if not quick else "n/a (quick)"  # the target is for 4 x 1,000
    return rows


def small_cost(sweeps: int = 300) -> list[dict]:
    """CPU ms per sweep of one chain on a small problem (d = 4, n = 100, one nonzero weight), Gaussian
    (noise sd 1) and logistic likelihoods, both schemes: what a Thompson draw costs where the fixed
    per-call cost of the Metropolis-Hastings steps is not hidden behind ``O(n d^2)`` data work."""
    rows = []
    for likelihood in ("gaussian", "logistic"):
        X, y, w = problem(seed=1, d=4, n=100, true=(1.0,))
        if likelihood == "gaussian":
            y = X @ w + torch.randn(100, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        cost = {}
        for scheme in ("marginal", "conditional"):
            kwargs = {"likelihood": likelihood} if likelihood != "gaussian" else {"noise_std": 1.0}
            model = BayesianLinear(horseshoe(4), dim=4, batch_shape=[1], **kwargs)
            model.engine.tau_scheme = scheme
            model.update(X[None], y[None])
            gen = torch.Generator().manual_seed(0)
            for _ in range(30):
                model.engine.sweep(model.engine.state, gen)
            start = time.process_time()
            for _ in range(sweeps):
                model.engine.sweep(model.engine.state, gen)
            cost[scheme] = 1000.0 * (time.process_time() - start) / sweeps
        rows.append({"likelihood": likelihood, "marginal": cost["marginal"], "conditional": cost["conditional"],
                     "ratio": cost["marginal"] / cost["conditional"]})
    return rows


COLUMNS = ("scheme", "draws", "tau_rhat", "tau_ess_bulk", "tau_ess_tail", "w_rhat_fail", "w_ess_min", "tau_mean",
           "ms_per_sweep", "cpu_ms_per_sweep", "tau_ess_per_cpu_s", "accept", "met")


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if np.isnan(v):
            return ""
        return f"{v:.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 chains x 300 draws instead of 4 x 1,000")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick)
    table = [[_fmt(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(COLUMNS)]
    print(f"horseshoe logistic, d = {D}, n = {N}, {len(TRUE)} nonzero weights; {CHAINS} chains, "
          f"warm-up {WARM_UP} sweeps; target {rows[0]['target']}")
    print(" | ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)))
    print("-|-".join("-" * w for w in widths))
    for t in table:
        print(" | ".join(c.ljust(w) for c, w in zip(t, widths)))
    print("\nCPU ms per sweep, one chain, d = 4, n = 100 (small problem: the MH steps' fixed cost shows)")
    for r in small_cost():
        print(f"  {r['likelihood']:8s}: marginal {r['marginal']:.2f}, conditional {r['conditional']:.2f}, "
              f"ratio {r['ratio']:.2f}")
    load = os.getloadavg()
    print(f"load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
