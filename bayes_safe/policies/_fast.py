"""The common case of ``select`` / ``update`` inputs, checked in a few comparisons (issue 27).

A user's own loop over one stream calls ``policy.select`` and ``policy.update`` once per
decision with float64 tensors of the model's shapes. ``check_select_inputs`` and
``check_update_inputs`` accept anything convertible and say what is wrong; here only inputs they
would accept *unchanged* are recognised (the same tensors come back, the same value scans run),
and anything else returns ``None`` so that the caller runs the general check, which converts or
raises its usual error. The expected shapes come from the models (``_model_dims``, cached per
model). With the one-reduction NaN scan of ``check_finite`` and the update's single scan (the
model's ``_update_checked``), the public loop at R = 1, K = 100, d = 4 went from 0.33-0.40x to
0.66-0.73x ``simulate``'s lean path in the same run (``benchmarks/single_stream.py``; inside
``torch.inference_mode()``, as ``simulate`` runs, 0.91x). At R = 1 the NaN scans of a row and its
outcome are one Python sum, and the conjugate model decides in buffers
(``BayesianLinear._thompson_argmax``) and learns a row through one view.
"""

from __future__ import annotations

import math
import numbers

import torch

from .. import _validation
from .._validation import check_finite
from .base import _model_dims

_F64 = torch.float64
_LONG = torch.long


def dims(models) -> tuple[int | None, int | None, int | None]:
    """``(R, K, d)`` the models expect, merged as ``check_select_inputs`` merges them (the first
    model that states each)."""
    R = K = d = None
    for m in models:
        r, k, dd = _model_dims(m)
        R = r if R is None else R
        K = k if K is None else K
        d = dd if d is None else d
    return R, K, d


def select_inputs(features, baseline, valid, expected, *, require_baseline: bool = False, empty_rows_ok: bool = False):
    """``(features, baseline, valid)`` as ``check_select_inputs`` returns them (without ``batch_shape``)
    for float64 tensors ``[R, K, d]`` of the models' ``R`` and ``d`` (or ``[K, d]`` when ``R = 1``),
    a baseline that is None, an int or a long tensor ``[R]`` in range, and ``valid`` None or a bool
    tensor ``[R, K]`` with an allowed action per row; else None."""
    R, num_arms, d = expected
    if type(features) is not torch.Tensor or features.dtype is not _F64 or d is None:
        return None
    if R is None:  # models without a batch shape: the one-stream case, candidates [K, d] only
        if features.dim() != 2:
            return None
        R = 1
    if features.dim() == 2:
        if R != 1 or valid is not None or (baseline is not None and type(baseline) is not int):
            return None
        features = features[None]
    elif features.dim() != 3:
        return None
    r, K, dd = features.shape
    if r != R or dd != d or K < 1 or (num_arms is not None and K != num_arms):
        return None
    trusted = _validation.trusted()
    if baseline is None:
        if require_baseline:
            return None
    elif type(baseline) is int:
        if not 0 <= baseline < K:
            return None
        baseline = torch.full((R,), baseline, dtype=_LONG, device=features.device)
    elif type(baseline) is torch.Tensor and baseline.dtype is _LONG and baseline.shape == (R,):
        if not trusted:
            if R == 1:
                if not 0 <= baseline.item() < K:
                    return None
            elif R <= 64:
                if not all(0 <= b < K for b in baseline.tolist()):
                    return None
            elif bool(((baseline < 0) | (baseline >= K)).any()):
                return None
    elif isinstance(baseline, numbers.Integral) and not isinstance(baseline, bool):
        return None  # numpy integers and the like: the general check converts them
    else:
        return None
    if valid is not None:
        if type(valid) is not torch.Tensor or valid.dtype is not torch.bool or valid.shape != (R, K):
            return None
        if not empty_rows_ok and not trusted and not bool(valid.any(-1).all()):
            return None
    if not trusted and not math.isfinite(features.sum().item()):
        # check_finite's one reduction, inline (a finite sum proves every entry finite); a non-finite one
        # is looked at entry by entry there, and named
        check_finite(features, "features")
    return features, baseline, valid


def update_inputs(features_chosen, reward, constraints, expected, num_constraints: int = 0):
    """``(features_chosen, reward, constraints)`` as ``check_update_inputs`` returns them, for float64
    tensors ``[R, d]`` and ``[R]`` (and ``[R, C]`` constraints when the policy learns ``C``) of the
    models' ``R`` and ``d``, or one observation ``[d]`` with a float reward when ``R = 1``; else None."""
    R, _, d = expected
    if R is None and d is not None:  # models without a batch shape: the one-stream case, one row [1, d] or [d]
        R = 1
    if type(features_chosen) is not torch.Tensor or features_chosen.dtype is not _F64 or d is None:
        return None
    if features_chosen.dim() == 1:
        if R != 1 or num_constraints or features_chosen.shape[0] != d:
            return None
        if type(reward) is float:
            reward = torch.tensor([reward], dtype=_F64, device=features_chosen.device)
        elif type(reward) is torch.Tensor and reward.dtype is _F64 and reward.dim() == 0:
            reward = reward[None]
        else:
            return None
        features_chosen = features_chosen[None]
    elif features_chosen.shape != (R, d) or type(reward) is not torch.Tensor or reward.dtype is not _F64 or reward.shape != (R,):
        return None
    if num_constraints and (type(constraints) is not torch.Tensor or constraints.dtype is not _F64
                            or constraints.shape != (R, num_constraints)):
        return None
    # one stream: the few numbers read in Python, one sum (a finite sum proves every entry finite, as
    # check_finite's reduction does; 1 us against 3 for the two scans); otherwise, or when the sum is
    # not finite, the scans themselves, which name the argument
    if not _validation.trusted() and (R != 1 or not math.isfinite(
            sum(features_chosen.tolist()[0]) + reward.item() + (sum(constraints.tolist()[0]) if num_constraints else 0.0))):
        check_finite(features_chosen, "features_chosen")
        check_finite(reward, "reward")
        if num_constraints:
            check_finite(constraints, "constraints")
    return features_chosen, reward, constraints


def update_model(model, X: torch.Tensor, y: torch.Tensor, actions) -> None:
    """``model.update(X, y, actions=actions)`` for inputs checked above: a model that offers
    ``_update_checked`` (the conjugate ``BayesianLinear``) skips its own second scan of them."""
    checked = getattr(model, "_update_checked", None)
    if checked is not None:
        checked(X, y)
    else:
        model.update(X, y, actions=actions)
