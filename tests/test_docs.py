"""The documentation is true: the README example and every tutorial run, and the site builds
with warnings as errors (what `make docs` does)."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


def test_readme_quick_start_runs():
    block = _python_blocks(ROOT / "README.md")[0]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    trace = namespace["trace"]
    assert trace.regret.shape == (500, 100)
    assert torch.isfinite(trace.regret).all()
    # what the README says next to the code: a well-specified prior, few violations, regret near zero
    assert float(trace.violation.double().mean()) < 0.08
    assert abs(float(trace.regret.sum(0).mean())) < 20


def _load_executor():
    """docs/hooks/execute.py, the MkDocs hook that runs the executed pages (not a package)."""
    spec = importlib.util.spec_from_file_location("docs_hooks_execute", ROOT / "docs" / "hooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


EXECUTOR = _load_executor()
# the tutorials and the gallery: run at build time by the hook, and here
EXECUTED = EXECUTOR.executed_pages()


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT / "docs").with_suffix("").as_posix()


def test_every_tutorial_is_executed():
    assert set(EXECUTED) >= set((ROOT / "docs" / "tutorials").glob("*.md"))
    assert ROOT / "docs" / "gallery.md" in EXECUTED


#: the longest pages (35 to 100 s each on the 2-core machine: whole studies, services and simulations end to
#: end) run in the long job (`make test-long`), which builds the site from the same execution; the rest run in
#: every default run
LONG_PAGES = {"tutorials/dose-finding", "tutorials/deploying", "tutorials/the-loop"}


@pytest.mark.parametrize("tutorial", [pytest.param(p, marks=pytest.mark.long) if _page_id(p) in LONG_PAGES else p
                                      for p in EXECUTED], ids=[_page_id(p) for p in EXECUTED])
def test_tutorial_runs(tutorial):
    """Every python block of every tutorial (and the gallery) runs, in order, in a fresh directory.

    Always run here (``refresh=True``); the results are cached, so the site build of the same
    session (the strict build of tests/test_docs_render.py) shows them without running the pages
    again.
    """
    blocks = _python_blocks(tutorial)
    assert blocks, f"{tutorial.name} has no python blocks"
    results = EXECUTOR.execute(tutorial, refresh=True)
    assert len(results) == len(blocks)
    assert any(r.stdout.strip() for r in results), f"{tutorial.name} prints nothing to show"


def test_a_failing_block_is_named(tmp_path):
    page = tmp_path / "broken.md"
    page.write_text("# Broken\n\n```python\nx = 1\n```\n\n```python\nprint(x)\n1 / 0\n```\n")
    with pytest.raises(EXECUTOR.ExecutionError, match=r"broken\.md block 2 \(of 2\) failed(.|\n)*ZeroDivisionError"):
        EXECUTOR.run_blocks(_python_blocks(page), "broken.md")


def test_execution_captures_output_and_figures_and_keys_on_the_code():
    results = EXECUTOR.run_blocks(
        ["import matplotlib.pyplot as plt\nprint('hello')", "plt.plot([0, 1])\nplt.figure()\nplt.plot([1, 0])"],
        "t.md")
    assert results[0].stdout == "hello\n" and results[0].figures == []
    assert results[1].stdout == "" and len(results[1].figures) == 2
    assert all(png.startswith(b"\x89PNG") for png in results[1].figures)
    assert EXECUTOR.cache_key(["x = 1"]) != EXECUTOR.cache_key(["x = 2"])


GUIDES = sorted(p for p in [*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "guide").glob("*.md")]
                if _python_blocks(p) and p not in EXECUTED)


def test_the_user_guide_is_a_section_of_pages():
    pages = {p.stem for p in (ROOT / "docs" / "guide").glob("*.md")}
    assert {"models", "policies", "problems", "simulation", "tuning", "diagnostics", "warm-starts",
            "saving", "production", "logged-data", "performance"} <= pages
    assert "decisions per second" in (ROOT / "docs" / "guide" / "performance.md").read_text()


@pytest.mark.parametrize("page", GUIDES, ids=[_page_id(p) for p in GUIDES])
def test_guide_examples_run(page, tmp_path, monkeypatch):
    """Every python block of every guide page runs, in order, in a fresh directory."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__guide__"}
    for i, block in enumerate(_python_blocks(page)):
        exec(compile(block, f"{page.name} block {i + 1}", "exec"), namespace)


# The site's strict build (mkdocs build --strict: any warning fails) is tests/test_docs_render.py's
# ``site`` fixture, which every rendering test uses: one build per session instead of two (about 90 s).
