"""The package's layers point down: models < policies < envs < simulation / experiments < tuning, studies, cli.

Every module file of ``bayes_safe/`` is parsed (with ``ast``: nothing is imported) and each
import it makes, at module level or inside a function, relative or absolute, is resolved to
an absolute module name and checked against the rules of its folder:

* no module of the package imports the top floor: ``bayes_safe.tuning``,
  ``bayes_safe.studies``, ``bayes_safe.cli`` (except ``cli.py`` itself and ``tuning/`` and
  ``studies/``, which live outside ``bayes_safe/`` and are mapped in by setuptools);
* ``models/``, ``policies/`` and ``envs/`` do not import ``bayes_safe.diagnostics`` (which
  reads models: it sits above them), nor the runners above them (``simulation``,
  ``experiments``, ``factory``);
* ``models/`` imports neither ``policies/`` nor ``envs/``; ``policies/`` does not import ``envs/``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bayes_safe"

#: the top floor: nothing inside the package may import it
TOP = ("bayes_safe.tuning", "bayes_safe.studies", "bayes_safe.cli")
#: what the bottom floors (models, policies, problems) may not import, besides the top floor
ABOVE_ENVS = ("bayes_safe.diagnostics", "bayes_safe.simulation", "bayes_safe.simulate", "bayes_safe.experiments",
              "bayes_safe.factory", "bayes_safe.online")
RULES: dict[str, tuple[str, ...]] = {
    "models": TOP + ABOVE_ENVS + ("bayes_safe.policies", "bayes_safe.envs"),
    "policies": TOP + ABOVE_ENVS + ("bayes_safe.envs",),
    "envs": TOP + ABOVE_ENVS,
}
#: files of bayes_safe/ that are the top floor themselves (tuning/ and studies/ are outside bayes_safe/)
TOP_FILES = {"cli.py"}
TOP_FOLDERS = {"tuning", "studies"}


@dataclass(frozen=True)
class Import:
    line: int
    target: str  # absolute dotted name of an imported module (or of a name a ``from`` import takes from it)
    statement: str


def module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of the module file ``path`` of bayes_safe/ and whether it is a package ``__init__``."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports_of(source: str, module: str, is_package: bool = False, filename: str = "<source>") -> list[Import]:
    """Every import of ``source`` (module ``module``), at any depth, resolved to absolute names.

    ``from X import a, b`` yields ``X``, ``X.a`` and ``X.b`` (``a`` may be a submodule:
    ``from .. import diagnostics``); ``importlib.import_module("literal")`` counts too.
    """
    tree = ast.parse(source, filename=filename)
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            text = ast.unparse(node)
            found += [Import(node.lineno, alias.name, text) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            text = ast.unparse(node)
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 >= len(parts):
                    raise ValueError(f"{filename}:{node.lineno}: {text!r} goes above the top package")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            found.append(Import(node.lineno, base, text))
            found += [Import(node.lineno, f"{base}.{alias.name}", text) for alias in node.names if alias.name != "*"]
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and not node.args[0].value.startswith(".")):
            found.append(Import(node.lineno, node.args[0].value, ast.unparse(node)))
    return found


def _matches(target: str, forbidden: str) -> bool:
    return target == forbidden or target.startswith(forbidden + ".")


def violations(source: str, module: str, forbidden: tuple[str, ...], is_package: bool = False,
               filename: str = "<source>") -> list[str]:
    """``"file:line: statement (imports <forbidden>)"`` for every import of a forbidden module."""
    out = []
    seen = set()
    for imp in imports_of(source, module, is_package, filename):
        for bad in forbidden:
            if _matches(imp.target, bad) and (imp.line, imp.statement, bad) not in seen:
                seen.add((imp.line, imp.statement, bad))
                out.append(f"{filename}:{imp.line}: `{imp.statement}` imports {bad}")
    return out


def rules_for(path: Path) -> tuple[str, ...] | None:
    """The forbidden imports of a file of bayes_safe/ (``None``: the file is on the top floor)."""
    rel = path.relative_to(PACKAGE)
    if rel.parts[0] in TOP_FOLDERS or (len(rel.parts) == 1 and rel.name in TOP_FILES):
        return None
    return RULES.get(rel.parts[0], TOP) if len(rel.parts) > 1 else TOP


MODULE_FILES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_layer_folders_exist():
    for folder in ("models", "policies", "envs", "experiments"):
        assert (PACKAGE / folder / "__init__.py").exists(), f"bayes_safe/{folder}/ is gone: update {__file__}"
    checked = [p for p in MODULE_FILES if rules_for(p) is not None]
    assert len(checked) > 30, f"only {len(checked)} module files found under {PACKAGE}"


def test_no_module_imports_a_layer_above_it():
    problems = []
    for path in MODULE_FILES:
        forbidden = rules_for(path)
        if forbidden is None:
            continue
        module, is_package = module_name(path)
        problems += violations(path.read_text(encoding="utf-8"), module, forbidden, is_package,
                               filename=str(path.relative_to(PACKAGE.parent)))
    assert not problems, "imports against the layering (models < policies < envs < simulation/experiments < " \
                         "tuning, studies, cli):\n" + "\n".join(problems)


# ---------------------------------------------------------------------- the checker itself
SYNTHETIC = '''\
"""A model module that breaks every rule."""
import torch
import bayes_safe.tuning.study
from ..diagnostics import save_models
from .. import diagnostics
from . import linear
from ..random import ReplicationRNG


def late():
    from bayes_safe.studies import get_study
    from ..policies.base import Policy
    import importlib
    return importlib.import_module("bayes_safe.envs.linear")
'''


def test_the_checker_resolves_relative_and_nested_imports():
    targets = {i.target for i in imports_of(SYNTHETIC, "bayes_safe.models.fake")}
    assert {"torch", "bayes_safe.tuning.study", "bayes_safe.diagnostics", "bayes_safe.diagnostics.save_models",
            "bayes_safe.models.linear", "bayes_safe.random.ReplicationRNG", "bayes_safe.studies",
            "bayes_safe.policies.base", "bayes_safe.envs.linear"} <= targets
    # in a package __init__ one dot is the package itself
    assert {i.target for i in imports_of("from .linear import x\nfrom .. import envs\n", "bayes_safe.models",
                                         is_package=True)} >= {"bayes_safe.models.linear", "bayes_safe.envs"}


def test_the_checker_fails_a_module_that_breaks_the_rules():
    found = violations(SYNTHETIC, "bayes_safe.models.fake", RULES["models"], filename="bayes_safe/models/fake.py")
    assert found == [
        "bayes_safe/models/fake.py:3: `import bayes_safe.tuning.study` imports bayes_safe.tuning",
        "bayes_safe/models/fake.py:4: `from ..diagnostics import save_models` imports bayes_safe.diagnostics",
        "bayes_safe/models/fake.py:5: `from .. import diagnostics` imports bayes_safe.diagnostics",
        "bayes_safe/models/fake.py:11: `from bayes_safe.studies import get_study` imports bayes_safe.studies",
        "bayes_safe/models/fake.py:12: `from ..policies.base import Policy` imports bayes_safe.policies",
        "bayes_safe/models/fake.py:14: `importlib.import_module('bayes_safe.envs.linear')` imports bayes_safe.envs",
    ]
    # one floor up the same imports of models, policies and envs are allowed: envs sit above them
    envs = violations(SYNTHETIC, "bayes_safe.envs.fake", RULES["envs"])
    assert {v.rpartition(" imports ")[2] for v in envs} == {"bayes_safe.tuning", "bayes_safe.diagnostics",
                                                           "bayes_safe.studies"}
    # a relative import that climbs out of the package is an error, not a silent pass
    with pytest.raises(ValueError, match="above the top package"):
        violations("from ... import cli\n", "bayes_safe.models.fake", RULES["models"])


def test_the_rules_of_each_folder():
    assert rules_for(PACKAGE / "cli.py") is None
    assert rules_for(PACKAGE / "simulation.py") == TOP
    assert rules_for(PACKAGE / "experiments" / "bcts.py") == TOP
    assert "bayes_safe.envs" in rules_for(PACKAGE / "policies" / "bcts.py")
    assert "bayes_safe.policies" in rules_for(PACKAGE / "models" / "linear.py")
    assert "bayes_safe.diagnostics" in rules_for(PACKAGE / "envs" / "video_upload.py")
    assert not _matches("bayes_safe.tuningx", "bayes_safe.tuning")


# ---------------------------------------------------------------------- no circles
def _module_files() -> dict[tuple[str, bool], Path]:
    """Every module of the installed package: bayes_safe/ and tuning/, studies/ mapped in as
    ``bayes_safe.tuning`` and ``bayes_safe.studies``, as ``(name, is_package) -> path``."""
    files = {module_name(p): p for p in MODULE_FILES}
    for folder in TOP_FOLDERS:
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            parts = p.relative_to(ROOT / folder).with_suffix("").parts
            package = parts[-1] == "__init__"
            files[(".".join(("bayes_safe", folder, *(parts[:-1] if package else parts))), package)] = p
    return files


def import_graph(sources: dict[tuple[str, bool], str]) -> dict[str, set[str]]:
    """``module -> the modules of the package it imports`` (at any depth, lazy imports included;
    an import of a name is an edge to the module that defines it; a module's own package is not)."""
    modules = {m for m, _ in sources}
    graph = {}
    for (module, is_package), source in sources.items():
        edges = set()
        for imp in imports_of(source, module, is_package):
            target = imp.target
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                edges.add(target)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_modules_import_each_other_in_a_circle():
    sources = {key: path.read_text(encoding="utf-8") for key, path in _module_files().items()}
    assert len(sources) > 60
    found = circles(import_graph(sources))
    assert not found, "modules that import each other (lazy imports included):\n" + "\n".join(map(str, found))


def test_the_circle_finder_finds_a_lazy_circle():
    sources = {("bayes_safe.models.facade", False): "from .engine import Engine\n",
               ("bayes_safe.models.engine", False): "def f():\n    from .facade import helper\n",
               ("bayes_safe.models.leaf", False): "import torch\n",
               ("bayes_safe.models", True): "from .facade import x\n"}
    assert circles(import_graph(sources)) == [["bayes_safe.models.engine", "bayes_safe.models.facade"]]
