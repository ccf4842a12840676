"""The built site, read as files: every internal link and anchor resolves, and printed output
is laid out for the column at 1280 pixels.

Reads `_build/html` (or `LNBOOK_HTML`); the link test is skipped when no book has been built.
Needs no browser (tests/test_browser.py checks the rendered pages in Chromium, among them that
no printed output scrolls sideways at 1280 pixels) and takes seconds.

- Every `href` to a page of the site names a file that exists, and its `#fragment`, if any, is
  an `id` (or an old-style `<a name>`) in that page: a link into the API reference or into the
  highlighted source of `lnbook` lands on its target.
- book/_static/lnbook.css wraps printed output (a `<pre>` inside `div.cell_output`) at the
  column's edge. The long outputs the chapters print on purpose are laid out by
  `lnbook.display` in lines of at most `OUTPUT_CHARS` characters: the css sets the code of a
  page at 13 px in a 736-pixel column at 1280 pixels, where 88 characters take about 690
  pixels. `wide_outputs()` lists the longer lines of a built book (what would wrap).
"""

from __future__ import annotations

import functools
import html
import importlib.util
import os
import re
from collections import namedtuple
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("LNBOOK_HTML", ROOT / "_build" / "html")).resolve()
OUTPUT_CHARS = 88  # book/_static/lnbook.css: 88 characters at 13 px fit the column at 1280 px

CSS = ROOT / "book" / "_static" / "lnbook.css"
built = pytest.mark.skipif(not (HTML / "index.html").exists(),
                           reason=f"no built book in {HTML} (jupyter-book build .)")


class _Page(HTMLParser):
    """The ids, links and printed outputs of one page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.outputs: list[str] = []
        self._stack: list[tuple[str, bool]] = []  # (tag, inside a cell's output)
        self._pre: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if a.get(key):
                self.ids.add(a[key])
        if tag in ("a", "link") and a.get("href"):
            self.links.append(a["href"])
        if tag in ("br", "img", "meta", "link", "input", "hr", "wbr", "source"):
            return  # void elements: no end tag
        out = bool(self._stack and self._stack[-1][1]) or "cell_output" in (a.get("class") or "")
        self._stack.append((tag, out))
        if tag == "pre" and out:
            self._pre = []

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            t, _ = self._stack.pop()
            if t == tag:
                break
        if tag == "pre" and self._pre is not None:
            self.outputs.append("".join(self._pre))
            self._pre = None

    def handle_data(self, data: str) -> None:
        if self._pre is not None:
            self._pre.append(data)


@functools.cache
def _read(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _pages() -> list[Path]:
    return sorted(p for p in HTML.rglob("*.html") if "_static" not in p.parts)


def _target(page: Path, href: str) -> tuple[Path, str] | None:
    """The local file and fragment `href` on `page` points at; None for another site."""
    parts = urlsplit(html.unescape(href))
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
        return None
    path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if path.is_dir():
        path = path / "index.html"
    return path, unquote(parts.fragment)


def broken_links() -> list[str]:
    """Every internal link of the site whose page or anchor does not exist."""
    broken = []
    for page in _pages():
        for href in _read(page).links:
            target = _target(page, href)
            if target is None:
                continue
            path, fragment = target
            where = f"{page.relative_to(HTML)}: {href}"
            if not path.exists():
                broken.append(f"{where} (no file {path.relative_to(ROOT)})")
            elif fragment and path.suffix == ".html" and fragment not in _read(path).ids:
                broken.append(f"{where} (no id {fragment!r} in {path.name})")
    return broken


def wide_outputs(limit: int = OUTPUT_CHARS) -> list[str]:
    """Every printed output line of the site longer than `limit` characters."""
    wide = []
    for page in _pages():
        for text in _read(page).outputs:
            for line in text.splitlines():
                line = re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip()
                if len(line) > limit:
                    wide.append(f"{page.relative_to(HTML)}: {len(line)} chars: {line[:60]}...")
    return wide


def test_parser_reads_ids_links_and_outputs() -> None:
    page = _Page()
    page.feed('<section id="s"><a name="old"></a><a href="x.html#y">x</a>'
              '<div class="cell_output docutils"><div class="highlight"><pre>'
              '<span>a</span>b\nc &lt;d&gt;</pre></div></div><pre>code</pre></section>')
    assert page.ids == {"s", "old"}
    assert page.links == ["x.html#y"]
    assert page.outputs == ["ab\nc <d>"]  # a code cell's input is not an output


@built
def test_every_internal_link_and_anchor_resolves() -> None:
    broken = broken_links()
    assert not broken, f"{len(broken)} broken internal links:\n" + "\n".join(broken[:40])


def _load_extension():
    spec = importlib.util.spec_from_file_location(
        "viewcode_backlinks", ROOT / "book" / "_ext" / "viewcode_backlinks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_source_pages_link_to_the_entry_that_documents_each_object():
    ext = _load_extension()
    entry = namedtuple("ObjectEntry", "docname node_id objtype aliased")
    objects = {name: entry("book/api", name, "function", False) for name in (
        "lnbook.norms.check_eps", "lnbook.checks.check_eps", "lnbook.checks.ShapeError",
        "lnbook.experiments.peri_ln.stream_variance")}
    app = SimpleNamespace(
        env=SimpleNamespace(get_domain=lambda name: SimpleNamespace(objects=objects)),
        builder=SimpleNamespace(get_relative_uri=lambda page, doc: "../" * page.count("/")
                                + doc + ".html"))

    def block(name: str, href: str) -> str:
        return (f'<div class="viewcode-block" id="{name}">\n'
                f'<a class="viewcode-back" href="{href}">[docs]</a>\n')

    def fixed(page: str, name: str, href: str) -> str:
        context = {"body": block(name, href)}
        ext._fix_backlinks(app, page, "page.html", context, None)
        return re.search(r'href="([^"]+)"', context["body"])[1]

    # viewcode's one prefix per module: the first module that showed one of its objects
    assert (fixed("_modules/lnbook/checks", "ShapeError", "../../book/api.html#lnbook.norms.Sh")
            == "../../book/api.html#lnbook.checks.ShapeError")
    # an object documented only where it is re-exported: the re-export's entry
    assert (fixed("_modules/lnbook/experiments/seq_tasks", "stream_variance", "x#y")
            == "../../../book/api.html#lnbook.experiments.peri_ln.stream_variance")
    # nothing documents it: the link is left as viewcode wrote it
    assert fixed("_modules/lnbook/checks", "no_such_name", "keep#me") == "keep#me"


def css_rules(css: str) -> list[tuple[str, str, str]]:
    """``(media, selectors, declarations)`` of every rule of a style sheet (one level of
    ``@media``; media is "" outside one)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules, media, depth, start = [], [""], 0, 0
    for m in re.finditer(r"[{}]", css):
        if m[0] == "{":
            head = css[start:m.start()].strip()
            if head.startswith("@media"):
                media.append(head)
            else:
                body_end = css.index("}", m.end())
                rules.append((media[-1], head, css[m.end():body_end]))
            depth += 1
        else:
            depth -= 1
            if len(media) > depth + 1:
                media.pop()
        start = m.end()
    return rules


def test_css_rules_are_read_with_their_media():
    css = "a, b { color: red; }\n/* x { } */\n@media print {\n  c { top: 0; }\n}\nd { left: 0 }"
    assert css_rules(css) == [("", "a, b", " color: red; "), ("@media print", "c", " top: 0; "),
                              ("", "d", " left: 0 ")]


def test_printed_output_wraps_at_the_column_on_every_screen():
    wraps = [sel for media, sel, body in css_rules(CSS.read_text())
             if not media and "div.cell_output pre" in [s.strip() for s in sel.split(",")]
             and re.search(r"white-space:\s*pre-wrap", body)
             and re.search(r"overflow-wrap:\s*anywhere", body)]
    assert wraps, f"{CSS.name} does not wrap printed output (div.cell_output pre) on screens"


def test_the_column_width_and_lnbook_display_agree():
    from lnbook import display

    assert display.WIDTH == OUTPUT_CHARS
    assert "88 characters" in CSS.read_text()  # the width the css promises for code
