"""Drop repeated <script> tags from every page of the book.

sphinx-thebe 0.3 (pulled in by Jupyter Book 1) and sphinx-togglebutton register their inline
configuration scripts twice under Sphinx 7, so each page declares ``const THEBE_JS_URL`` twice
and the browser raises "Identifier 'THEBE_JS_URL' has already been declared" on every page
(found by ``tests/test_browser.py``). This extension keeps the first of identical scripts.
"""

from __future__ import annotations


def _dedupe(app, pagename, templatename, context, doctree) -> None:
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    unique = []
    for js in context.get("script_files", []):
        filename = getattr(js, "filename", js) or ""  # inline scripts come as None or ""
        attributes = getattr(js, "attributes", {})
        key = (str(filename), tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _dedupe, priority=900)  # after the themes add theirs
    return {"parallel_read_safe": True, "parallel_write_safe": True}
