"""Forgetting's row weights and a Gaussian likelihood's discounted and restarted statistics, shared by
the linear engines that keep rows (issues 30 and 43): the Gibbs and Langevin chains and the NUTS / SVI
fits. A module of its own, below all of them."""

from __future__ import annotations

import math

import torch

_DTYPE = torch.float64

__all__ = ["discount_statistics", "forgetting_weights", "restart_statistics"]


def forgetting_weights(lam: float, n: int, device: torch.device | str | None = None) -> tuple[int, torch.Tensor]:
    """``(start, weights [n - start])``: the weight ``lam^(n - 1 - i)`` of row ``i`` of ``n`` (the last
    row weighs 1), for rows ``start .. n``. Rows whose weight is below ``2^-60`` are left out
    (``start > 0``): all of them together weigh less than ``2^-60 / (1 - lam)`` rows, so a chain's cost
    stops growing after about ``42 / (1 - lam)`` rows. A function of ``(lam, n)`` only: nothing to save.
    The weights are made on ``device`` (the engine's; default the CPU), float64."""
    device = torch.device("cpu") if device is None else device
    if lam >= 1.0:
        return 0, torch.ones(n, dtype=_DTYPE, device=device)
    keep = min(n, math.floor(60.0 * math.log(2.0) / -math.log(lam)) + 1)
    return n - keep, lam ** torch.arange(keep - 1, -1, -1, dtype=_DTYPE, device=device)


def discount_statistics(xtx: torch.Tensor, xty: torch.Tensor, yty: torch.Tensor, X: torch.Tensor, y: torch.Tensor,
                        lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Gaussian likelihood's sufficient statistics after ``n`` new rows ``X [*b, n, d]``, ``y [*b, n]``
    under forgetting at ``lam``: new row ``i`` weighs ``lam^(n-1-i)`` and what came before ``lam^n``.
    Returns ``(X^T W X, X^T W y, y^T W y, w [n])`` with the old statistics discounted (the Gibbs and
    Langevin engines' exact update of the weighted likelihood)."""
    n = X.shape[-2]
    w = lam ** torch.arange(n - 1, -1, -1, dtype=_DTYPE, device=X.device)
    old = lam**n
    return (old * xtx + (X * w[:, None]).mT @ X, old * xty + (X.mT @ (w * y)[..., None])[..., 0],
            old * yty + (w * y * y).sum(-1), w)


def restart_statistics(xtx: torch.Tensor, xty: torch.Tensor, yty: torch.Tensor, n_eff: torch.Tensor,
                       alarm: torch.Tensor, keep: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Gaussian likelihood's sufficient statistics ``X^T X [*b, d, d]``, ``X^T y [*b, d]``, ``y^T y [*b]``
    and weighed row count ``n_eff [*b]`` after adaptive forgetting restarts the elements ``alarm [*b]``:
    theirs multiplied by ``keep`` (the old likelihood raised to ``keep``, exactly), the others' unchanged
    (the Gibbs and Langevin engines' restart)."""
    a2, a3 = alarm[..., None], alarm[..., None, None]
    return (torch.where(a3, keep * xtx, xtx), torch.where(a2, keep * xty, xty),
            torch.where(alarm, keep * yty, yty), torch.where(alarm, keep * n_eff, n_eff))
