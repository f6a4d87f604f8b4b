"""MkDocs hook: executed pages. The tutorials and the gallery show what their code prints and draws.

Every page matching ``EXECUTED`` (``tutorials/*.md``, so a new tutorial is picked up, and
``gallery.md``) has its python blocks run in order, in one fresh namespace, in a temporary
working directory, with matplotlib's Agg backend and one torch thread. After each block, what
it printed is inserted as an output block (``<div class="exec-output">``) and every figure
still open is saved as a PNG, closed, and shown under the block, linked to its full-size file.
A block that raises fails the build, naming the page and the block.

Execution is cached in ``.cache/docs-exec/`` (gitignored; ``BAYES_SAFE_DOCS_CACHE`` moves it):
the key is the hash of the page's code blocks, of every ``.py`` file of the installed package
(``bayes_safe/``, ``tuning/``, ``studies/``), of ``pyproject.toml`` and of this file, so a build
re-runs a page only when its code or the toolkit changed. tests/test_docs.py runs every
executed page through ``execute(..., refresh=True)`` (always running it, then writing the
cache), and the site builds of the test session read that cache.

Used by mkdocs.yml (``hooks:``); excluded from the published site.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import io
import json
import os
import re
import shutil
import tempfile
import traceback
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CACHE = Path(os.environ.get("BAYES_SAFE_DOCS_CACHE", ROOT / ".cache" / "docs-exec"))
# pages whose python blocks run at build time (paths relative to docs/)
EXECUTED = ("tutorials/*.md", "gallery.md")
# what the pages' outputs depend on besides their own code
SOURCES = ("bayes_safe", "tuning", "studies")
# a fenced python block at the start of a line (what tests/test_docs.py runs too)
BLOCK = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
FIGURE_DPI = 150
# the toolkit's figures are up to 11 inches wide and the text column about 700 px: drawn for the
# page with larger text, their labels stay readable at column width (about 11 px)
FIGURE_STYLE = {"font.size": 13, "axes.titlesize": 13, "axes.labelsize": 13, "legend.fontsize": 11,
                "xtick.labelsize": 11, "ytick.labelsize": 11}


class ExecutionError(RuntimeError):
    """A block of an executed page raised; the message names the page and the block."""


@dataclass
class BlockResult:
    """What one block printed (stdout) and drew (PNG images, in figure-number order)."""

    stdout: str = ""
    figures: list[bytes] = field(default_factory=list)


def is_executed(src_uri: str) -> bool:
    """Whether the page at ``src_uri`` (relative to docs/, with forward slashes) is executed."""
    return any(fnmatch(src_uri, pattern) for pattern in EXECUTED)


def executed_pages() -> list[Path]:
    """Every executed page in docs/."""
    return sorted({p for pattern in EXECUTED for p in DOCS.glob(pattern)})


def python_blocks(markdown: str) -> list[str]:
    """The code of each python block, in order."""
    return [m.group(1) for m in BLOCK.finditer(markdown)]


def _source_hash() -> str:
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", Path(__file__).resolve()]
    for folder in SOURCES:
        files += sorted((ROOT / folder).rglob("*.py"))
    for path in files:
        if path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_key(blocks: list[str]) -> str:
    digest = hashlib.sha256(_source_hash().encode())
    for code in blocks:
        digest.update(b"\0block\0" + code.encode())
    return digest.hexdigest()[:24]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")


def run_blocks(blocks: list[str], name: str) -> list[BlockResult]:
    """Run ``blocks`` in order in one fresh namespace in a temporary directory; what each gave."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    results = []
    namespace: dict = {"__name__": "__executed__"}
    old_cwd, old_threads = os.getcwd(), torch.get_num_threads()
    torch.set_num_threads(1)  # the tests' setting: small tensors, a loaded 2-core machine
    plt.close("all")
    try:
        with tempfile.TemporaryDirectory(prefix="docs-exec-") as work, matplotlib.rc_context(FIGURE_STYLE):
            os.chdir(work)
            for i, code in enumerate(blocks, start=1):
                out = io.StringIO()
                where = f"{name} block {i}"
                try:
                    with contextlib.redirect_stdout(out):
                        exec(compile(code, where, "exec"), namespace)  # noqa: S102 (the docs own code)
                except BaseException as exc:
                    tb = "".join(traceback.format_exception(exc))
                    raise ExecutionError(f"{where} (of {len(blocks)}) failed:\n{tb}") from exc
                figures = []
                for number in plt.get_fignums():
                    buf = io.BytesIO()
                    plt.figure(number).savefig(buf, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
                    figures.append(buf.getvalue())
                plt.close("all")
                results.append(BlockResult(out.getvalue(), figures))
    finally:
        os.chdir(old_cwd)
        torch.set_num_threads(old_threads)
        plt.close("all")
    return results


def _read_cache(folder: Path, count: int) -> list[BlockResult] | None:
    try:
        meta = json.loads((folder / "outputs.json").read_text())
        if len(meta) != count:
            return None
        return [BlockResult(b["stdout"], [(folder / f).read_bytes() for f in b["figures"]]) for b in meta]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(folder: Path, results: list[BlockResult]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    meta = []
    for i, result in enumerate(results, start=1):
        names = []
        for j, png in enumerate(result.figures, start=1):
            names.append(f"block{i}-{j}.png")
            (tmp / names[-1]).write_bytes(png)
        meta.append({"stdout": result.stdout, "figures": names})
    (tmp / "outputs.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    try:
        tmp.rename(folder)
    except OSError:  # another process wrote the same key first: its results are as good
        shutil.rmtree(tmp, ignore_errors=True)
    # an older execution of the same page is stale
    prefix = folder.name.rsplit("-", 1)[0] + "-"
    for old in folder.parent.glob(prefix + "*"):
        if old != folder and old.is_dir() and ".tmp" not in old.name and len(old.name) == len(folder.name):
            shutil.rmtree(old, ignore_errors=True)


def execute(page: Path | str, *, refresh: bool = False) -> list[BlockResult]:
    """The results of each python block of ``page`` (a path), from the cache unless ``refresh``.

    Runs the page when its results are not cached (or ``refresh``) and caches them.
    Raises ``ExecutionError`` naming the page and the block when a block fails.
    """
    path = Path(page).resolve()
    name = path.relative_to(DOCS).as_posix() if path.is_relative_to(DOCS) else path.name
    blocks = python_blocks(path.read_text())
    folder = CACHE / f"{_slug(name.removesuffix('.md'))}-{cache_key(blocks)}"
    if not refresh:
        cached = _read_cache(folder, len(blocks))
        if cached is not None:
            return cached
    results = run_blocks(blocks, f"docs/{name}")
    _write_cache(folder, results)
    return results


# --------------------------------------------------------------------------------------------
# the MkDocs hook

_RESULTS: dict[str, list[BlockResult]] = {}


def _figure_uri(src_uri: str, block: int, number: int) -> str:
    """Where block ``block``'s figure ``number`` of page ``src_uri`` is published (docs/-relative)."""
    folder, _, page = src_uri.rpartition("/")
    return (f"{folder}/" if folder else "") + f"figures/{page.removesuffix('.md')}-{block}-{number}.png"


def on_files(files, *, config):
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    _RESULTS.clear()
    for file in list(files.documentation_pages()):
        if not is_executed(file.src_uri):
            continue
        try:
            results = execute(file.abs_src_path)
        except ExecutionError as exc:
            raise PluginError(f"executed page docs/{file.src_uri}: {exc}") from None
        _RESULTS[file.src_uri] = results
        for i, result in enumerate(results, start=1):
            for j, png in enumerate(result.figures, start=1):
                files.append(File.generated(config, _figure_uri(file.src_uri, i, j), content=png))
    return files


def _rendered(src_uri: str, block: int, result: BlockResult) -> str:
    parts = []
    if result.stdout.strip():
        text = html.escape(result.stdout.rstrip("\n"))
        parts.append(f'<div class="exec-output" title="printed by the block above">'
                     f"<pre><code>{text}</code></pre></div>")
    page = src_uri.rpartition("/")[2]
    for j in range(1, len(result.figures) + 1):
        target = _figure_uri(page, block, j)  # relative to the page's own folder
        alt = f"figure {j} drawn by block {block} of {page}"
        parts.append(f"[![{alt}]({target})]({target})")
    return "\n\n".join(parts)


def on_page_markdown(markdown, *, page, config, files):
    results = _RESULTS.get(page.file.src_uri)
    if results is None:
        return markdown
    matches = list(BLOCK.finditer(markdown))
    if len(matches) != len(results):
        from mkdocs.exceptions import PluginError

        raise PluginError(f"executed page docs/{page.file.src_uri}: {len(matches)} python blocks "
                          f"on the page, {len(results)} executed")
    out, last = [], 0
    for i, (match, result) in enumerate(zip(matches, results), start=1):
        out.append(markdown[last:match.end()])
        rendered = _rendered(page.file.src_uri, i, result)
        if rendered:
            out.append("\n\n" + rendered + "\n")
        last = match.end()
    out.append(markdown[last:])
    return "".join(out)
