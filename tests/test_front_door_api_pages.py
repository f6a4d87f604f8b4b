"""The API reference is one page per module (issue 31), grouped by area: a reader who knows an
object's module finds its page by name, ``api/<area>/<module>.md``, and the area pages link to
every object on its module's page. Checks the sources (docs/api/, mkdocs.yml), no build."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: (\S+)\s*$", re.MULTILINE)


def _module_of(name: str) -> str:
    """``name`` if it is a module, else the module that holds it (as the directive spells it)."""
    try:
        importlib.import_module(name)
        return name
    except ImportError:
        return name.rsplit(".", 1)[0]


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def _mkdocs_nav() -> list[str]:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may hold !!python/name tags (none today); read them as plain strings
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return _nav_pages(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"])


def test_each_module_page_documents_its_own_module_only():
    pages = sorted(API.glob("*/*.md"))
    assert len(pages) >= 40, pages
    homes: dict[str, Path] = {}
    for page in pages:
        module = page.stem
        names = DIRECTIVE.findall(page.read_text())
        assert names, f"{page}: documents nothing"
        for name in names:
            assert name == module or _module_of(name) == module, f"{page}: documents {name}, of another module"
        assert module not in homes, f"{module} has two pages: {homes[module]} and {page}"
        homes[module] = page


def test_area_pages_link_every_object_to_its_module_page():
    areas = sorted(p for p in API.glob("*.md") if p.name != "index.md")
    assert {p.stem for p in areas} >= {"models", "policies", "problems", "tuning", "state"}
    documented = {name for page in API.glob("*/*.md") for name in DIRECTIVE.findall(page.read_text())}
    for area in areas:
        text = area.read_text()
        assert not DIRECTIVE.search(text), f"{area}: renders objects itself instead of linking to module pages"
        for target, anchor in re.findall(r"\]\(([\w./]+\.md)#([\w.]+)\)", text):
            page = (area.parent / target).resolve()
            assert page.exists(), f"{area}: links to a missing page {target}"
            assert anchor in DIRECTIVE.findall(page.read_text()), f"{area}: {target} has no {anchor}"
            documented.discard(anchor)
    # every object on a module page is reachable from an area page (module docstrings aside)
    leftover = {name for name in documented if _module_of(name) != name}
    assert not leftover, f"objects no area page links to: {sorted(leftover)}"


def test_every_api_page_is_in_the_navigation():
    nav = set(_mkdocs_nav())
    for page in API.rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert rel in nav, f"{rel} is not in mkdocs.yml's nav"
