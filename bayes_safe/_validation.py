"""Input checks shared by every public entry point: fail early, name the argument."""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["as_tensor", "check_finite", "check_in_range", "check_positive", "check_positive_int", "check_probability",
           "trusted_inputs"]

import contextlib

#: True inside ``trusted_inputs``: value checks (NaN/inf scans) on data produced by the
#: library itself are skipped; shape checks still run.
TRUSTED = False


@contextlib.contextmanager
def trusted_inputs():
    """Skip per-element value checks for data the library produced itself (simulation loops).

    A NaN scan is two tensor operations; in a simulation loop of 4x4 posteriors that is a
    fifth of the step. Data from users (``model.update`` called directly, logged data, CLI
    arguments) is always checked.
    """
    global TRUSTED
    old, TRUSTED = TRUSTED, True
    try:
        yield
    finally:
        TRUSTED = old


def as_tensor(value, name: str, dtype=torch.float64) -> torch.Tensor:
    """Convert ``value`` to a tensor of ``dtype``; raise TypeError naming ``name`` if impossible."""
    try:
        t = torch.as_tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as exc:  # pragma: no cover - message path
        raise TypeError(f"{name}: expected a tensor or array of numbers, got {type(value).__name__}") from exc
    return t


def check_finite(t: torch.Tensor, name: str) -> torch.Tensor:
    if TRUSTED:
        return t
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name}: expected finite values, found {bad} NaN or inf entries (shape {list(t.shape)})")
    return t


def check_positive_int(value, name: str, allow_none: bool = False) -> int | None:
    """``value`` as a Python ``int`` if it is an integer >= 1 (``bool`` is not; numpy integers
    are), ``None`` if allowed; else a ``ValueError`` naming ``name``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"{name}: expected a positive int{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def check_positive(value, name: str) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return v


def check_in_range(value, name: str, low: float, high: float, *, low_open=False, high_open=True) -> float:
    v = float(value)
    ok_low = v > low if low_open else v >= low
    ok_high = v < high if high_open else v <= high
    if not (math.isfinite(v) and ok_low and ok_high):
        lb = "(" if low_open else "["
        rb = ")" if high_open else "]"
        raise ValueError(f"{name}: expected a value in {lb}{low}, {high}{rb}, got {value!r}")
    return v


def check_probability(value, name: str) -> float:
    return check_in_range(value, name, 0.0, 1.0, low_open=True, high_open=True)
