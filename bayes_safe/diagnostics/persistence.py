"""Saving and loading a run's fitted models: ``save_models``, ``save_no_models``, ``load_models``.

What ``bayes-safe simulate`` and the studies write to ``RUN_DIR/models/`` and ``diagnose_run``
reads back. Files are pickles (``torch.save``): load only directories you wrote yourself.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from .._validation import check_positive_int
from ..io import atomic_write
from ._common import _probit_types, _underlying

__all__ = ["NO_MODELS_FILE", "load_models", "save_models", "save_no_models"]

#: written to a models directory by a run that fits no posterior (see ``save_no_models``)
NO_MODELS_FILE = "NO_MODELS.txt"
_SHARED_KEY = "__roles__"
_BAD_NAME = re.compile(r"[^A-Za-z0-9.=-]+")


def _name_part(text, what: str) -> str:
    """``text`` made safe for a file name: runs of other characters than letters, digits, ``. = -`` become ``_``."""
    out = _BAD_NAME.sub("_", str(text)).strip("_")
    if not out:
        raise ValueError(f"{what}: expected a name with at least one letter or digit, got {text!r}")
    return out


def save_models(source, directory, *, prefix: str | Sequence[str] | None = None,
                max_observations: int | None = None) -> list[Path]:
    """Save the fitted models of a policy (or a ``{role: model}`` mapping) into ``directory``.

    One file per model, ``<prefix>__<role>.pt`` (``<role>.pt`` without a prefix), written
    atomically. Models that are views of one posterior (TS-ASC's reward and constraint views of
    one ``ProbitGP``) are saved together, once, as
    ``<prefix>__<role1>+<role2>.pt``, so ``load_models`` gives them back sharing it. A run
    that saves several policies gives each its own ``prefix`` (e.g. ``("alpha=0.01", "TS-ASC")``
    -> ``alpha=0.01__TS-ASC__reward.pt``).

    Probit GPs are saved as ``compact`` copies (no per-decision
    draw state; at most ``max_observations`` stored rows if given), so the policy itself is
    left untouched.

    Files are pickles: load only files you wrote yourself (``load_models``).

    Args:
        source: a policy (its ``models()``) or a mapping ``{role: model}``.
        directory: created if missing.
        prefix: a name, or parts joined by ``__``; characters other than letters, digits and
            ``. = -`` become ``_``.
        max_observations: keep at most this many stored observations of each probit GP.

    Returns:
        the paths written.
    """
    models = source.models() if callable(getattr(source, "models", None)) else source
    if not isinstance(models, Mapping):
        raise TypeError(f"source: expected a policy (with .models()) or a mapping {{role: model}}, got {type(source).__name__}")
    max_observations = check_positive_int(max_observations, "max_observations", allow_none=True)
    parts = [] if prefix is None else [prefix] if isinstance(prefix, str) else list(prefix)
    stem = "__".join(_name_part(p, "prefix") for p in parts)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    groups: dict[int, list[str]] = {}
    for role in models:
        groups.setdefault(id(_underlying(models[role])), []).append(role)
    compacted: dict[int, object] = {}

    def prepared(model):
        probit = _probit_types()
        if not probit:
            return model
        base = _underlying(model)
        if not isinstance(base, probit[0]):
            return model
        if id(base) not in compacted:
            compacted[id(base)] = base.compact(max_observations)
        if base is model:
            return compacted[id(base)]
        view = copy.copy(model)
        view.model = compacted[id(base)]
        return view

    paths = []
    for roles in groups.values():
        names = [_name_part(r, "role") for r in roles]
        name = "+".join(names)
        path = directory / f"{stem + '__' if stem else ''}{name}.pt"
        if len(roles) == 1:
            payload = prepared(models[roles[0]])
        else:
            payload = {_SHARED_KEY: {n: prepared(models[r]) for n, r in zip(names, roles)}}
        atomic_write(path, functools.partial(torch.save, payload))
        paths.append(path)
    return paths


def save_no_models(directory, reason: str) -> Path:
    """Record in ``directory`` that a run fits no posterior models, and why.

    ``load_models`` (hence ``bayes-safe diagnose``) then fails with ``reason`` in its message
    instead of a bare "no saved models". The ACOL studies use it: their learners keep
    frequentist confidence intervals, not posteriors (Lindner et al. 2022, Propositions 2-3).

    Args:
        directory: the run's ``models/`` directory (created if missing).
        reason: one or more sentences, written to ``directory/NO_MODELS.txt``.

    Returns:
        the path written.
    """
    from ..io import atomic_write_text

    if not str(reason).strip():
        raise ValueError("reason: expected a sentence saying why the run has no posterior models")
    path = Path(directory) / NO_MODELS_FILE
    atomic_write_text(path, str(reason).strip() + "\n")
    return path


def load_models(directory) -> dict[str, object]:
    """The models saved by ``save_models``, keyed ``<prefix>__<role>`` (or ``<role>``).

    Views saved together share their posterior again. Files are unpickled (``torch.load`` with
    ``weights_only=False``): load only directories you wrote yourself.

    Args:
        directory: a run's ``models/`` directory.

    Returns:
        ``{name: model}`` in file-name order.

    Raises:
        FileNotFoundError: ``directory`` holds no saved model (the message names it, with the
            reason a run recorded by ``save_no_models``, if any).
    """
    directory = Path(directory)
    files = sorted(directory.glob("*.pt")) if directory.is_dir() else []
    if not files:
        marker = directory / NO_MODELS_FILE
        if marker.is_file():
            raise FileNotFoundError(f"{directory}: no saved models: {marker.read_text().strip()}")
        raise FileNotFoundError(
            f"{directory}: no saved models (*.pt); runs write them to RUN_DIR/models/ "
            "(bayes-safe simulate and the studies do)"
        )
    out: dict[str, object] = {}
    for f in files:
        obj = torch.load(f, weights_only=False)
        if isinstance(obj, dict) and set(obj) == {_SHARED_KEY}:
            prefix = f.stem.rsplit("__", 1)[0] if "__" in f.stem else ""
            for role, model in obj[_SHARED_KEY].items():
                out[f"{prefix}__{role}" if prefix else role] = model
        else:
            out[f.stem] = obj
    return out
