"""Metrics computed from a ``Trace`` (Daulton 2019 s.4; Kazerouni 2017 eq. 3)."""

from __future__ import annotations

import torch

from .trace import Trace

__all__ = [
    "cumulative_constraint_satisfied",
    "cumulative_regret",
    "mean_and_sem",
    "moving_average",
    "normalized_constraint",
    "summary",
    "violation_rate",
]


def mean_and_sem(x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error of the mean over ``dim`` (replications)."""
    n = x.shape[dim]
    mean = x.mean(dim)
    sem = x.std(dim) / n**0.5 if n > 1 else torch.zeros_like(mean)
    return mean, sem


def cumulative_regret(trace: Trace) -> torch.Tensor:
    """``[T, R]`` cumulative pseudo-regret (Kazerouni eq. 2)."""
    return trace.regret.cumsum(0)


def moving_average(x: torch.Tensor, window: int) -> torch.Tensor:
    """Trailing moving average over the first (step) dimension with ``window`` steps; ``[T, ...]``."""
    if window < 1:
        raise ValueError(f"window: expected >= 1, got {window}")
    x = x.to(torch.float64)
    c = torch.cat([torch.zeros_like(x[:1]), x.cumsum(0)])
    t = torch.arange(1, x.shape[0] + 1)
    lo = (t - window).clamp_min(0)
    n = (t - lo).to(torch.float64).reshape(-1, *([1] * (x.dim() - 1)))
    return (c[t] - c[lo]) / n


def violation_rate(trace: Trace, window: int = 100) -> torch.Tensor:
    """Moving average of the instance-level violation indicator, ``[T, R]`` (Daulton Figure 1b);
    NaN when the problem gave no expected outcomes (violations unknown)."""
    if not trace.regret_available:
        return torch.full(trace.violation.shape, float("nan"), dtype=torch.float64)
    return moving_average(trace.violation, window)


def cumulative_constraint_satisfied(trace: Trace, metric: int = 0, alpha: float | None = None) -> torch.Tensor:
    """Kazerouni eq. (3), ``sum_i E[m | a_i] >= (1 - alpha) sum_i E[m | b_i]`` at every step: ``[T, R]`` bool.

    ``metric=0`` checks the reward (CLUCB); ``metric=1`` the constraint metric (CLUCB2-ASC-C).
    """
    alpha = trace.alpha if alpha is None else alpha
    if alpha is None:
        raise ValueError("alpha: the trace has no alpha; pass one")
    played = trace.expected[..., metric].cumsum(0)
    base = trace.baseline_expected[..., metric].cumsum(0)
    return played >= (1 - alpha) * base


def normalized_constraint(trace: Trace, metric: int = 1) -> torch.Tensor:
    """Expected constraint value of the played action over the baseline's, ``[T, R]`` (Daulton Fig. 2b)."""
    return trace.expected[..., metric] / trace.baseline_expected[..., metric]


def summary(trace: Trace) -> dict:
    """Headline numbers of a run, as plain floats (mean and SEM over replications).

    When the problem gave no expected outcomes (``trace.regret_available`` False), the regret,
    violation and normalized-constraint entries are ``None`` (unavailable), never 0.
    """
    if not trace.regret_available:
        out = {"horizon": trace.horizon, "replications": trace.replications, "regret_available": False,
               "final_cumulative_regret_mean": None, "final_cumulative_regret_sem": None,
               "mean_per_step_regret": None, "violation_rate": None}
        if trace.alpha is not None:
            out["alpha"] = float(trace.alpha)
        if len(trace.metric_names) > 1:
            out["normalized_constraint_last100_mean"] = None
            out["normalized_constraint_last100_sem"] = None
        for k in ("elapsed_seconds", "decisions_per_second"):
            if k in trace.attrs:
                out[k] = float(trace.attrs[k])
        return out
    cum = cumulative_regret(trace)[-1]
    m, s = mean_and_sem(cum)
    out = {
        "horizon": trace.horizon,
        "replications": trace.replications,
        "final_cumulative_regret_mean": float(m),
        "final_cumulative_regret_sem": float(s),
        "mean_per_step_regret": float(trace.regret.mean()),
        "violation_rate": float(trace.violation.double().mean()),
    }
    if trace.alpha is not None:
        out["alpha"] = float(trace.alpha)
    if len(trace.metric_names) > 1:
        last = normalized_constraint(trace)[-min(100, trace.horizon):].mean(0)
        m, s = mean_and_sem(last)
        out["normalized_constraint_last100_mean"] = float(m)
        out["normalized_constraint_last100_sem"] = float(s)
    for k in ("elapsed_seconds", "decisions_per_second"):
        if k in trace.attrs:
            out[k] = float(trace.attrs[k])
    return out
