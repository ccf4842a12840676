"""Point every "[docs]" link of the highlighted source pages at an entry that exists.

``sphinx.ext.viewcode`` gives each module's source page one anchor prefix for all its
"[docs]" links: the name of the first documented module that showed one of its objects. The API
page documents `lnbook.norms` (which re-exports checks from `lnbook.checks`) before
`lnbook.checks`, so the source of `lnbook.checks` linked `api.html#lnbook.norms.ShapeError`, an
entry that does not exist (the class is documented as `lnbook.checks.ShapeError`); an object a
module re-exports without documenting it in its own module (`stream_variance`, documented under
`lnbook.experiments.peri_ln`) had the same fault. This extension rewrites each such link to
the entry that documents that very object: the one under its own module when there is one,
else the module that re-exports it (found by ``tests/test_site_links.py``).

viewcode writes a module's page only when the module's file is newer than the page, so a page
would keep links to entries that the API page has since moved; every build starts without the
old pages (writing them all takes seconds).
"""

from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

_BACKLINK = re.compile(r'(<div class="viewcode-block" id="(?P<name>[^"]+)">\s*'
                       r'<a class="viewcode-back" href=")(?P<href>[^"]*)(")')


def _resolve(dotted: str) -> object:
    """The object a dotted name of a documented Python entry stands for (None if unknown)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _entry(objects: dict, modname: str, name: str) -> object | None:
    """The Python domain's entry for `modname.name`, else for a re-export of the same object."""
    own = f"{modname}.{name}"
    if own in objects:
        return objects[own]
    target = _resolve(own)
    if target is None:
        return None
    suffix = "." + name
    for fullname, entry in sorted(objects.items()):
        if fullname.endswith(suffix) and _resolve(fullname) is target:
            return entry
    return None


def _fix_backlinks(app, pagename, templatename, context, doctree) -> None:
    if not pagename.startswith("_modules/") or "body" not in context:
        return
    modname = pagename.removeprefix("_modules/").replace("/", ".")
    objects = app.env.get_domain("py").objects

    def fix(m: re.Match) -> str:
        entry = _entry(objects, modname, m["name"])
        if entry is None:
            return m[0]
        href = app.builder.get_relative_uri(pagename, entry.docname) + "#" + entry.node_id
        return m[1] + href + m[4]

    context["body"] = _BACKLINK.sub(fix, context["body"])


def _fresh_pages(app) -> None:
    if app.builder.format == "html":
        shutil.rmtree(Path(app.outdir) / "_modules", ignore_errors=True)


def setup(app):
    app.connect("builder-inited", _fresh_pages)
    app.connect("html-page-context", _fix_backlinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
