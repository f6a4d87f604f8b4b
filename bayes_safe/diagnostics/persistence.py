"""Saving and loading a run's fitted models: ``save_models``, ``save_no_models``, ``load_models``, ``load_policy``.

What ``bayes-safe simulate`` and the studies write to ``RUN_DIR/models/`` and ``diagnose_run``
reads back, in the portable state format of ``bayes_safe.state``: each file is a pair
``NAME.json`` (configuration) + ``NAME.safetensors`` (tensors), and loading never executes code
from the directory. Directories of the old pickle format (``*.pt``) are refused with one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._validation import check_positive_int
from ..state import StateError, can_save, load_file, read_kind, save_models_file, save_policy_config
from ..state._format import read_header
from ._common import _underlying

__all__ = ["NO_MODELS_FILE", "POLICY_SUFFIX", "load_models", "load_policy", "save_models", "save_no_models"]

#: written to a models directory by a run that fits no posterior (see ``save_no_models``)
NO_MODELS_FILE = "NO_MODELS.txt"
#: the file of a policy's own configuration: ``<prefix>__policy.json`` (``policy.json`` without a prefix)
POLICY_SUFFIX = "policy"
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

    One state per model, ``<prefix>__<role>.json`` with its tensors in
    ``<prefix>__<role>.safetensors`` (``<role>.json`` without a prefix), each file written
    atomically. Models that are views of one posterior (TS-ASC's reward and constraint views of
    one ``ProbitGP``) are saved together, once, as ``<prefix>__<role1>+<role2>.json``, so
    ``load_models`` gives them back sharing it. A run that saves several policies gives each its
    own ``prefix`` (e.g. ``("alpha=0.01", "TS-ASC")`` -> ``alpha=0.01__TS-ASC__reward.json``).

    When ``source`` is a policy of a saveable type (``bayes_safe.state.SAVEABLE_POLICIES``), its
    own configuration (alpha, delta, bounds, mode, running sums) is saved too, as
    ``<prefix>__policy.json`` (``policy.json`` without a prefix), referring to the model files;
    ``load_policy`` rebuilds the policy from it.

    Probit GPs keep at most ``max_observations`` stored rows if given (evenly spaced) and none of
    their per-decision draw state; the policy itself is left untouched.

    Args:
        source: a policy (its ``models()``) or a mapping ``{role: model}``.
        directory: created if missing.
        prefix: a name, or parts joined by ``__``; characters other than letters, digits and
            ``. = -`` become ``_``.
        max_observations: keep at most this many stored observations of each probit GP.

    Returns:
        the JSON paths written (each with its ``.safetensors`` beside it).

    Raises:
        TypeError: a model of a type the state format cannot save (the message lists those it can).
    """
    is_policy = callable(getattr(source, "models", None))
    models = source.models() if is_policy else source
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
    lead = stem + "__" if stem else ""
    paths, saved_as = [], {}
    for roles in groups.values():
        names = [_name_part(r, "role") for r in roles]
        path = directory / f"{lead}{'+'.join(names)}.json"
        save_models_file({n: models[r] for n, r in zip(names, roles)}, path, max_observations=max_observations)
        saved_as.update({r: f"{lead}{n}" for n, r in zip(names, roles)})
        paths.append(path)
    if is_policy and can_save(source):
        path = directory / f"{lead}{POLICY_SUFFIX}.json"
        if path in paths:
            raise ValueError(f"source: a model role named {POLICY_SUFFIX!r} would overwrite the policy's configuration {path.name}")
        paths.append(save_policy_config(source, path, saved_as))
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


def _old_format(directory: Path) -> None:
    old = sorted(p.name for p in directory.glob("*.pt"))
    if old:
        shown = ", ".join(old[:3]) + (f" and {len(old) - 3} more" if len(old) > 3 else "")
        raise ValueError(
            f"{directory}: {shown} saved in the old pickle format (*.pt), which bayes_safe no longer loads because "
            "unpickling can execute code; re-run the command or study that wrote them (bayes-safe simulate, "
            "bayes-safe study run) to save them in the portable format (.json + .safetensors)"
        )


def _model_files(directory: Path) -> dict[Path, list[str]]:
    """``{json file: [keys it holds]}`` for the model states of ``directory`` (JSON headers only)."""
    out = {}
    for f in sorted(directory.glob("*.json")):
        _, header = read_header(f)
        if header["kind"] == "policy-config":
            continue
        if header["kind"] == "models":
            roles = header["object"].get("roles")
            if not isinstance(roles, dict):
                raise StateError(f"{f}: field 'object.roles' must map roles to models")
            prefix = f.stem.rsplit("__", 1)[0] if "__" in f.stem else ""
            out[f] = [f"{prefix}__{role}" if prefix else role for role in roles] if len(roles) > 1 else [f.stem]
        elif header["kind"] == "model":
            out[f] = [f.stem]
        else:
            raise StateError(f"{f}: a saved {header['kind']} in a models directory; expected models saved by save_models")
    return out


def _load_one(path: Path, keys: list[str], allow_imports: bool) -> dict[str, object]:
    kind, obj = load_file(path, allow_imports=allow_imports)
    if kind == "model":
        return {keys[0]: obj}
    return dict(zip(keys, obj.values()))


def load_models(directory, *, allow_imports: bool = False) -> dict[str, object]:
    """The models saved by ``save_models``, keyed ``<prefix>__<role>`` (or ``<role>``).

    Views saved together share their posterior again. Nothing from the directory is executed:
    the files are JSON and safetensors, checked before any object is built.

    Args:
        directory: a run's ``models/`` directory.
        allow_imports: import the modules of priors saved as ``module:function`` (runs their code;
            only for directories whose code you trust).

    Returns:
        ``{name: model}`` in file-name order.

    Raises:
        FileNotFoundError: ``directory`` holds no saved model (the message names it, with the
            reason a run recorded by ``save_no_models``, if any).
        ValueError: a file of the old pickle format (``*.pt``: one line, nothing is unpickled), or
            a state file that is not valid (``bayes_safe.state.StateError``, naming the file).
    """
    directory = Path(directory)
    if directory.is_dir():
        _old_format(directory)
    index = _model_files(directory) if directory.is_dir() else {}
    if not index:
        marker = directory / NO_MODELS_FILE
        if marker.is_file():
            raise FileNotFoundError(f"{directory}: no saved models: {marker.read_text().strip()}")
        raise FileNotFoundError(
            f"{directory}: no saved models (*.json with *.safetensors); runs write them to RUN_DIR/models/ "
            "(bayes-safe simulate and the studies do)"
        )
    out: dict[str, object] = {}
    for path, keys in index.items():
        out.update(_load_one(path, keys, allow_imports))
    return out


def load_policy(directory, prefix: str | Sequence[str] | None = None, *, allow_imports: bool = False):
    """The policy ``save_models`` saved under ``prefix``: its configuration with its models.

    Args:
        directory: a run's ``models/`` directory.
        prefix: the ``prefix`` given to ``save_models`` (``None``: none).
        allow_imports: as for ``load_models``.

    Returns:
        the policy (e.g. a ``TSASC`` with its alpha and its fitted models), ready to ``select``
        and ``update``.
    """
    directory = Path(directory)
    if directory.is_dir():
        _old_format(directory)
    parts = [] if prefix is None else [prefix] if isinstance(prefix, str) else list(prefix)
    stem = "__".join(_name_part(p, "prefix") for p in parts)
    path = directory / f"{stem + '__' if stem else ''}{POLICY_SUFFIX}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no saved policy configuration (save_models writes one for a policy source)")
    if read_kind(path) != "policy-config":
        raise StateError(f"{path}: not a policy configuration (kind {read_kind(path)!r})")
    where = {key: f for f, keys in _model_files(directory).items() for key in keys}
    loaded: dict[Path, dict] = {}

    def resolve(key, at):
        if not isinstance(key, str) or key not in where:
            raise StateError(f"{path}: {at}: refers to the model {key!r}, which no file of {directory} holds")
        f = where[key]
        if f not in loaded:
            keys = [k for k, g in where.items() if g == f]
            loaded[f] = _load_one(f, keys, allow_imports)
        return loaded[f][key]

    _kind, policy = load_file(path, allow_imports=allow_imports, resolve=resolve)
    return policy
