"""Decisions per second of Thompson sampling with a shared-weight linear posterior.

Problem: 100 arms in R^4 (the ``kazerouni2017-neurips`` preset), one decision = select
(posterior draw, scores of all arms, argmax) + observe + update. Compared with a plain numpy
loop that refactors the 4x4 precision every step (the reference the issue names).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from bayes_safe import simulate
from bayes_safe.envs import kazerouni2017_neurips
from bayes_safe.factory import make_policy

TARGET_R1 = 20_000
TARGET_R1000 = 1_000_000


def numpy_reference(replications: int, steps: int, seed: int = 0, num_arms: int = 100, dim: int = 4) -> float:
    """Decisions/s of a numpy TS loop batched over replications with numpy's stacked linalg
    (``[R, d, d]`` Cholesky and solves, ``[R, K, d]`` scores; ``benchmarks/scaling.py`` has the
    plain one-replication loop)."""
    rng = np.random.default_rng(seed)
    R, K, d, sigma = replications, num_arms, dim, 1.0
    X = rng.standard_normal((R, K, d))
    theta = rng.standard_normal((R, d))
    prec = np.repeat(np.eye(d)[None], R, 0)
    b = np.zeros((R, d))
    rows = np.arange(R)
    start = time.perf_counter()
    for _ in range(steps):
        L = np.linalg.cholesky(prec)
        mean = np.linalg.solve(prec, b[..., None])[..., 0]
        z = rng.standard_normal((R, d))
        w = mean + np.linalg.solve(np.swapaxes(L, -1, -2), z[..., None])[..., 0]
        a = np.argmax(np.einsum("rkd,rd->rk", X, w), -1)
        x = X[rows, a]
        y = np.einsum("rd,rd->r", x, theta) + sigma * rng.standard_normal(R)
        prec += x[:, :, None] * x[:, None, :]
        b += x * y[:, None]
    return R * steps / (time.perf_counter() - start)


def bayes_safe_rate(replications: int, steps: int, seed: int = 0) -> float:
    env = kazerouni2017_neurips(replications=replications, seed=seed)
    trace = simulate(make_policy("ts", env), env, steps, seed=seed + 1)
    return trace.attrs["decisions_per_second"]


def run(quick: bool = False, repeats: int = 5) -> list[dict]:
    repeats = 3 if quick else repeats
    torch.set_num_threads(1)
    rows = []
    for R, steps, target in ((1, 2_000 if quick else 10_000, TARGET_R1), (1000, 100 if quick else 400, TARGET_R1000)):
        ours = statistics.median(bayes_safe_rate(R, steps, seed=i) for i in range(repeats))
        ref = statistics.median(numpy_reference(R, steps, seed=i) for i in range(repeats))
        rows.append({"benchmark": f"TS linear, 100 arms d=4, R={R}: bayes_safe", "value": ours, "unit": "decisions/s",
                     "target": f">= {target:,}", "ratio": ours / target, "vs_numpy": ours / ref})
        rows.append({"benchmark": f"TS linear, 100 arms d=4, R={R}: numpy reference", "value": ref,
                     "unit": "decisions/s", "target": "", "ratio": None, "vs_numpy": 1.0})
    return rows
