"""Importing your own problem class by ``module:Class`` (``--problem``, a stored tuning study).

``bayes-safe simulate --problem``, ``bayes-safe tune custom --problem`` and ``tune resume`` (via
``bayes_safe.tuning.ab_test.make_problem``) build a user's ``bayes_safe.envs.Problem`` here: the
module is imported with the current directory first on ``sys.path`` (a console script does not
put it there), the class checked against the protocol before it is built, the constructor's
arguments checked against its signature. Every failure is one line naming the option.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from ._cli_args import split_import_path

__all__ = ["load_problem", "load_problem_class"]


def load_problem_class(path: str, what: str = "--problem"):
    """Import the class named ``module:Class`` (the current directory first on ``sys.path``) and
    check it against the ``bayes_safe.envs.Problem`` protocol.

    Raises ``ValueError`` (one line naming ``what``) for a malformed path or a module that cannot be
    imported, ``TypeError`` for a name that is not a problem class (naming what is missing)."""
    try:
        module_name, attr = split_import_path(path)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ValueError(f"{what}: no module named {module_name!r} (looked in the current directory and on "
                             "sys.path)") from None
        raise ValueError(f"{what}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while being imported
        raise ValueError(f"{what}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
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


def load_problem(path: str, params=None, what: str = "--problem", param_option: str = "--param"):
    """``Class(**params)`` for ``path`` = ``module:Class`` (see ``load_problem_class``); a parameter
    the constructor does not take, or a constructor that rejects the values, is a ``ValueError``
    naming ``param_option``; the instance is checked with ``bayes_safe.envs.check_problem``."""
    cls = load_problem_class(path, what)
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
