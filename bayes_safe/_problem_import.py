"""Importing your own problem class by ``module:Class`` (``--problem``, a stored tuning study).

``bayes-safe simulate --problem``, ``bayes-safe tune custom --problem`` and ``tune resume`` (via
``bayes_safe.tuning.ab_test.make_problem``) build a user's ``bayes_safe.envs.Problem`` here: the
class checked against the protocol before it is built, the constructor's arguments checked
against its signature. Every failure is one line naming the option.

Where the module comes from, and who said to run it:

* a ``--problem module:Class`` typed on the command line is the user's consent for that run: the
  module is imported with the current directory first on ``sys.path`` (a console script does
  not put it there);
* a ``module:Class`` **stored** in a study (``tune resume``, ``Study.load``) is imported only
  after the user confirms (``check_import_consent``: ``--trust-source`` or the same
  ``--problem`` again on the command line; ``trust_source=True`` or the same name in Python).
  Before asking, the module is located without executing anything (``locate_module``: the
  finders' specs, parents walked by their search locations, no parent package imported), so the
  refusal names the file that would run. The current directory is never put first for a stored
  name: a module found only there is imported (the directory appended to ``sys.path``) only with
  that consent, and the refusal says where it is. A module already imported in this process, or
  one of bayes_safe's own, runs no new code and needs no consent.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from pathlib import Path

from ._cli_args import split_import_path

__all__ = ["check_import_consent", "load_problem", "load_problem_class", "locate_module"]


def _is_cwd_entry(entry: str, cwd: str) -> bool:
    if entry in ("", "."):
        return True
    try:
        return os.path.realpath(entry) == os.path.realpath(cwd)
    except (OSError, ValueError):
        return False


def locate_module(module_name: str) -> dict:
    """Where ``import module_name`` would load its code from, found without executing any of it.

    Returns ``{"module", "files" (the source files that would run: parents' ``__init__`` first,
    the module last), "where"}``; ``where`` is ``"loaded"`` (already imported in this process:
    nothing new runs), ``"sys.path"`` (found on ``sys.path`` as it is), ``"cwd"`` (found only in
    the current directory, not on ``sys.path``) or ``"missing"``.
    """
    cwd = os.getcwd()
    parts = module_name.split(".")
    if module_name in sys.modules:
        module = sys.modules[module_name]
        return {"module": module_name, "files": [getattr(module, "__file__", None) or "?"], "where": "loaded"}
    files: list[str] = []
    where = "sys.path"
    locations = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None:
            locations = list(getattr(loaded, "__path__", None) or [])
            if i + 1 < len(parts) and not locations:
                return {"module": module_name, "files": [], "where": "missing"}
            continue
        spec = None
        if i == 0:
            try:
                spec = importlib.util.find_spec(name)  # a top-level name: the finders only, nothing executed
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                spec = importlib.machinery.PathFinder.find_spec(name, [cwd])
                where = "cwd" if spec is not None else where
        else:
            spec = importlib.machinery.PathFinder.find_spec(name, locations or [])
        if spec is None:
            return {"module": module_name, "files": [], "where": "missing"}
        if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
            files.append(spec.origin)
        locations = list(spec.submodule_search_locations or [])
    # found through a sys.path entry that is the current directory (`python -m` puts it first)
    if (where == "sys.path" and files and any(_is_cwd_entry(e, cwd) for e in sys.path)
            and Path(files[0]).resolve().is_relative_to(Path(cwd).resolve())):
        where = "cwd"
    return {"module": module_name, "files": files or ["?"], "where": where}


def _own_module(module_name: str) -> bool:
    """A module of this package (its code is what is running already)."""
    return module_name == "bayes_safe" or module_name.startswith("bayes_safe.")


def check_import_consent(path: str, consent=False, *, what: str = "trust_source",
                         how: str = "pass trust_source=True") -> str:
    """Refuse to import a stored ``module:Class`` the user has not confirmed; return a line that shows it.

    Args:
        path: the stored ``"module:Class"``.
        consent: ``True``, or the same ``"module:Class"`` named again by the user; anything else
            (``False``, ``None``, another name) is no consent.
        what: the option or argument the refusal names first (``--trust-source``, ``trust_source``).
        how: how to consent, in the caller's words.

    Raises:
        ValueError: one line naming ``what``, the module, the class and the file(s) that would run
            (a module that cannot be found at all: ``no module named ...``; a malformed path).
    """
    try:
        module_name, attr = split_import_path(path)
    except ValueError as exc:
        raise ValueError(f"{what}: the stored problem class {path!r}: {exc}") from None
    if isinstance(consent, str) and consent.strip():
        try:
            given = "{}:{}".format(*split_import_path(consent))
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        if given != f"{module_name}:{attr}":
            raise ValueError(f"{what}: the stored study's problem class is {module_name}:{attr}, not {given}; a study "
                             "cannot change its problem class (name the stored one, or start a new study)")
        consent = True
    found = locate_module(module_name)
    shown = ", ".join(found["files"])
    if found["where"] == "missing":
        raise ValueError(f"{what}: no module named {module_name!r} (the stored problem class {module_name}:{attr}; "
                         f"looked on sys.path and in the current directory {os.getcwd()})")
    if found["where"] == "loaded" or _own_module(module_name):
        return f"problem class {attr} from module {module_name} ({shown}; already part of this process)"
    here = (f" (a file in the current directory {os.getcwd()}, importable only from there: a study's stored name is "
            "never imported from the current directory without your consent)" if found["where"] == "cwd" else "")
    if consent is not True:
        raise ValueError(f"{what}: the stored study imports its problem class {attr} from module {module_name!r}, "
                         f"which runs the code of {shown}{here}; nothing was imported. Check that code, then {how}")
    return f"problem class {attr} from module {module_name} ({shown}{', in the current directory' if here else ''})"


def _import(module_name: str, what: str, *, stored: bool):
    cwd = os.getcwd()
    if not stored:
        # a --problem typed by the user: the current directory first, as `python -m` would have it
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
    elif locate_module(module_name)["where"] == "cwd" and not any(_is_cwd_entry(e, cwd) for e in sys.path):
        # a stored name found only in the current directory, imported with the user's consent
        # (check_import_consent): the directory last, so it shadows nothing installed
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ValueError(f"{what}: no module named {module_name!r} (looked in the current directory and on "
                             "sys.path)") from None
        raise ValueError(f"{what}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while being imported
        raise ValueError(f"{what}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None


def load_problem_class(path: str, what: str = "--problem", *, stored: bool = False):
    """Import the class named ``module:Class`` and check it against the ``bayes_safe.envs.Problem``
    protocol.

    ``stored=False`` (a name the user typed): the current directory first on ``sys.path``.
    ``stored=True`` (a name read from a study, after ``check_import_consent``): ``sys.path`` as it
    is, the current directory appended only for a module found nowhere else.

    Raises ``ValueError`` (one line naming ``what``) for a malformed path or a module that cannot be
    imported, ``TypeError`` for a name that is not a problem class (naming what is missing)."""
    try:
        module_name, attr = split_import_path(path)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    module = _import(module_name, what, stored=stored)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    from bayes_safe.envs.problem import REQUIRED_METHODS, Problem

    if not inspect.isclass(obj):
        raise TypeError(f"{what}: {path} is a {type(obj).__name__}, not a problem class "
                        "(a subclass of bayes_safe.envs.Problem)")
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(obj, m, None)) or getattr(obj, m) is getattr(Problem, m)]
    names = getattr(obj, "metric_names", None)
    if not isinstance(names, (tuple, list)) or not names or not all(isinstance(n, str) for n in names):
        missing.append("metric_names (a tuple of metric names, reward first)")
    if missing:
        raise TypeError(f"{what}: {path} ({obj.__name__}) does not implement the Problem protocol "
                        f"(bayes_safe.envs.Problem); missing: {', '.join(missing)}")
    return obj


def load_problem(path: str, params=None, what: str = "--problem", param_option: str = "--param", *,
                 stored: bool = False):
    """``Class(**params)`` for ``path`` = ``module:Class`` (see ``load_problem_class``; ``stored``
    as there); a parameter the constructor does not take, or a constructor that rejects the
    values, is a ``ValueError`` naming ``param_option``; the instance is checked with
    ``bayes_safe.envs.check_problem``."""
    cls = load_problem_class(path, what, stored=stored)
    params = dict(params or {})
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        sig = None
    if sig is not None and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        accepted = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = [k for k in params if k not in accepted]
        if unknown:
            raise ValueError(f"{param_option}: {cls.__name__} does not take {', '.join(repr(k) for k in unknown)}; "
                             f"it takes {', '.join(accepted) or 'no parameters'}")
    try:
        problem = cls(**params)
    except (TypeError, ValueError) as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise ValueError(f"{param_option}: {cls.__name__}({shown}) failed: {exc}") from None
    from bayes_safe.envs.problem import check_problem

    check_problem(problem, what)
    return problem
