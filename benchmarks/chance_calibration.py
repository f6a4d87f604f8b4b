"""Is "95 % safe" 95 %? TS-ASC's chance constraint on the sparse dose-finding problem, before and after.

    .venv/bin/python benchmarks/chance_calibration.py            # R = 8 trials x 400 patients
    .venv/bin/python benchmarks/chance_calibration.py --quick    # R = 4 x 200, the Gibbs engine only
    .venv/bin/python benchmarks/chance_calibration.py --d 80     # one dimension

Problem: ``bayes_safe.envs.SparseDosing`` (seeded by ``--seed``; 7 dose levels, ``d = 4 +
covariates`` features, a sparse truth, the AE risk capped at 5 % with ``confidence=0.95``) at
``d = 15`` and ``d = 80``. Engines, as a user would fit them (``SparseDosing.models``):
``gibbs`` (a horseshoe efficacy model and a logistic AE model, both Gibbs-sampled; the chance
probability from 64 joint draws of the chain) and ``conjugate`` (Gaussian models in closed form).

Settings: ``prior`` is the logistic AE model's (``SparseDosing.models(ae_prior=...)``): ``wide``
(``N(0, 1)`` on every weight: the user's model, over-confident at ``d = 80``) or ``scaled`` (the
covariate weights ``N(0, 0.25^2)``, the dose terms ``N(0, 1)``); ``rule`` is TS-ASC's chance rule
(bayes_safe/policies/ts_asc.py, "Calibrated chance constraints"): ``before`` the declared rule
(``p >= 0.95`` of the estimate, as it was), ``after`` ``TSASC.CALIBRATED``.

Columns: ``claimed`` (the declared level / mean claimed probability of the played allowed doses),
``safe`` and ``safe_late`` (share of played allowed doses whose true AE risk is at most the cap,
overall / last quarter, ``bayes_safe.diagnostics.chance_calibration``), ``exceed_late`` (share of
*all* late played doses, fallback plays included, whose true AE risk is above the cap: the
number users watch; the declaration promises at most 5 %), ``fallback_late`` (share of late plays
where no dose was allowed), ``efficacy_late`` (mean true efficacy of late doses) and
``regret_late`` (mean late regret against the best dose under the cap), ``seconds`` (wall time of
the run, one intra-op thread). The load average (``os.getloadavg``) is printed with the table:
the times vary with it, the shares do not. ``--quick`` is a smoke run: at 200 patients the AE
model has not learned enough for any rule to keep the claim (measured, seed 0: at ``d = 80`` the
fixed setup fell back in 96 % of late rows, and 17.5 % of late doses were above the cap, at
least 13 points of it from fallback plays), so its shares say nothing about the claim.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from bayes_safe import TSASC, simulate
from bayes_safe.diagnostics import chance_calibration
from bayes_safe.envs.sparse_dosing import SparseDosing

#: (label, engine, AE prior, TSASC options): the user's setup, the model fixed, the model and the rule fixed
SETTINGS = (
    ("before", "gibbs", "wide", {}),
    ("model", "gibbs", "scaled", {}),
    ("after", "gibbs", "scaled", dict(TSASC.CALIBRATED)),
    ("before", "conjugate", None, {}),
    ("after", "conjugate", None, dict(TSASC.CALIBRATED)),
)


def run(covariates: int, engine: str, ae_prior, options: dict, replications: int, horizon: int, seed: int) -> dict:
    problem = SparseDosing(replications, covariates=covariates, confidence=0.95)
    kwargs = {"engine": engine} if ae_prior is None else {"engine": engine, "ae_prior": ae_prior}
    reward, ae = problem.models(replications, **kwargs)
    policy = TSASC(reward, [ae], constraints=problem.constraints, metric_names=problem.metric_names, **options)
    start = time.perf_counter()
    trace = simulate(policy, problem, horizon, seed=seed, progress=False)
    seconds = time.perf_counter() - start
    (row,) = chance_calibration(trace)
    late = slice(horizon - horizon // 4, horizon)
    risk = trace.expected[late, :, 1]
    allowed = trace.chance_claims["allowed"][late]
    return {"d": problem.dim, "claimed": row["claimed"], "safe": row["realised"],
            "safe_late": row["late"]["realised"], "exceed_late": float((risk > problem.cap).double().mean()),
            "fallback_late": float((~allowed).double().mean()),
            "efficacy_late": float(trace.expected[late, :, 0].mean()),
            "regret_late": float(trace.regret[late].mean()), "seconds": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="R = 4 trials x 200 patients, the Gibbs engine only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--d", type=int, choices=(15, 80), action="append", help="only this dimension (repeatable)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    R, T = (4, 200) if args.quick else (8, 400)
    settings = [s for s in SETTINGS if not (args.quick and s[1] != "gibbs")]
    print(f"sparse dose finding, AE <= 0.05 with confidence 0.95; R = {R} trials x T = {T} patients, seed {args.seed}")
    print(f"after = TSASC(..., **{TSASC.CALIBRATED}); AE prior: wide = N(0, 1) on every weight, scaled = covariate "
          "weights N(0, 0.25^2)")
    header = (f"{'d':>3} {'engine':9} {'prior':6} {'rule':6} {'claimed':>15} {'safe':>6} {'safe_late':>9} "
              f"{'exceed_late':>11} {'fallback_late':>13} {'efficacy_late':>13} {'regret_late':>11} {'seconds':>7}")
    print(header)
    for d in args.d or (15, 80):
        for label, engine, ae_prior, options in settings:
            r = run(d - 4, engine, ae_prior, options, R, T, args.seed)
            rule = "after" if options else "before"
            print(f"{r['d']:>3} {engine:9} {ae_prior or '-':6} {rule:6} {'0.95 / ' + format(r['claimed'], '.3f'):>15} "
                  f"{r['safe']:6.3f} {r['safe_late']:9.3f} {r['exceed_late']:11.3f} {r['fallback_late']:13.3f} "
                  f"{r['efficacy_late']:13.3f} {r['regret_late']:11.3f} {r['seconds']:7.1f}", flush=True)
    print("load average (1, 5, 15 min): " + " / ".join(f"{v:.2f}" for v in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
