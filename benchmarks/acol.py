"""ACOL (Lindner et al. 2022): the optimal-design solver and the acol-synthetic study's wall time.

* design solver: seconds for one ACOL round's design at n = 1,000 arms in d = 50 (unit-sphere
  arms), median of repeats, for the first round (``U = X``: the G-optimal design) and a later
  round (``U`` = 100 arms: the transductive design); target < 1 s per round.
* study: wall time of ``acol-synthetic`` at its default size (target 15 minutes on 2 cores);
  with ``quick`` the quick configuration against its 2-minute target.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np

from bayes_safe.identification import optimal_design, single_blas_thread

TARGET_DESIGN_S = 1.0
TARGET_STUDY_S = 15 * 60
TARGET_QUICK_S = 120


def design_seconds(n: int = 1000, d: int = 50, targets: int | None = None, repeats: int = 5, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    times = []
    for r in range(repeats):
        x = rng.standard_normal((n, d))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        with single_blas_thread():
            t = time.perf_counter()
            if targets is None:
                optimal_design(x)
            else:
                optimal_design(x, targets=x[rng.choice(n, targets, replace=False)])
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def study_seconds(quick: bool) -> float:
    from bayes_safe.studies import get_study

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        get_study("acol-synthetic").run(tmp, quick=quick)
        return time.perf_counter() - t


def run(quick: bool = False) -> list[dict]:
    repeats = 3 if quick else 5
    rows = []
    for label, targets in (("U = X (G-optimal)", None), ("|U| = 100", 100)):
        s = design_seconds(targets=targets, repeats=repeats)
        rows.append({"benchmark": f"ACOL design, n=1000 d=50, {label}", "value": s, "unit": "s/round",
                     "target": f"< {TARGET_DESIGN_S:g}", "ratio": TARGET_DESIGN_S / s})
    target = TARGET_QUICK_S if quick else TARGET_STUDY_S
    s = study_seconds(quick)
    rows.append({"benchmark": f"acol-synthetic study{' (quick)' if quick else ''}", "value": s, "unit": "s",
                 "target": f"< {target:g}", "ratio": target / s})
    return rows
