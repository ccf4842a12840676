"""The rendered book, opened page by page in headless Chromium, as a reader sees it.

For every page of `_toc.yml` the test loads the built HTML from a local server and checks that
the page loads with no JavaScript error, has a title and a heading, that every image loaded,
that the sidebar lists every chapter, that MathJax typeset every equation (from the book's own
copy: the build is offline), that no internal link points to a missing page, and that nothing
on the page is fetched from a host other than this machine. It then checks that the page fits
the screen at 1280 pixels wide and on a 390-pixel phone: nothing widens the page or is cut off
(a wide equation, output or figure scrolls inside its own box), no code cell and no printed
output scrolls sideways at 1280 pixels, the claims ledger's tables fit the column, and a figure
is not shrunk on a phone below the size at which its labels can be read. It also saves
full-page screenshots of the intro page and of one experiment chapter under
`_build/screenshots/`.

The book's PDF is checked in `test_pdf.py`, with this file's server and browser (a file of its
own, so that pytest-xdist's `--dist loadfile` runs it beside the pages, not after them).

Needs Playwright for Python (`pip install playwright`; never `playwright install`: it drives
Debian's Chromium, `apt-get install chromium`). Skipped with the reason when either is missing.
Uses `_build/html` when it exists (set `LNBOOK_HTML` to use another folder), else builds the
book first with `jupyter-book build`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("LNBOOK_HTML", ROOT / "_build" / "html")).resolve()
SHOTS = HTML.parent / "screenshots"
CHROMIUM = os.environ.get("LNBOOK_CHROMIUM") or next(
    (p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
     if p and Path(p).exists()),
    None,
)
# Playwright adds --headless itself (headless=True) and runs a fresh profile (user_data_dir)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
EXPERIMENT_PAGE = "book/06_6_mnist"

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="Playwright for Python is not installed (pip install playwright; it drives "
    "Debian's chromium, no `playwright install` needed)",
)
if CHROMIUM is None:
    pytest.skip(
        "no Chromium found (apt-get install -y chromium, or set LNBOOK_CHROMIUM)",
        allow_module_level=True,
    )


def toc_pages() -> list[str]:
    """Every document of `_toc.yml` (the root first), as 'book/NAME' without suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for key, value in node.items():
                if key != "file":
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [re.sub(r"\.(md|ipynb)$", "", f) for f in files]


PAGES = toc_pages()


def screenshot_pages() -> dict[str, str]:
    """Page -> screenshot name: the intro, and the MNIST chapter (else a chapter with a figure)."""
    shots = {PAGES[0]: "intro.png"}
    if EXPERIMENT_PAGE in PAGES and (HTML / f"{EXPERIMENT_PAGE}.html").exists():
        shots[EXPERIMENT_PAGE] = f"{Path(EXPERIMENT_PAGE).name}.png"
        return shots
    for page in PAGES[1:]:
        path = HTML / f"{page}.html"
        if path.exists() and re.search(r'<img [^>]*src="[^"]*_images/', path.read_text()):
            shots[page] = f"{Path(page).name}.png"  # a chapter with a figure
            break
    return shots


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in {"data", "blob", "about"} or parts.hostname in LOCAL_HOSTS


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """The built book served on 127.0.0.1; builds it first when `_build/html` is missing."""
    if not (HTML / "index.html").exists():
        if "LNBOOK_HTML" in os.environ:
            pytest.fail(f"LNBOOK_HTML={HTML} holds no built book (no index.html)")
        jb = Path(sys.executable).parent / "jupyter-book"
        subprocess.run([str(jb), "build", str(ROOT), "--warningiserror", "--nitpick",
                        "--keep-going"], cwd=ROOT, check=True)
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    """A headless Chromium with a fresh profile, driven by Playwright."""
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        context.set_default_timeout(60_000)
        try:
            yield context
        finally:
            context.close()


# JavaScript run in the page once it has loaded: every image loaded, every equation typeset
# (the same wait as dev.py's before it prints the book; dev.py imports only the standard library)
_spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
dev = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dev)
WAIT_FOR_IMAGES_AND_MATH = dev.PRINT_READY
BROKEN_IMAGES = """() => [...document.images]
    .filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src)"""
UNTYPESET_MATH = """() => [...document.querySelectorAll('.math, div.math, span.math')]
    .filter(el => !el.querySelector('mjx-container')).map(el => el.textContent.slice(0, 80))"""
MATH_ERRORS = """() => [...document.querySelectorAll('mjx-merror')]
    .map(el => el.getAttribute('data-mjx-error') || el.textContent.slice(0, 80))"""
SIDEBAR_LINKS = """() => [...document.querySelectorAll(
    '.bd-sidebar-primary a[href], nav.bd-links a[href], .navbar-brand[href]')].map(a => a.href)"""
ALL_LINKS = "() => [...document.querySelectorAll('a[href]')].map(a => a.href)"
RESOURCES = """() => [
    ...[...document.querySelectorAll('script[src], img[src], iframe[src], source[src], '
        + 'video[src], audio[src], embed[src]')].map(el => el.src),
    ...[...document.querySelectorAll('link[href]')]
        .filter(el => !['canonical', 'alternate', 'author', 'license', 'search', 'index',
                        'next', 'prev', 'help'].includes((el.rel || '').toLowerCase()))
        .map(el => el.href),
]"""


# What does not fit the screen. An element sticks out when its box reaches past the viewport's
# right edge and no box around it scrolls sideways within the viewport: it widens the page,
# or it is cut off (an `overflow: hidden` box around it hides its end).
OVERFLOW = """() => {
    const vw = document.documentElement.clientWidth;
    const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
    // inside a box that scrolls it is readable (that box is checked itself); a box that
    // hides what overflows it cuts the element off if the element reaches past that box
    const fits = el => { const right = el.getBoundingClientRect().right;
        for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
            if (scrolls(a)) return true;
            if (getComputedStyle(a).overflowX !== 'visible'
                && right > a.getBoundingClientRect().right + 1) return false;
        }
        return false; };
    const name = el => el.tagName.toLowerCase() + (el.className && el.className.baseVal
        === undefined ? '.' + String(el.className).trim().split(/\\s+/).join('.') : '');
    const out = [...document.querySelectorAll('.bd-article-container *')].filter(el => {
        const r = el.getBoundingClientRect();
        // MathJax's hidden copy for screen readers is clipped to nothing, never seen
        return r.width > 0 && r.height > 0 && r.right > vw + 1
            && !el.closest('mjx-assistive-mml') && !fits(el);
    });
    // report the outermost offenders only
    const top = out.filter(el => !out.includes(el.parentElement));
    return {page: document.documentElement.scrollWidth, viewport: vw,
            sticking_out: top.slice(0, 5).map(el => `${name(el.parentElement)} > ${
                name(el)} to x=${
                Math.round(el.getBoundingClientRect().right)}`)};
}"""
# a code cell, or what a cell printed (book/_static/lnbook.css wraps printed output)
SCROLLING_CODE = """() => [...document.querySelectorAll('div.cell_input pre, div.cell_output pre')]
    .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
    .map(pre => `${pre.scrollWidth - pre.clientWidth}px too wide: ` +
                pre.textContent.split('\\n').reduce((a, b) => b.length > a.length ? b : a))"""
LEDGER_TABLES = """() => [...document.querySelectorAll('table.claims-ledger')].map(t => ({
    table: Math.round(t.getBoundingClientRect().width),
    column: Math.round(t.closest('article').getBoundingClientRect().width),
    scrolls: t.parentElement.scrollWidth > t.parentElement.clientWidth + 1,
    cells: [...t.querySelectorAll('td, th')].filter(c => c.scrollWidth > c.clientWidth + 1)
        .length,
    // every claim's row is followed by its "seen" sentence on a row across the whole table
    claims: t.querySelectorAll('tbody tr.claim').length,
    seen: [...t.querySelectorAll('tbody tr.claim + tr.claim-seen')].filter(r =>
        r.cells.length === 1 && r.cells[0].colSpan === t.querySelector('thead tr').cells.length
        && r.cells[0].textContent.startsWith('Seen when the book was built')).length}))"""
# a figure in a chapter's output: its size on screen against its size as drawn
FIGURES = """() => [...document.querySelectorAll('div.cell_output img, figure img')]
    .filter(img => img.naturalWidth > 0)
    .map(img => ({src: img.src.split('/').pop(), shown: img.getBoundingClientRect().width,
                  drawn: img.naturalWidth}))"""
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
# on a phone a figure is shown at least this wide (or as drawn, if smaller), in a box that
# scrolls: a 13-inch figure's 10-point labels are then about 8 pixels tall instead of 4
PHONE_FIGURE_WIDTH = 700


def _page_path(url: str, base: str) -> str | None:
    """The file under HTML that a same-site URL points to, or None for another site."""
    if not url.startswith(base):
        return None
    path = unquote(urlsplit(url).path).lstrip("/")
    return path + "index.html" if path == "" or path.endswith("/") else path


@pytest.mark.parametrize("page", PAGES)
def test_page_as_a_reader_sees_it(page: str, site: str, browser) -> None:
    url = f"{site}/{page}.html"
    errors: list[str] = []
    remote: list[str] = []
    tab = browser.new_page()
    tab.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    tab.on("request", lambda r: None if is_local(r.url) else remote.append(r.url))
    tab.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400
           else None)
    try:
        response = tab.goto(url, wait_until="load")
        assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"
        tab.evaluate(WAIT_FOR_IMAGES_AND_MATH)
        assert not errors, f"{page}: JavaScript errors {errors}"
        assert tab.title().strip(), f"{page}: empty <title>"
        heading = tab.locator("article h1, main h1").first
        assert heading.count() and heading.inner_text().strip(), f"{page}: no <h1> heading"

        assert tab.evaluate(BROKEN_IMAGES) == [], f"{page}: images that did not load"
        assert tab.evaluate(UNTYPESET_MATH) == [], f"{page}: equations MathJax did not typeset"
        assert tab.evaluate(MATH_ERRORS) == [], f"{page}: MathJax errors"

        listed = {_page_path(u, site) for u in tab.evaluate(SIDEBAR_LINKS)}
        missing = [p for p in PAGES if f"{p}.html" not in listed]
        assert not missing, f"{page}: sidebar does not list {missing}"

        dead = sorted({p for u in tab.evaluate(ALL_LINKS)
                       if (p := _page_path(u, site)) and not (HTML / p).is_file()})
        assert not dead, f"{page}: internal links to missing pages {dead}"

        check_fits_the_screen(tab, page)

        # late requests (fonts) reach the listeners while the checks above run; some pages
        # never go idle, so wait a little more here, not the whole default
        try:
            tab.wait_for_load_state("networkidle", timeout=1_000)
        except sync_api.TimeoutError:
            pass
        remote_resources = [u for u in tab.evaluate(RESOURCES) if not is_local(u)]
        assert not remote_resources, f"{page}: resources from remote hosts {remote_resources}"
        assert not remote, f"{page}: requests to remote hosts {remote}"
        assert not errors, f"{page}: JavaScript errors {errors}"
    finally:
        tab.close()


def check_fits_the_screen(tab, page: str) -> None:
    """The loaded page fits at 1280 pixels and at 390 (a phone): see the module docstring."""
    for viewport in (DESKTOP, PHONE):
        tab.set_viewport_size(viewport)
        tab.evaluate("() => new Promise(done => requestAnimationFrame(() => "
                     "requestAnimationFrame(done)))")
        width = viewport["width"]
        fit = tab.evaluate(OVERFLOW)
        assert fit["page"] <= fit["viewport"] and not fit["sticking_out"], (
            f"{page} at {width} px: the page is {fit['page']} px wide for a {fit['viewport']} px"
            f" window; sticking out (not in a box of its own that scrolls): "
            f"{fit['sticking_out']}")
        for t in tab.evaluate(LEDGER_TABLES):
            assert t["claims"] and t["seen"] == t["claims"], (
                f"{page}: a claims-ledger row lacks its full-width 'seen' row {t}")
            assert t["table"] <= t["column"] and not t["scrolls"] and not t["cells"], (
                f"{page} at {width} px: a claims-ledger table does not fit its column {t}")
        if viewport is DESKTOP:
            wide = tab.evaluate(SCROLLING_CODE)
            assert not wide, f"{page} at {width} px: code or output scrolls sideways: {wide}"
        else:
            small = [f for f in tab.evaluate(FIGURES)
                     if f["shown"] < min(PHONE_FIGURE_WIDTH, f["drawn"]) - 1]
            assert not small, f"{page} at {width} px: figures shrunk past reading: {small}"


def test_screenshots(site: str, browser) -> None:
    """Full-page screenshots of the intro and of one experiment chapter, for the CI log."""
    shots = screenshot_pages()
    assert len(shots) == 2, f"no chapter in {PAGES} has a figure to photograph"
    SHOTS.mkdir(parents=True, exist_ok=True)
    for page, name in shots.items():
        tab = browser.new_page()
        try:
            tab.goto(f"{site}/{page}.html", wait_until="load")
            tab.evaluate(WAIT_FOR_IMAGES_AND_MATH)
            tab.screenshot(path=str(SHOTS / name), full_page=True)
        finally:
            tab.close()
        assert (SHOTS / name).stat().st_size > 10_000, f"{name} looks empty"
