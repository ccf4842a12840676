"""Serve MathJax from the built book itself, so equations typeset with no network.

The PyPI package ``sphinx-mathjax-offline`` ships MathJax 3 but installs it under a folder
name Python cannot import; this extension finds those files through the package metadata,
points Sphinx's ``mathjax_path`` at the local copy and copies it into ``_static/mathjax``.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from sphinx.errors import ExtensionError
from sphinx.util.fileutil import copy_asset


def _mathjax_dir() -> Path:
    try:
        dist = distribution("sphinx-mathjax-offline")
    except PackageNotFoundError as err:
        raise ExtensionError("install sphinx-mathjax-offline (see requirements.txt)") from err
    for f in dist.files or []:
        if str(f).replace(os.sep, "/").endswith("static/mathjax/tex-chtml.js"):
            return Path(dist.locate_file(f)).parent
    raise ExtensionError("sphinx-mathjax-offline is installed but its tex-chtml.js is missing")


def _copy(app, exc) -> None:
    if exc is None and app.builder.format == "html":
        copy_asset(str(_mathjax_dir()), os.path.join(app.outdir, "_static", "mathjax"))


def setup(app):
    _mathjax_dir()  # fail early, with a clear message
    app.config.mathjax_path = "mathjax/tex-chtml.js"
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
