"""``Range``: one tuned parameter of a study and its bounds (a module of its own, below ``ab_test``
and ``logged``, which both use it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Range"]


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
