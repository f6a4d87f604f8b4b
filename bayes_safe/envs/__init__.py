"""Problems: what a policy faces. ``make_problem(name, ...)`` builds one by registry name."""

from __future__ import annotations

from .linear import LinearBandit, Step, daulton2019, kazerouni2017, kazerouni2017_neurips

PROBLEMS = {
    "kazerouni2017": kazerouni2017,
    "kazerouni2017-neurips": kazerouni2017_neurips,
    "daulton2019": daulton2019,
}


def make_problem(name: str, **kwargs):
    """Build the problem registered as ``name`` (see ``PROBLEMS``) with keyword options."""
    if name not in PROBLEMS:
        raise ValueError(f"problem: unknown name {name!r}; expected one of {sorted(PROBLEMS)}")
    return PROBLEMS[name](**kwargs)


__all__ = ["LinearBandit", "Step", "PROBLEMS", "make_problem", "daulton2019", "kazerouni2017", "kazerouni2017_neurips"]
