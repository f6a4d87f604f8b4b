"""Is a trial's reported SEM the noise of re-running it? A calibration check.

Re-run each of several parameterizations many times (different seeds) and compare the re-runs
two by two: for two runs of the same parameters, ``z = (m1 - m2) / sqrt(sem1^2 + sem2^2)``
has standard deviation 1 when the SEMs are the noise of a re-run. Above 1 they understate it
(the Ax model then trusts noise as signal), below 1 they overstate it.

``noise_calibration`` runs single A/B tests (replicate seeds of ``ABTest.evaluate_replicates``)
and groups them into trials of ``R`` replicates (``combine_replicates``) for every ``R`` asked
for, so one set of runs measures the calibration of one replicate per trial (the SEM of one run)
and of several. ``benchmarks/tuning.py --calibration`` runs it on video-upload and on the
synthetic logged-data problem.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from .ab_test import ABTest, Range, combine_replicates, replicate_seed

__all__ = ["noise_calibration", "pair_z_scores", "random_parameterizations"]


def random_parameterizations(parameters: Sequence, n: int, seed: int = 0) -> list[dict]:
    """``n`` parameterizations drawn uniformly (log-uniformly for a log range) from ``Range`` entries."""
    rng = np.random.default_rng(seed)
    out = []
    ranges = [p if isinstance(p, Range) else Range(**p) for p in parameters]
    for _ in range(n):
        point = {}
        for r in ranges:
            if r.log:
                v = float(math.exp(rng.uniform(math.log(r.low), math.log(r.high))))
            else:
                v = float(rng.uniform(r.low, r.high))
            point[r.name] = round(v) if r.integer else v
        out.append(point)
    return out


def pair_z_scores(trials: Sequence[Mapping], metric: str) -> list[float]:
    """z-scores of disjoint pairs (trial 0 with 1, 2 with 3, ...) of re-runs of one parameterization."""
    z = []
    for a, b in zip(trials[0::2], trials[1::2]):
        if metric in a and metric in b:
            (m1, s1), (m2, s2) = a[metric], b[metric]
            scale = math.sqrt(s1**2 + s2**2)
            if scale > 0:
                z.append((m1 - m2) / scale)
    return z


_AB: ABTest | None = None


def _runs(job):
    index, parameters, seed, n = job
    return index, [_AB.evaluate_once(parameters, replicate_seed(seed, r)) for r in range(n)]


def noise_calibration(ab_test: ABTest, parameterizations: Sequence[Mapping], *, reruns: int = 10,
                      replicates: Sequence[int] = (1, 4), metrics: Sequence[str] | None = None, seed: int = 0,
                      workers: int = 1) -> dict:
    """Calibration of the reported SEM for each number of replicates in ``replicates``.

    Runs ``reruns * max(replicates)`` single A/B tests of every parameterization (trial seeds
    ``seed + 1000 * p``), groups them into ``reruns * max(replicates) // R`` trials of ``R``
    replicates, and pairs the trials of each parameterization.

    Returns ``{"by_replicates": {R: {metric: {"sd": ..., "n": ..., "z": [...]}, "all": {...}}},
    "runs": ..., "seconds_per_run": ...}``: ``sd`` is the standard deviation of the pair z-scores
    (1 when calibrated).
    """
    import time

    global _AB
    if not parameterizations:
        raise ValueError("parameterizations: expected at least one")
    if isinstance(reruns, bool) or not isinstance(reruns, int) or reruns < 2:
        raise ValueError(f"reruns: expected an int >= 2, got {reruns!r}")
    reps = sorted({int(r) for r in replicates})
    if not reps or reps[0] < 1:
        raise ValueError(f"replicates: expected positive ints, got {list(replicates)!r}")
    per = reruns * reps[-1]
    metrics = list(metrics) if metrics is not None else None
    jobs = [(p, dict(params), seed + 1000 * p, per) for p, params in enumerate(parameterizations)]
    start = time.perf_counter()
    _AB = ab_test
    try:
        if workers > 1:
            import multiprocessing as mp

            with mp.get_context("fork").Pool(workers) as pool:
                results = dict(pool.imap_unordered(_runs, jobs))
        else:
            results = dict(_runs(j) for j in jobs)
    finally:
        _AB = None
    elapsed = time.perf_counter() - start
    runs = [results[p] for p in range(len(jobs))]
    if metrics is None:
        metrics = sorted(runs[0][0])
    out: dict = {"by_replicates": {}, "runs": per * len(jobs), "seconds_per_run": elapsed * max(1, workers) / (per * len(jobs))}
    for R in reps:
        entry: dict = {}
        pooled: list[float] = []
        for metric in metrics:
            z: list[float] = []
            for single in runs:
                trials = [combine_replicates(single[k * R:(k + 1) * R])[0] for k in range(per // R)]
                z += pair_z_scores(trials, metric)
            pooled += z
            entry[metric] = {"sd": float(np.sqrt(np.mean(np.square(z)))) if z else float("nan"), "n": len(z), "z": z}
        entry["all"] = {"sd": float(np.sqrt(np.mean(np.square(pooled)))) if pooled else float("nan"), "n": len(pooled)}
        out["by_replicates"][R] = entry
    return out


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))
