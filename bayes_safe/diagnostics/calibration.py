"""Calibration of Bernoulli models and coverage of credible intervals.

``brier_score``, ``expected_calibration_error`` and ``reliability_diagram`` compare predicted
probabilities ``p [n]`` with 0/1 outcomes ``y [n]``; ``interval_coverage`` checks, on simulated
problems whose truth is known, that central credible intervals cover it as often as their level
says. Matplotlib is imported only by ``reliability_diagram``.
"""

from __future__ import annotations

import torch

from ._common import _np

__all__ = ["brier_score", "expected_calibration_error", "interval_coverage", "reliability_diagram"]


def _check_probs(p, y):
    p = torch.as_tensor(p, dtype=torch.float64).reshape(-1)
    y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"p, y: expected the same number of entries, got {p.numel()} and {y.numel()}")
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError("p: expected probabilities in [0, 1]")
    if not bool(((y == 0) | (y == 1)).all()):
        raise ValueError("y: expected binary outcomes in {0, 1}")
    return p, y


def brier_score(p, y) -> float:
    """Mean squared difference between predicted probabilities and 0/1 outcomes."""
    p, y = _check_probs(p, y)
    return float(((p - y) ** 2).mean())


def _bins(p, y, num_bins):
    edges = torch.linspace(0, 1, num_bins + 1, dtype=torch.float64)
    idx = torch.clamp(torch.bucketize(p, edges[1:-1], right=True), 0, num_bins - 1)
    count = torch.bincount(idx, minlength=num_bins).to(torch.float64)
    conf = torch.bincount(idx, weights=p, minlength=num_bins) / count.clamp_min(1)
    acc = torch.bincount(idx, weights=y, minlength=num_bins) / count.clamp_min(1)
    return edges, count, conf, acc


def expected_calibration_error(p, y, num_bins: int = 10) -> float:
    """ECE: ``sum_b (n_b / n) |mean(y in b) - mean(p in b)|`` over equal-width probability bins."""
    p, y = _check_probs(p, y)
    _, count, conf, acc = _bins(p, y, int(num_bins))
    return float((count / count.sum() * (acc - conf).abs()).sum())


def reliability_diagram(p, y, num_bins: int = 10, path=None, title: str = "Reliability diagram"):
    """Observed frequency against mean predicted probability per bin (matplotlib figure)."""
    from ..plots import plt, save_figure

    p, y = _check_probs(p, y)
    _, count, conf, acc = _bins(p, y, int(num_bins))
    keep = count > 0
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.plot(_np(conf[keep]), _np(acc[keep]), "o-", label="model")
    ax.set(xlabel="mean predicted probability", ylabel="observed frequency", title=title, xlim=(0, 1), ylim=(0, 1))
    ax.legend()
    ax.grid(alpha=0.3)
    if path is not None:
        save_figure(fig, path)
    return fig



def interval_coverage(draws: torch.Tensor, truth: torch.Tensor, level: float = 0.9) -> torch.Tensor:
    """Share of replications whose central ``level`` credible interval covers the truth.

    Args:
        draws: posterior draws ``[S, R, ...]`` (S draws, R replications).
        truth: true values ``[R, ...]``.
        level: the interval's probability in (0, 1).

    Returns:
        coverage per parameter, ``[...]``: close to ``level`` for a calibrated posterior.
    """
    if not 0 < level < 1:
        raise ValueError(f"level: expected a value in (0, 1), got {level}")
    draws = torch.as_tensor(draws, dtype=torch.float64)
    truth = torch.as_tensor(truth, dtype=torch.float64)
    if tuple(draws.shape[1:]) != tuple(truth.shape):
        raise ValueError(f"draws, truth: expected draws [S, *{list(truth.shape)}], got {list(draws.shape)}")
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(draws, q, dim=0)
    return ((truth >= lo) & (truth <= hi)).double().mean(0)
