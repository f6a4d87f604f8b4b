"""``Range`` and ``Choice``: one tuned parameter of a study, its bounds or its values (a module of
its own, below ``ab_test`` and ``logged``, which both use it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Choice", "Range", "parse_parameter"]


@dataclass(frozen=True)
class Range:
    """A real (or integer) parameter of a study, searched in ``[low, high]``.

    Args:
        name: the parameter's name (what the problem's ``make_env`` / ``make_policy`` read).
        low, high: bounds, ``low < high`` (an empty or reversed range is an error).
        log: search on a log scale (needs ``low > 0``).
        integer: an integer parameter.
    """

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"parameter name: expected an identifier (letters, digits, _), got {self.name!r}")
        for key in ("low", "high"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"parameter {self.name!r}: expected a finite number for {key}, got {v!r}")
        if self.low == self.high:
            raise ValueError(f"parameter {self.name!r}: bounds [{self.low}, {self.high}] are empty; expected low < high")
        if self.low > self.high:
            raise ValueError(f"parameter {self.name!r}: bounds [{self.low}, {self.high}] are reversed; expected low < high")
        if self.log and self.low <= 0:
            raise ValueError(f"parameter {self.name!r}: a log-scale range needs low > 0, got low={self.low}")

    def to_dict(self) -> dict:
        return {"name": self.name, "low": self.low, "high": self.high, "log": self.log, "integer": self.integer}

    @classmethod
    def parse(cls, text: str) -> Range:
        """``"name=low:high"`` (optionally ``":log"`` / ``":int"`` appended), as on the command line."""
        name, sep, rest = str(text).partition("=")
        parts = rest.split(":")
        if not sep or len(parts) < 2:
            raise ValueError(f"--parameter: expected NAME=LOW:HIGH[:log][:int], got {text!r}")
        flags = set(parts[2:])
        if flags - {"log", "int"}:
            raise ValueError(f"--parameter {text!r}: unknown flags {sorted(flags - {'log', 'int'})}; expected log or int")
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(f"--parameter {text!r}: expected numbers for LOW and HIGH") from None
        return cls(name.strip(), low, high, log="log" in flags, integer="int" in flags)


@dataclass(frozen=True)
class Choice:
    """A parameter of a study that takes one of a few named values (an unordered Ax choice), e.g.
    ``Choice("forgetting", ("none", "0.99", "adaptive"))`` for a study of one's own problem.

    Args:
        name: the parameter's name.
        values: two or more distinct strings (the problem reads and checks them).
    """

    name: str
    values: tuple

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"parameter name: expected an identifier (letters, digits, _), got {self.name!r}")
        values = tuple(self.values) if isinstance(self.values, (list, tuple)) else None
        if values is None or len(values) < 2 or not all(isinstance(v, str) and v for v in values) \
                or len(set(values)) != len(values):
            raise ValueError(f"parameter {self.name!r}: expected two or more distinct non-empty strings as values, "
                             f"got {self.values!r}")
        object.__setattr__(self, "values", values)

    def to_dict(self) -> dict:
        return {"name": self.name, "values": list(self.values)}


def parse_parameter(text: str) -> Range | Choice:
    """A ``--parameter`` as on the command line: ``"name=low:high[:log][:int]"`` (a ``Range``) or
    ``"name=a,b,c"`` (a ``Choice`` of those values)."""
    name, sep, rest = str(text).partition("=")
    if sep and ":" not in rest and "," in rest:
        return Choice(name.strip(), tuple(v.strip() for v in rest.split(",")))
    try:
        return Range.parse(text)
    except ValueError as err:
        raise ValueError(f"{err}; or NAME=A,B[,C...] for a choice of values") from None
