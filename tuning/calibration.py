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

__all__ = ["inferred_noise_calibration", "noise_calibration", "pair_z_scores", "random_parameterizations"]


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
                      workers: int = 1, keep_trials: bool = False) -> dict:
    """Calibration of the reported SEM for each number of replicates in ``replicates``.

    Runs ``reruns * max(replicates)`` single A/B tests of every parameterization (trial seeds
    ``seed + 1000 * p``), groups them into ``reruns * max(replicates) // R`` trials of ``R``
    replicates, and pairs the trials of each parameterization.

    Returns ``{"by_replicates": {R: {metric: {"sd": ..., "n": ..., "z": [...]}, "all": {...}}},
    "runs": ..., "seconds_per_run": ...}``: ``sd`` is the standard deviation of the pair z-scores
    (1 when calibrated). ``keep_trials`` adds ``"trials": {R: [[trial metrics of each re-run] for
    each parameterization]}`` (for ``inferred_noise_calibration``).
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
    shared = bool(getattr(ab_test.problem, "replicates_share_rows", False))  # a study of logs: one set of rows
    if keep_trials:
        out["trials"] = {R: [[combine_replicates(single[k * R:(k + 1) * R], shared_rows=shared)[0] for k in range(per // R)] for single in runs]
                         for R in reps}
    for R in reps:
        entry: dict = {}
        pooled: list[float] = []
        for metric in metrics:
            z: list[float] = []
            for single in runs:
                trials = [combine_replicates(single[k * R:(k + 1) * R], shared_rows=shared)[0] for k in range(per // R)]
                z += pair_z_scores(trials, metric)
            pooled += z
            entry[metric] = {"sd": float(np.sqrt(np.mean(np.square(z)))) if z else float("nan"), "n": len(z), "z": z}
        entry["all"] = {"sd": float(np.sqrt(np.mean(np.square(pooled)))) if pooled else float("nan"), "n": len(pooled)}
        out["by_replicates"][R] = entry
    return out


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def _inferred_noise_sd(points, values, seed: int) -> float:
    """The observation noise SD a GP infers from one study's trials (``sem=None`` in Ax): BoTorch's
    ``SingleTaskGP`` (Ax's default surrogate) on unit-cube inputs and standardized outcomes, its
    homoskedastic noise fitted by maximum marginal likelihood, in the outcome's own units."""
    import torch
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.input import Normalize
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from bayes_safe.threads import single_thread

    x = torch.tensor(points, dtype=torch.float64)
    y = torch.tensor(values, dtype=torch.float64)[:, None]
    with single_thread():
        torch.manual_seed(seed)
        model = SingleTaskGP(x, y, input_transform=Normalize(x.shape[-1]), outcome_transform=Standardize(1))
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        noise = float(model.likelihood.noise.detach().reshape(-1)[0])
    return math.sqrt(noise) * float(y.std())


def inferred_noise_calibration(result: Mapping, parameterizations: Sequence[Mapping], metrics: Sequence[str],
                               seed: int = 0) -> dict:
    """Calibration of the noise a GP infers itself (``sem=None``) instead of the replicates' SEM.

    ``result`` is ``noise_calibration(..., keep_trials=True)`` on ``parameterizations``. Each
    re-run ``k`` of every parameterization makes one study (one trial per parameterization);
    a ``SingleTaskGP`` with inferred homoskedastic noise is fitted to it (``_inferred_noise_sd``),
    and the re-runs are paired as in ``noise_calibration`` with that noise as every trial's SEM:
    ``z = (m1 - m2) / sqrt(s_k1^2 + s_k2^2)``, SD 1 when the inferred noise is a re-run's.

    Returns ``{R: {metric: {"sd", "n", "noise": [inferred SD of each re-run's study],
    "reported_sem": mean replicate SEM}, "all": {"sd", "n"}}}``.
    """
    names = list(parameterizations[0])
    points = [[float(p[n]) for n in names] for p in parameterizations]
    out: dict = {}
    for R, per_param in result["trials"].items():
        k_runs = min(len(t) for t in per_param)
        entry: dict = {}
        pooled: list[float] = []
        for metric in metrics:
            noise = [_inferred_noise_sd(points, [per_param[p][k][metric][0] for p in range(len(points))], seed + k)
                     for k in range(k_runs)]
            z = []
            for k in range(0, k_runs - 1, 2):
                scale = math.hypot(noise[k], noise[k + 1])
                for p in range(len(points)):
                    if scale > 0:
                        z.append((per_param[p][k][metric][0] - per_param[p][k + 1][metric][0]) / scale)
            pooled += z
            sems = [per_param[p][k][metric][1] for p in range(len(points)) for k in range(k_runs)]
            entry[metric] = {"sd": float(np.sqrt(np.mean(np.square(z)))) if z else float("nan"), "n": len(z),
                             "noise": noise, "reported_sem": float(np.mean(sems))}
        entry["all"] = {"sd": float(np.sqrt(np.mean(np.square(pooled)))) if pooled else float("nan"), "n": len(pooled)}
        out[R] = entry
    return out
