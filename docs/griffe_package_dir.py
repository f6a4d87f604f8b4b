"""Griffe extension: load the packages that pyproject.toml maps with setuptools' package-dir.

The repository's top-level folders ``tuning/`` and ``studies/`` install as ``bayes_safe.tuning``
and ``bayes_safe.studies`` (``[tool.setuptools.package-dir]``). Griffe's static loader finds
``bayes_safe/`` on disk and walks its folder, so it never sees them and the API page's
``::: bayes_safe.tuning...`` directives fail. When the top-level package is loaded, this
extension loads each mapped folder as the submodule it installs as (by parsing the source, as
for the rest of the package). Used by mkdocs.yml (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> dict[str, Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return {name: ROOT / folder for name, folder in mapping.items() if name}


class PackageDir(griffe.Extension):
    """Attach ``package-dir`` folders to their parent package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for dotted, folder in sorted(_package_dirs().items()):
            parent_path, _, name = dotted.rpartition(".")
            if not parent_path or parent_path.split(".")[0] != pkg.name:
                continue
            init = folder / "__init__.py"
            if not init.exists():
                continue
            parent = pkg if parent_path == pkg.name else pkg[parent_path.split(".", 1)[1]]
            if name in parent.members and parent.members[name].is_module:
                continue
            # private API, stable across griffe 1.x-2.x: load a folder as a named submodule
            module = loader._load_module(name, init, parent=parent)
            parent.set_member(name, module)
            loader.expand_exports(module)
            loader.expand_wildcards(module, external=False)
