"""Argument types and checks shared by the command lines.

``bayes_safe.cli`` (``bayes-safe simulate | diagnose | study``) and ``bayes_safe.tuning.cli``
(``bayes-safe tune``) both take their argument types from here; neither imports the other's
private helpers. The top-level ``bayes_safe.cli`` composes ``tune`` from
``bayes_safe.tuning.cli.add_tune_parser``, never the reverse.

This module imports only the standard library: building a parser must not load torch.

Each ``*_type`` function is an argparse ``type=``. On bad input it raises
``argparse.ArgumentTypeError``, and argparse prints one line and exits with status 2, e.g.
``bayes-safe simulate: error: argument --horizon: expected a positive integer, got '0'``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

__all__ = [
    "OneLineParser",
    "check_output_dir",
    "existing_dir",
    "import_path",
    "key_value",
    "open_fraction",
    "output_dir",
    "positive_float",
    "positive_int",
    "probability",
    "probability_below_one",
    "split_import_path",
]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (no usage block) and whose options are
    never abbreviated (``--replication 3`` is an error, not ``--replications 3``).

    Subparsers made with ``add_subparsers`` inherit the class.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An integer >= 1 (``--horizon``, ``--trials``, ``--parallel`` ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (``--ridge``)."""
    what = "a number > 0"
    value = _float(text, what)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def probability(text: str) -> float:
    """A rate in [0, 1] (``--max-violation``)."""
    what = "a rate in [0, 1]"
    value = _float(text, what)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def probability_below_one(text: str) -> float:
    """A level in [0, 1): 1 is excluded (``--alpha``, the allowed shortfall against the baseline)."""
    what = "a value in [0, 1)"
    value = _float(text, what)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


#: ``--forgetting adaptive:KEY=VALUE,...``: the change test's settings a command line may name
#: (``AdaptiveForgetting``'s fields), each with its parser
_ADAPTIVE_KEYS = {"outcomes": str, "false_alarm_rate": float, "odds_ratio": float, "threshold": float, "drift": float,
                  "keep": float, "warmup": int, "warmup_events": int}


def forgetting_arg(text: str):
    """``--forgetting``: a factor in (0, 1], ``adaptive``, or ``adaptive:KEY=VALUE,...`` with the change
    test's settings (``AdaptiveForgetting``: e.g. ``adaptive:outcomes=binary,false_alarm_rate=1e-4``
    for a Gaussian model of a 0/1 metric); ``BayesianLinear``'s ``forgetting``."""
    head, _, settings = text.strip().partition(":")
    if head.strip().lower() == "adaptive":
        if not settings.strip():
            return "adaptive"
        return _adaptive_settings(settings)
    what = "a factor in (0, 1] (the weight an observation keeps per update), 'adaptive' or 'adaptive:KEY=VALUE,...'"
    value = _float(text, what)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


class AdaptiveSettings(dict):
    """``--forgetting adaptive:KEY=VALUE,...`` parsed: ``{setting: value}`` for ``AdaptiveForgetting(**settings)``,
    which the command checks (its errors name the setting) before any work; kept as plain values here, so the
    argument types import nothing of the package."""


def _adaptive_settings(settings: str) -> AdaptiveSettings:
    """``KEY=VALUE,...`` of ``--forgetting adaptive:...`` -> ``AdaptiveSettings``; ``argparse.ArgumentTypeError``
    naming the form for an unknown, repeated or malformed setting."""
    form = f"adaptive:KEY=VALUE,... with KEY one of {', '.join(_ADAPTIVE_KEYS)}"
    kwargs: dict = {}
    for item in settings.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value:
            raise argparse.ArgumentTypeError(f"expected {form}, got {item.strip()!r}")
        if key not in _ADAPTIVE_KEYS:
            raise argparse.ArgumentTypeError(f"unknown setting {key!r}; expected {form}")
        if key in kwargs:
            raise argparse.ArgumentTypeError(f"setting {key!r} given twice")
        kind = _ADAPTIVE_KEYS[key]
        try:
            kwargs[key] = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}: expected {'an integer' if kind is int else 'a number'}, got "
                                             f"{value!r}") from None
    return AdaptiveSettings(kwargs)


def open_fraction(text: str) -> float:
    """A share in (0, 1): neither none nor all (``--holdout``)."""
    what = "a share in (0, 1)"
    value = _float(text, what)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Raise ``ValueError`` if ``path`` exists and is not a directory (it may not exist yet)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}: {path} exists and is not a directory")


def output_dir(text: str) -> Path:
    """An output directory: new, or an existing directory; never an existing file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} exists and is not a directory")
    return path


def existing_dir(text: str) -> Path:
    """A directory that exists (the input of ``diagnose``)."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is not a directory" if path.exists() else f"{path} does not exist")
    return path


def _literal(text: str):
    """``3`` -> 3, ``0.5`` -> 0.5, ``true`` / ``false`` -> bool, ``none`` / ``null`` -> None, else the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def key_value(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` (``--param seed=3``): the value read as an int, a float, ``true`` / ``false``
    or ``none`` when it is one, else as the text itself."""
    key, sep, value = str(text).partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a Python name (e.g. seed=3), got {text!r}")
    return key, _literal(value.strip())


def metric_lag(text: str) -> tuple[str, int]:
    """``METRIC=STEPS`` (``--delay refund=2000``): a metric's name and its lag, an int >= 0 (steps)."""
    key, sep, value = str(text).partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected METRIC=STEPS (e.g. refund=2000), got {text!r}")
    try:
        lag = int(value)
    except ValueError:
        lag = -1
    if lag < 0 or not value.lstrip("+").isdigit():
        raise argparse.ArgumentTypeError(f"expected METRIC=STEPS with STEPS an int >= 0 (e.g. refund=2000), got {text!r}")
    return key, lag


def split_import_path(text: str) -> tuple[str, str]:
    """``"pkg.module:Class"`` -> ``("pkg.module", "Class")``; ``ValueError`` for any other form."""
    module, sep, attr = str(text).partition(":")
    module, attr = module.strip(), attr.strip()
    if not sep or not module:
        raise ValueError(f"expected module:Class (e.g. email_problem:EmailTiming), got {text!r}")
    if not attr:
        raise ValueError(f"{text!r} names no class after ':'; expected module:Class")
    if not all(p.isidentifier() for p in module.split(".")) or not all(p.isidentifier() for p in attr.split(".")):
        raise ValueError(f"expected module:Class made of Python names, got {text!r}")
    return module, attr


def import_path(text: str) -> str:
    """``pkg.module:Class`` (``--problem``): checked for its form only; nothing is imported here."""
    try:
        module, attr = split_import_path(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"{module}:{attr}"
