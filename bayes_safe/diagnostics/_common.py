"""Private helpers shared by the diagnostics modules (no public names).

Model types are looked up in ``sys.modules`` rather than imported, so converting a linear model
never imports GPyTorch (probit GP) or the BCTS policy.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import torch


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _feature_names(d: int, names: Sequence[str] | None) -> list[str]:
    if names is None:
        return [f"x{i}" for i in range(d)]
    names = [str(n) for n in names]
    if len(names) != d:
        raise ValueError(f"feature_names: expected {d} names (one per feature), got {len(names)}")
    return names


def _batch_dims(batch_shape) -> list[str]:
    return [f"batch{i}" for i in range(len(batch_shape))]


def _probit_types() -> tuple:
    """``(ProbitGP, SuccessProbability)`` if the probit-GP module is loaded, else ``()``.

    A ProbitGP object can only exist once its module is imported, so checking ``sys.modules``
    avoids importing GPyTorch to convert a linear model.
    """
    mod = sys.modules.get("bayes_safe.models.probit_gp")
    return (mod.ProbitGP, mod.SuccessProbability) if mod is not None else ()


def _cts_type():
    mod = sys.modules.get("bayes_safe.policies.bcts")
    return mod.CTSPosterior if mod is not None else None


def _converter(model) -> str | None:
    """Which converter handles ``model``: ``"linear"``, ``"per_arm"``, ``"cts"``, ``"probit_gp"``,
    ``"own"`` (its own ``to_inference_data`` method) or ``None`` (no converter)."""
    from ..models import BayesianLinear, PerArmLinear

    if isinstance(model, BayesianLinear):
        return "linear"
    if isinstance(model, PerArmLinear):
        return "per_arm"
    cts = _cts_type()
    if cts is not None and isinstance(model, cts):
        return "cts"
    probit = _probit_types()
    if probit and isinstance(model, probit):
        return "probit_gp"
    if callable(getattr(model, "to_inference_data", None)):
        return "own"
    return None


def _underlying(model):
    """The posterior object a model answers from: the ProbitGP of a view, else the model itself."""
    probit = _probit_types()
    if probit and isinstance(model, probit[1]):
        return model.model
    return model
