"""The documentation is true: the README example and every tutorial run, and the site builds
with warnings as errors (what `make docs` does)."""

import os
import re
import subprocess
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


TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))


@pytest.mark.parametrize("tutorial", TUTORIALS, ids=[t.stem for t in TUTORIALS])
def test_tutorial_runs(tutorial, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__tutorial__"}
    blocks = _python_blocks(tutorial)
    assert blocks, f"{tutorial.name} has no python blocks"
    for i, block in enumerate(blocks):
        exec(compile(block, f"{tutorial.name} block {i + 1}", "exec"), namespace)


GUIDES = sorted(p for p in (ROOT / "docs").glob("*.md") if _python_blocks(p))


@pytest.mark.parametrize("page", GUIDES, ids=[p.stem for p in GUIDES])
def test_guide_examples_run(page, tmp_path, monkeypatch):
    """Every python block of every guide page runs, in order, in a fresh directory."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__guide__"}
    for i, block in enumerate(_python_blocks(page)):
        exec(compile(block, f"{page.name} block {i + 1}", "exec"), namespace)


def test_documentation_site_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()
