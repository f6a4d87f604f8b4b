"""The documentation site renders: built with `mkdocs build --strict`, served over HTTP on
127.0.0.1 and visited page by page in headless Chromium.

Every page fails on:

* a raw Sphinx role (``:func:``, ``:class:``, ...), ``.. math::`` / ``.. code-block::`` or a
  paragraph ending in ``::`` (an RST literal block that did not become a code block);
* a broken image (loaded, but ``naturalWidth == 0``);
* an overflowing code block: the stylesheet (docs/stylesheets/extra.css) wraps code, so any
  block-level ``pre``/``code`` wider than its box (``scrollWidth > clientWidth``) has content
  cut off or pushed out of the text column;
* on the API pages, a private or dunder member (``__getstate__``, ``__deepcopy__``, ``_x``).

Chromium and chromedriver are Debian's ``chromium`` and ``chromium-driver`` packages;
`make browser` installs them (`make test` does it first). Without them this test fails.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

# The site build (mkdocs --strict, every API page, Chromium on every page: 3-5 minutes) runs in the long
# job; the tutorials it shows run in the default job (tests/test_docs.py), whose results it reads from
# the execution cache (.cache/docs-exec) when the sources are unchanged.
pytestmark = pytest.mark.long

# a Sphinx role or directive left in the rendered text
RAW_RST = re.compile(r":(func|class|meth|mod|attr|data|exc|obj|ref|doc|math|py:\w+):`|"
                     r"^\s*\.\. (math|code-block|code|note|warning)::", re.MULTILINE)
# members the API reference must not show (dunders other than the protocol methods it keeps)
HIDDEN_MEMBERS = re.compile(r"__(getstate|setstate|deepcopy|copy|reduce|reduce_ex|repr|eq|hash|post_init)__")
# the protocol methods mkdocs.yml keeps on purpose (see its `filters`)
KEPT_DUNDERS = {"__init__", "__call__", "__len__", "__getitem__", "__iter__", "__contains__"}

# Runs in the page; returns facts the Python side judges (so the judging is unit-testable).
PAGE_FACTS_JS = r"""
const facts = {text: document.body ? document.body.innerText : "", images: [], code: [],
               paragraphs: [], headings: [], article: document.querySelectorAll("article").length,
               blockquotes: Array.from(document.querySelectorAll("article blockquote")).map(
                 q => q.innerText.slice(0, 100))};
for (const img of document.images) {
  facts.images.push({src: img.currentSrc || img.src, complete: img.complete,
                     naturalWidth: img.naturalWidth});
}
for (const el of document.querySelectorAll("pre, code")) {
  const style = getComputedStyle(el);
  if (style.display === "inline" || style.display === "none") continue;
  if (el.offsetParent === null && style.position !== "fixed") continue;  // not rendered
  facts.code.push({tag: el.tagName.toLowerCase(), scrollWidth: el.scrollWidth,
                   clientWidth: el.clientWidth, overflowX: style.overflowX,
                   whiteSpace: style.whiteSpace,
                   text: (el.innerText || "").split("\n").sort((a, b) => b.length - a.length)[0]});
}
for (const p of document.querySelectorAll("article p, article li")) {
  facts.paragraphs.push(p.innerText);
}
for (const h of document.querySelectorAll("article .doc-heading[id], article [id].doc-heading")) {
  facts.headings.push(h.id);
}
return facts;
"""


def page_problems(url: str, facts: dict, *, api: bool) -> list[str]:
    """What is wrong with one rendered page, given the facts PAGE_FACTS_JS collected."""
    problems = []
    if not facts["article"]:
        problems.append(f"{url}: no <article>: the page did not render (error page?)")
    for m in RAW_RST.finditer(facts["text"]):
        start = max(m.start() - 40, 0)
        problems.append(f"{url}: raw RST markup {m.group(0).strip()!r} in "
                        f"{facts['text'][start:m.end() + 40]!r}")
    for text in facts["paragraphs"]:
        if text.rstrip().endswith("::"):
            problems.append(f"{url}: an RST literal block marker '::' ends {text.strip()[-80:]!r}")
    for img in facts["images"]:
        if not img["complete"]:
            problems.append(f"{url}: image {img['src']} never finished loading")
        elif img["naturalWidth"] == 0:
            problems.append(f"{url}: broken image {img['src']}")
    for code in facts["code"]:
        if code["scrollWidth"] > code["clientWidth"] + 1:
            problems.append(
                f"{url}: <{code['tag']}> overflows its box ({code['scrollWidth']} > "
                f"{code['clientWidth']} px, overflow-x {code['overflowX']}, white-space "
                f"{code['whiteSpace']}): {code['text'][:100]!r}")
    if api:
        # a docstring's doctest lines rendered as Markdown quotes (">>>"), the code run together
        for quote in facts.get("blockquotes", []):
            problems.append(f"{url}: a block quote on an API page (doctest lines not rendered as code?): {quote!r}")
        for m in HIDDEN_MEMBERS.finditer(facts["text"]):
            problems.append(f"{url}: the API page shows {m.group(0)}")
        for anchor in facts["headings"]:
            name = anchor.rsplit(".", 1)[-1]
            if name.startswith("_") and name not in KEPT_DUNDERS:
                problems.append(f"{url}: the API page documents the private member {anchor}")
    return problems


# --------------------------------------------------------------------------------------------
# serving and browsing


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@functools.cache
def _served(directory: str) -> str:
    """Serve ``directory`` on 127.0.0.1 (an ephemeral port) for the rest of the session."""
    handler = functools.partial(_QuietHandler, directory=directory)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def _start_browser(profile: Path):
    """A headless Chromium driver, or the reason there is none (a str)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return (f"{' and '.join(missing)} not found: `make browser` installs them "
                f"(Debian packages chromium and chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev]' (or `make test`) installs it"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    return driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator:
    driver = _start_browser(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    if not isinstance(driver, str):
        driver.quit()


def _driver(browser):
    if isinstance(browser, str):
        pytest.fail(browser)  # never skip: a docs check that cannot run is a failing check
    return browser


# Resolves once the DOM has not changed for 300 ms (at most 10 s): the theme's JavaScript
# rewrites parts of the page after the load event (code copy buttons, the content area).
SETTLE_JS = r"""
const done = arguments[arguments.length - 1];
let timer = setTimeout(finish, 300);
const observer = new MutationObserver(() => { clearTimeout(timer); timer = setTimeout(finish, 300); });
observer.observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
const cap = setTimeout(finish, 10000);
function finish() { observer.disconnect(); clearTimeout(timer); clearTimeout(cap); done(true); }
"""


def visit(driver, url: str, *, api: bool) -> list[str]:
    """Load ``url``, let it settle and every image load or fail, and return its problems."""
    driver.get(url)
    driver.execute_async_script(SETTLE_JS)
    images = driver.execute_script(
        "for (const img of document.images) { img.loading = 'eager'; img.scrollIntoView(); }"
        "return document.images.length")
    if images:  # a page without images (most API pages) has nothing more to load or lay out
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        # an image still loading after 20 s is reported below as one that never finished
        with contextlib.suppress(TimeoutException):
            WebDriverWait(driver, 20).until(
                lambda d: d.execute_script("return Array.from(document.images).every(i => i.complete)"))
        driver.execute_script("window.scrollTo(0, 0)")
        driver.execute_async_script(SETTLE_JS)
    return page_problems(url, driver.execute_script(PAGE_FACTS_JS), api=api)


def _pages(site: Path) -> list[str]:
    """Every HTML page of the built site, as a URL path."""
    pages = []
    for path in sorted(site.rglob("*.html")):
        rel = path.relative_to(site).as_posix()
        if rel.startswith(("assets/", "search/")):
            continue
        pages.append("/" + rel.removesuffix("index.html"))
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built strict (``mkdocs build --strict``: a warning fails the build, and with it
    every test here): the test suite's one build of the documentation."""
    out = tmp_path_factory.mktemp("site") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


# --------------------------------------------------------------------------------------------
# the site


def test_every_page_renders(site, browser):
    driver = _driver(browser)
    base = _served(str(site))
    pages = _pages(site)
    assert "/" in pages and "/api/" in pages and "/install/" in pages, pages
    # the API reference is one page per module, grouped by area; the user guide a section of pages
    assert {"/api/models/", "/api/policies/", "/api/tuning/", "/api/state/"} <= set(pages), pages
    assert {"/api/models/bayes_safe.models.linear/", "/api/policies/bayes_safe.policies.ts_asc/",
            "/api/tuning/bayes_safe.tuning.study/"} <= set(pages), pages
    assert {"/guide/models/", "/guide/performance/", "/gallery/"} <= set(pages), pages
    problems = []
    for page in pages:
        problems += visit(driver, base + page, api=page.startswith("/api/"))
    assert not problems, "\n".join(problems)


def test_api_page_renders_the_package_dir_packages(site, browser):
    """bayes_safe.tuning lives in tuning/ (setuptools package-dir): its docstrings render."""
    driver = _driver(browser)
    driver.get(_served(str(site)) + "/api/tuning/bayes_safe.tuning.ab_test/")
    driver.execute_async_script(SETTLE_JS)
    text = driver.execute_script("return document.body.innerText")
    assert "bayes_safe.tuning.ab_test.ABTest" in text
    assert "Evaluate one parameterization by a simulated A/B test" in text
    assert driver.execute_script(
        "return document.querySelectorAll('.doc-signature .highlight, .highlight code .n').length"
    ) > 0, "code is not highlighted"


def test_report_figures_link_to_the_full_size_image(site, browser):
    driver = _driver(browser)
    driver.get(_served(str(site)) + "/reports/tuning-video-upload/report/")
    driver.execute_async_script(SETTLE_JS)
    figures = driver.execute_script(
        "return Array.from(document.querySelectorAll('article img')).map("
        "i => [i.parentElement.tagName, i.parentElement.href || '', i.src])")
    assert figures
    for parent, href, src in figures:
        assert parent == "A" and href == src, (parent, href, src)
    # shown at the width of the text column (readable labels), not shrunk inside it
    widths = driver.execute_script(
        "const col = document.querySelector('article').getBoundingClientRect().width;"
        "return Array.from(document.querySelectorAll('article img')).map("
        "i => [i.getBoundingClientRect().width, col])")
    for width, column in widths:
        assert width >= 0.9 * column, (width, column)


def _executor():
    """docs/hooks/execute.py (the hook that runs the tutorials and the gallery at build time)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks_execute", ROOT / "docs" / "hooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# what an executed page shows: its output blocks and the figures drawn by its blocks
EXECUTED_FACTS_JS = r"""
const figures = Array.from(document.querySelectorAll("article img")).filter(
  i => /\/figures\/[^/]+-\d+-\d+\.png$/.test(i.src));
return {outputs: Array.from(document.querySelectorAll("article .exec-output pre")).map(
          p => p.innerText.length),
        figures: figures.map(i => ({src: i.src, naturalWidth: i.naturalWidth,
                                    width: i.getBoundingClientRect().width,
                                    column: i.closest("article").getBoundingClientRect().width,
                                    href: i.parentElement.tagName === "A" ? i.parentElement.href : ""}))};
"""


def test_executed_pages_show_their_outputs_and_figures(site, browser):
    """Every tutorial and the gallery show what their blocks printed and drew (every tutorial at
    least one figure), at column width."""
    driver = _driver(browser)
    base = _served(str(site))
    executor = _executor()
    pages = executor.executed_pages()
    assert any(p.parent.name == "tutorials" for p in pages) and any(p.name == "gallery.md" for p in pages)
    problems = []
    for page in pages:
        src = page.relative_to(ROOT / "docs").as_posix()
        url = base + "/" + src.removesuffix(".md") + "/"
        # the PNGs the build published for this page (what its blocks drew)
        folder, _, stem = src.removesuffix(".md").rpartition("/")
        drawn = len(list((site / folder / "figures").glob(f"{stem}-*-*.png")))
        driver.get(url)
        driver.execute_async_script(SETTLE_JS)
        driver.execute_script("for (const img of document.images) { img.loading = 'eager'; }")
        with contextlib.suppress(Exception):
            from selenium.webdriver.support.ui import WebDriverWait

            WebDriverWait(driver, 20).until(
                lambda d: d.execute_script("return Array.from(document.images).every(i => i.complete)"))
        facts = driver.execute_script(EXECUTED_FACTS_JS)
        if not any(facts["outputs"]):
            problems.append(f"{src}: no rendered output block")
        if page.parent.name == "tutorials" and not facts["figures"]:
            # issue 31: every tutorial shows what it draws, not only what it prints
            problems.append(f"{src}: no figure on the page (a tutorial draws at least one)")
        if len(facts["figures"]) != drawn:
            problems.append(f"{src}: {len(facts['figures'])} figures on the page, its blocks drew {drawn}")
        for fig in facts["figures"]:
            if fig["naturalWidth"] <= 0:
                problems.append(f"{src}: broken figure {fig['src']}")
            if fig["href"] != fig["src"]:
                problems.append(f"{src}: figure {fig['src']} does not link to its full-size file")
            if fig["width"] < 0.9 * fig["column"]:
                problems.append(f"{src}: figure {fig['src']} is {fig['width']:.0f} px wide in a "
                                f"{fig['column']:.0f} px column")
        if src == "gallery.md" and drawn < 7:
            problems.append(f"gallery.md: {drawn} figures, expected one per plot of the toolkit (7)")
    if not list((site / "tutorials" / "figures").glob("diagnostics-*-*.png")):
        problems.append("tutorials/diagnostics.md draws no diagnostic plot")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------
# the checker catches what it is meant to catch

BAD_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
  .box { width: 200px; }
  .box pre { white-space: pre; overflow: hidden; }
</style></head><body><article>
<p>Use :func:`simulate` to run a policy.</p>
<p>Example::</p>
<img src="missing.png" alt="gone">
<div class="box"><pre><code>trace = simulate(TSASC(model(), [model()], alpha=0.01), env, horizon=500, seed=1)</code></pre></div>
<h3 class="doc-heading" id="bayes_safe.models.linear.BayesianLinear.__deepcopy__">__deepcopy__</h3>
<blockquote><blockquote><blockquote><p>import torch m = PerArmLinear(...)</p></blockquote></blockquote></blockquote>
</article></body></html>
"""

GOOD_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
  .box { width: 200px; }
  .box pre { white-space: pre-wrap; overflow-wrap: anywhere; }
</style></head><body><article>
<p>Use <code>simulate</code> to run a policy (<code>a::b</code> is fine inside code).</p>
<img src="dot.png" alt="a dot">
<div class="box"><pre><code>trace = simulate(TSASC(model(), [model()], alpha=0.01), env, horizon=500, seed=1)</code></pre></div>
<h3 class="doc-heading" id="bayes_safe.models.linear.BayesianLinear.update">update</h3>
<h3 class="doc-heading" id="bayes_safe.envs.video_upload.Uploads.__len__">__len__</h3>
</article></body></html>
"""

# a 1x1 PNG
DOT_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=")


def test_checker_on_hand_written_pages(tmp_path, browser):
    driver = _driver(browser)
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "bad.html").write_text(BAD_PAGE)
    (tmp_path / "api" / "good.html").write_text(GOOD_PAGE)
    (tmp_path / "api" / "dot.png").write_bytes(DOT_PNG)
    base = _served(str(tmp_path))

    bad = "\n".join(visit(driver, base + "/api/bad.html", api=True))
    assert "raw RST markup ':func:`'" in bad, bad
    assert "'::' ends 'Example::'" in bad, bad
    assert "broken image" in bad and "missing.png" in bad, bad
    assert "<pre> overflows its box" in bad or "<code> overflows its box" in bad, bad
    assert "shows __deepcopy__" in bad and "private member" in bad, bad
    assert "a block quote on an API page" in bad and "import torch m = PerArmLinear" in bad, bad

    assert visit(driver, base + "/api/good.html", api=True) == []


def test_checker_on_a_damaged_copy_of_the_site(site, tmp_path, browser):
    """A raw role, a missing figure and an unwrapped code block in a real page are caught."""
    driver = _driver(browser)
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    page = copy / "install" / "index.html"
    html = page.read_text()
    html = html.replace("</article>", "<p>See :class:`BayesianLinear`.</p>"
                        "<img src='no-such-figure.png' alt='x'>"
                        "<pre style='white-space: pre; overflow: hidden'><code style='white-space: pre'>"
                        + "x = 1; " * 200 + "</code></pre></article>", 1)
    page.write_text(html)
    damaged = "\n".join(visit(driver, _served(str(copy)) + "/install/", api=False))
    assert ":class:`" in damaged and "no-such-figure.png" in damaged, damaged
    assert "overflows its box" in damaged, damaged
    # the undamaged site's page is clean
    assert visit(driver, _served(str(site)) + "/install/", api=False) == []
