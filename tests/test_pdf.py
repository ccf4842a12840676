"""The book's PDF, made as `python3 dev.py pdf` makes it, opened as a reader gets it.

`test_pdf_of_the_whole_book` makes the PDF from the same build's executed notebooks (skipped
when there are none) and checks that it has every page of `_toc.yml` as a chapter in its
outline and that the book's download menu links to it. It uses the server and the headless
Chromium of `test_browser.py` (same requirements, same skips); it is a file of its own so that
pytest-xdist's `--dist loadfile` runs it on another worker than the page-by-page checks.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys

import pytest
import test_browser
from test_browser import CHROMIUM, EXPERIMENT_PAGE, HTML, PAGES, ROOT

site, browser = test_browser.site, test_browser.browser  # its fixtures, for this file's test


def _pdf_string(token: bytes) -> str:
    """A PDF string object, literal `(...)` or hex `<...>` (UTF-16 with a byte-order mark)."""
    if token.startswith(b"<"):
        raw = bytes.fromhex(token[1:-1].decode())
        return raw[2:].decode("utf-16-be") if raw.startswith(b"\xfe\xff") else raw.decode("latin-1")
    body = re.sub(rb"\\([0-7]{1,3})", lambda m: bytes([int(m[1], 8)]), token[1:-1])
    body = re.sub(rb"\\(.)", rb"\1", body)
    return body.decode("utf-16-be")[1:] if body.startswith(b"\xfe\xff") else body.decode("latin-1")


def pdf_outline(data: bytes) -> list[str]:
    """The titles of a PDF's outline (its bookmarks), as Chromium writes them."""
    return [_pdf_string(t) for t in
            re.findall(rb"/Title\s*(\((?:\\.|[^\\)])*\)|<[0-9A-Fa-f\s]*>)", data)]


def _norm(text: str) -> str:
    """`text` without white space (Chromium drops the spaces where a heading's line broke)."""
    text = text.replace("\ufeff", "").replace("\u2019", "'").replace("#", "")
    return "".join(text.split())


def page_title(page: str) -> str:
    """The <h1> of a built page, as text."""
    match = re.search(r"<h1[^>]*>(.*?)</h1>", (HTML / f"{page}.html").read_text(), re.S)
    assert match, f"{page}.html has no <h1>"
    return _norm(html.unescape(re.sub(r"<[^>]+>", "", match[1])))


def test_pdf_of_the_whole_book(site: str, browser) -> None:
    build = HTML.parent
    if not (build / ".jupyter_cache").is_dir():
        pytest.skip(f"no executed notebooks in {build / '.jupyter_cache'} to print: run "
                    "python3 dev.py book first (python3 dev.py pdf prints that build)")
    made = subprocess.run(
        [sys.executable, "-c", f"import dev; dev.make_pdf(output={str(build.parent)!r})"],
        cwd=ROOT, env={**os.environ, "LNBOOK_CHROMIUM": CHROMIUM}, capture_output=True,
        text=True)
    assert made.returncode == 0, f"dev.make_pdf failed:\n{made.stdout[-3000:]}{made.stderr[-3000:]}"
    pdf = build / "pdf" / "lnbook.pdf"
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF"), f"{pdf} is no PDF"
    pages = len(re.findall(rb"/Type\s*/Page\b", data))
    assert pages >= 3 * len(PAGES), f"{pdf}: {pages} pages for {len(PAGES)} chapters"
    outline = [_norm(t) for t in pdf_outline(data)]
    missing = [p for p in PAGES if not any(page_title(p) in entry for entry in outline)]
    assert not missing, f"{pdf}: no chapter in its outline for {missing}"

    # the book links to it: every page's download menu offers the PDF instead of printing
    assert (HTML / "lnbook.pdf").read_bytes() == data
    tab = browser.new_page()
    try:
        tab.goto(f"{site}/{EXPERIMENT_PAGE}.html", wait_until="load")
        link = tab.locator("a.btn-download-book-pdf")
        link.wait_for(state="attached", timeout=10_000)
        assert link.get_attribute("href") == f"{site}/lnbook.pdf"
        response = tab.request.get(f"{site}/lnbook.pdf")
        assert response.ok and response.body() == data
        assert not tab.locator("button.btn-download-pdf-button").count()
    finally:
        tab.close()
