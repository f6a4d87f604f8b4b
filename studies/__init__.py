"""Runnable reproductions of the papers' experiments.

Every module in this package that defines ``NAME`` (the CLI name, e.g. ``"ts-asc-synthetic"``),
``DESCRIPTION`` and ``run(out: Path, quick: bool = False, seed: int = 0) -> dict`` is a study;
``bayes-safe study run NAME --out DIR [--quick]`` runs it. A study writes ``results.json``,
CSV tables, PNG figures and ``report.md`` into ``out`` (atomically, see
``bayes_safe.io.atomic_output_dir``).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

__all__ = ["available_studies", "get_study"]


def available_studies() -> dict[str, tuple[str, str]]:
    """``{name: (module name, description)}`` of every study in this package.

    Read from each module's source (its ``NAME`` and ``DESCRIPTION`` constants) without
    importing it, so listing studies does not load torch, gpytorch or ax.
    """
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        tree = ast.parse((Path(__path__[0]) / f"{info.name}.py").read_text())
        consts = {}
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in ("NAME", "DESCRIPTION")):
                try:
                    consts[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
        if "NAME" in consts:
            found[consts["NAME"]] = (info.name, consts.get("DESCRIPTION", ""))
    return found


def get_study(name: str):
    """The study module registered as ``name`` (imported on demand)."""
    studies = available_studies()
    if name not in studies:
        raise ValueError(f"study: unknown name {name!r}; expected one of {sorted(studies)}")
    return importlib.import_module(f"{__name__}.{studies[name][0]}")
