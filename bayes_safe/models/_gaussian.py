"""Gaussian helpers the linear engines share: the parameters of a Gaussian prior, the check that a
prior covers R^d, and a Cholesky factor with escalating jitter.

They sit below ``linear.py`` (the facade that picks an engine) and the engines (``gibbs.py``,
``pyro_inference.py``, ``probit_gp.py``), which all import them from here: no engine imports the
facade back.
"""

from __future__ import annotations

import torch
import torch.distributions as tdist

__all__ = ["check_real_support", "cholesky", "gaussian_prior_parameters"]

_DTYPE = torch.float64


def gaussian_prior_parameters(prior) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(loc [*pb, d], covariance [*pb, d, d])`` of a Gaussian prior, or ``None`` if not Gaussian.

    Recognises ``MultivariateNormal`` and ``Independent(Normal, 1)`` (what
    ``Normal(loc, scale).expand([d]).to_event(1)`` builds).
    """
    if isinstance(prior, tdist.MultivariateNormal):
        return prior.loc.to(_DTYPE), prior.covariance_matrix.to(_DTYPE)
    if (
        isinstance(prior, tdist.Independent)
        and isinstance(prior.base_dist, tdist.Normal)
        and prior.reinterpreted_batch_ndims == 1
    ):
        loc = prior.base_dist.loc.to(_DTYPE)
        var = prior.base_dist.scale.to(_DTYPE) ** 2
        loc, var = torch.broadcast_tensors(loc, var)
        return loc, torch.diag_embed(var)
    return None


def check_real_support(prior, name: str = "prior") -> None:
    """Raise ``ValueError`` unless the distribution ``prior`` is supported on all of ``R^d``.

    The weights ``w`` of ``y = x^T w + noise`` take any real value, so a prior on them must put
    its mass on the whole real line in every coordinate: ``Normal``, ``Laplace``,
    ``StudentT``, ``Cauchy`` (each ``.expand([d]).to_event(1)``), ``MultivariateNormal``,
    ``LowRankMultivariateNormal``. A prior on a subset (``Gamma``, ``HalfCauchy``, ``Beta``,
    ``Uniform``, ``Dirichlet``, a discrete distribution) is rejected with a message naming
    ``name`` and the support found. A distribution that does not declare its support is
    accepted (it cannot be checked).

    Args:
        prior: a ``torch`` / ``pyro`` distribution with event shape ``[d]``.
        name: the argument (or Pyro site) named in the error message.
    """
    try:
        support = prior.support
    except NotImplementedError:
        return
    base = support
    while isinstance(base, tdist.constraints.independent):
        base = base.base_constraint
    if isinstance(base, type(tdist.constraints.real)) and not support.is_discrete:
        return
    raise ValueError(
        f"{name}: its support is {support}, but linear weights take any real value; use a prior on R^d "
        "(e.g. Normal, Laplace, StudentT or Cauchy .expand([d]).to_event(1), MultivariateNormal), or a callable "
        "Pyro model whose positive hyperparameters scale unconstrained weights (e.g. a horseshoe)"
    )


#: off the CPU, each device's flag of a factor that failed even with jitter (a bool tensor on the device,
#: OR-ed without a read of device memory; ``check_device_factors`` reads it once, after a run)
_DEVICE_FAILURES: dict[torch.device, torch.Tensor] = {}

#: the one jitter off the CPU, relative to the mean diagonal (the CPU escalates 1e-10 .. 1e-4)
DEVICE_JITTER = 1e-6


def _device_cholesky(matrix: torch.Tensor) -> torch.Tensor:
    """The factor of every matrix of a batch off the CPU, without a read of device memory (issue 46:
    no host synchronisation per step). A matrix whose factor fails is refactored with one jitter
    (``DEVICE_JITTER`` x its mean diagonal, at least 1) in a second batched call that changes no other
    matrix (their jitter is 0, so their factors are the same numbers); one that fails even then is
    recorded in ``_DEVICE_FAILURES``, which ``check_device_factors`` raises on after a run."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    bad = info != 0  # [*batch]
    scale = matrix.diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1.0)
    jitter = torch.where(bad, DEVICE_JITTER * scale, torch.zeros_like(scale))
    repaired, info = torch.linalg.cholesky_ex(torch.diagonal_scatter(
        matrix, matrix.diagonal(dim1=-2, dim2=-1) + jitter[..., None], dim1=-2, dim2=-1))
    flag = (info != 0).any()
    seen = _DEVICE_FAILURES.get(matrix.device)
    _DEVICE_FAILURES[matrix.device] = flag if seen is None else seen | flag
    return torch.where(bad[..., None, None], repaired, factor)


def check_device_factors(device: torch.device | str) -> None:
    """Raise ``LinAlgError`` if a factor made on ``device`` (off the CPU) since the last check failed even
    with jitter (one read of device memory; ``simulate`` calls it after its loop); clears the flag."""
    device = torch.device(device)
    flag = _DEVICE_FAILURES.pop(device, None)
    if flag is not None and bool(flag):
        raise torch.linalg.LinAlgError(
            f"posterior precision is not positive definite even with jitter {DEVICE_JITTER:g} x its mean diagonal "
            f"on {device} (the CPU escalates to 1e-4); rerun on the CPU or with a larger prior precision")


def cholesky(matrix: torch.Tensor) -> torch.Tensor:
    """Cholesky factor with escalating jitter if a matrix is numerically not positive definite.

    Off the CPU, a batch of matrices is factored by ``_device_cholesky``: no read of device memory,
    one jitter for the matrices that need it, and a failure even then raised after the run
    (``check_device_factors``)."""
    if matrix.device.type != "cpu" and matrix.shape[:-2].numel() > 1:
        return _device_cholesky(matrix)
    if matrix.shape[:-2].numel() == 1:
        # one matrix: reading the flag of cholesky_ex is cheaper than cholesky's own check (measured
        # 2.1 us vs 3.5 us for 4 x 4); the same factor
        factor, info = torch.linalg.cholesky_ex(matrix)
        if not info.item():
            return factor
    else:
        try:
            return torch.linalg.cholesky(matrix)  # raises on failure: no extra check op on the hot path
        except torch.linalg.LinAlgError:
            pass
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    scale = matrix.diagonal(dim1=-2, dim2=-1).abs().mean().clamp_min(1.0)
    for jitter in (1e-10, 1e-8, 1e-6, 1e-4):
        factor, info = torch.linalg.cholesky_ex(matrix + jitter * scale * eye)
        if not bool(info.any()):
            return factor
    raise torch.linalg.LinAlgError("posterior precision is not positive definite even with jitter")
