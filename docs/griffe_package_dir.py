"""Griffe extension: load the packages that pyproject.toml maps with setuptools' package-dir.

The repository's top-level folders ``tuning/`` and ``studies/`` install as ``bayes_safe.tuning``
and ``bayes_safe.studies`` (``[tool.setuptools.package-dir]``). Griffe's static loader finds
``bayes_safe/`` on disk and walks its folder, so it never sees them and the API page's
``::: bayes_safe.tuning...`` directives fail. When the top-level package is loaded, this
extension loads each mapped folder as the submodule it installs as (by parsing the source, as
for the rest of the package). Used by mkdocs.yml (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import re
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


class DoctestExamples(griffe.Extension):
    """Render a docstring's doctest lines and literal blocks as code.

    * Griffe's Google parser reads ``Examples:`` (plural) as doctest examples, shown as Python
      code, but turns the singular ``Example:`` into an admonition whose ``>>>`` lines become
      nested Markdown block quotes, the code run together into one line. The package's docstrings
      use both spellings, so an ``Example:`` header followed by a ``>>>`` line is read as
      ``Examples:``.
    * A paragraph ending in ``::`` before an indented block is reStructuredText's literal block
      (a module docstring's equations, say): Markdown already shows the indented block as code,
      so the paragraph ends in ``:``, as Sphinx renders it.
    """

    _HEADER = re.compile(r"^(\s*)Example:[ \t]*\n(?=\s*>>> )", re.MULTILINE)
    _LITERAL = re.compile(r"(\S)::[ \t]*\n(?=[ \t]*\n[ \t]+\S)")

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = obj.docstring.value
        if "Example:" in text:
            text = self._HEADER.sub(r"\1Examples:\n", text)
        if "::" in text:
            text = self._LITERAL.sub(r"\1:\n", text)
        obj.docstring.value = text
