"""Runnable reproductions of the papers' experiments.

Every module in this package that defines ``NAME`` (the CLI name, e.g. ``"ts-asc-synthetic"``),
``DESCRIPTION`` and ``run(out: Path, quick: bool = False, seed: int = 0) -> dict`` is a study;
``bayes-safe study run NAME --out DIR [--quick]`` runs it. A study writes ``results.json``,
CSV tables, PNG figures and ``report.md`` into ``out`` (atomically, see
:func:`bayes_safe.io.atomic_output_dir`).
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["available_studies", "get_study"]


def available_studies() -> dict:
    """``{name: module}`` of every study module in this package."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            found[module.NAME] = module
    return found


def get_study(name: str):
    studies = available_studies()
    if name not in studies:
        raise ValueError(f"study: unknown name {name!r}; expected one of {sorted(studies)}")
    return studies[name]
