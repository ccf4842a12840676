"""Checks on the book's sources that need no build: the claims ledger, the notebooks, the toc.

- every row of `lnbook/claims.yml` points at a chapter in `_toc.yml`, and so do the reader
  questions (the ledger's records and verdicts are checked in `test_ledger.py`).
- Every notebook in `book/` is committed without outputs or execution counts, starts with the
  Colab cell (tagged `remove-input`) that `python3 dev.py sync` writes (lnbook from `_config.yml`'s
  repository.url at the release of pyproject's version, with the `data` extra where the chapter
  needs it), and is listed in `_toc.yml`.
- Code cells fit the page: lines of at most 88 characters, cells of at most 40 lines.
- Every equation label `(eq-N)=` is defined once, and every `{ref}` to one and every `{cite}` key
  has a target.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from jupyter_cache import get_cache

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
LEDGER = ROOT / "lnbook" / "claims.yml"
TOC = ROOT / "_toc.yml"

def load_dev():
    """`dev.py` at the repository root, as a module (it imports only the standard library)."""
    spec = importlib.util.spec_from_file_location("lnbook_dev", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def dev_module():
    return load_dev()


def colab_cell(nb) -> str:
    """The Colab cell a notebook starts with: `dev.py sync` makes it from the notebook's code."""
    return dev_module().colab_cell(nb.cells)


def toc_files() -> list[str]:
    """Every document of `_toc.yml` as a path relative to the repository root, without suffix."""
    toc = yaml.safe_load(TOC.read_text())
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(f).with_suffix("")) if Path(f).suffix in {".md", ".ipynb"} else f
            for f in files]


def load_ledger() -> dict:
    return yaml.safe_load(LEDGER.read_text())


NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
SOURCES = sorted(BOOK.glob("*.md")) + NOTEBOOKS


def markdown_text(path: Path) -> str:
    """The markdown of a MyST page, or of all markdown cells of a notebook."""
    if path.suffix == ".md":
        return path.read_text()
    nb = nbformat.read(path, as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


# --- the claims ledger ---------------------------------------------------------------------


@pytest.mark.parametrize("row", load_ledger()["claims"], ids=lambda r: r["id"])
def test_ledger_row_points_at_a_chapter_of_the_book(row):
    """The rest of the ledger's checks (records, verdicts, headings) are in test_ledger.py."""
    assert f"book/{row['chapter']}" in toc_files(), (
        f"{row['id']}: chapter {row['chapter']!r} is not in _toc.yml"
    )


def test_ledger_reader_questions_point_into_the_book():
    questions = load_ledger()["questions"]
    assert len(questions) == 4
    for q in questions:
        assert q["question"].strip()
        assert f"book/{q['chapter']}" in toc_files(), f"{q['chapter']!r} is not in _toc.yml"


def test_ledger_questions_name_a_heading_of_their_chapter():
    """A question's `where` is a heading that exists in the chapter (so the ledger links it)."""
    ledger = load_ledger()
    for row in ledger["questions"]:
        where = str(row.get("where", "pending")).strip()
        chapter = next(BOOK.glob(f"{row['chapter']}.*"), None)
        if where == "pending" or chapter is None:
            continue
        headings = re.findall(r"^#+\s+(.+?)\s*$", markdown_text(chapter), flags=re.M)
        assert where in headings, f"{row.get('id', 'question')}: no heading {where!r} in {chapter}"


# --- notebooks and the table of contents ---------------------------------------------------


def test_toc_documents_exist():
    for f in toc_files():
        assert (ROOT / f"{f}.ipynb").exists() or (ROOT / f"{f}.md").exists(), f"{f} is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_colab_cell(path):
    """The first code cell installs lnbook (and what the chapter needs) on Colab."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    fix = "run `python3 dev.py sync` to write it"
    assert code[0].source == colab_cell(nb), (
        f"{path.name}: the first code cell is not the Colab cell; {fix}"
    )
    assert "remove-input" in code[0].metadata.get("tags", []), (
        f"{path.name}: the Colab cell lacks the tag remove-input; {fix}"
    )


def test_colab_cell_installs_the_release_from_the_configured_repository():
    """The repository URL is written once, in _config.yml, the version once, in pyproject.toml;
    the Colab cell installs that release (its tag), with the data extra where it is needed."""
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    assert url.startswith("https://") and dev_module().repository_url() == url
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    pin = f"git+{url}@v{version}"
    for name, extra in (("06_6_mnist", "[data]"), ("01_introduction", "")):
        nb = nbformat.read(BOOK / f"{name}.ipynb", as_version=4)
        assert colab_cell(nb).splitlines()[-1] == f'    %pip install -q "lnbook{extra} @ {pin}"'


# what a chapter may import: the standard library, lnbook and its dependencies, IPython (every
# kernel has it); scipy, scikit-learn and mlxtend only where its Colab cell asks for lnbook[data]
PLAIN_INSTALL = {"lnbook", "torch", "numpy", "matplotlib", "tqdm", "yaml", "IPython"}
DATA_EXTRA = {"scipy", "sklearn", "mlxtend"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_imports_only_what_its_colab_cell_installs(path):
    """A chapter runs from a plain install (Colab, Binder, a reader's folder): the myst_nb of
    the book's build, for example, is not there."""
    import ast

    dev = dev_module()
    code = dev.chapter_code(nbformat.read(path, as_version=4).cells)
    tree = ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                               for line in code.splitlines()))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    allowed = PLAIN_INSTALL | set(sys.stdlib_module_names)
    allowed |= DATA_EXTRA if dev.needs_data(code) else set()
    assert imported <= allowed, (
        f"{path.name} imports {sorted(imported - allowed)}, which `pip install lnbook"
        f"{'[data]' if dev.needs_data(code) else ''}` does not bring")


@pytest.mark.parametrize("code, data", [
    ("from lnbook.experiments import mnist", True),
    ("from lnbook.experiments import convnet, mean_after_start", True),
    ("from lnbook.experiments import order_embeddings as oe", True),
    ("from lnbook import layer_norm, why", True),
    ("from lnbook.data import load_digits_tensor", True),
    ("images = lnbook.load_mnist(split='train').images", True),
    ("def hull(points):\n    from scipy.spatial import ConvexHull", True),
    ("from lnbook.experiments import rmsnorm\nimport numpy as np", False),
    ("why = r['unavailable'][key]  # a variable, not lnbook.why", False),
    ("# the mnist chapter, named in a comment", False),
    ("from lnbook.experiments import (\n    rmsnorm,\n    mnist,\n)", True),
    ("import lnbook\nx = lnbook.experiments.draw.get_config('quick')", True),
    ("%pip install -q mlxtend\nprint('load_mnist')", False),
])
def test_data_extra_is_asked_for_by_what_the_chapter_imports(code, data):
    assert dev_module().needs_data(code) is data


# Code cells fit the page: CONTRIBUTING.md asks for lines of at most 88 characters (the width
# the HTML shows without a scroll bar) and cells of about 25 lines; 40 is a generous bound.
MAX_LINE = 88
MAX_CELL_LINES = 40
def code_cells(path: Path) -> list[tuple[int, str]]:
    """(index among all cells, source) of every code cell of a notebook."""
    nb = nbformat.read(path, as_version=4)
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_page(path):
    long = [
        f"cell {i} line {n}: {len(line)} characters: {line.strip()[:60]}"
        for i, source in code_cells(path)
        for n, line in enumerate(source.splitlines(), start=1)
        if len(line) > MAX_LINE
    ]
    assert not long, (
        f"{path.name}: {len(long)} code line(s) longer than {MAX_LINE} characters:\n"
        + "\n".join(long)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_cells_are_short(path):
    long = [
        f"cell {i}: {n} lines"
        for i, source in code_cells(path)
        if (n := len(source.rstrip().splitlines())) > MAX_CELL_LINES
    ]
    assert not long, (
        f"{path.name}: code cells longer than {MAX_CELL_LINES} lines (move the logic into "
        f"lnbook, where it is unit-tested): " + ", ".join(long)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_in_toc(path):
    assert f"book/{path.stem}" in toc_files(), f"{path.name} is not in _toc.yml"


# --- cross references ----------------------------------------------------------------------


def test_equation_labels_defined_once_and_resolved():
    defined: dict[str, list[str]] = {}
    referenced: dict[str, set[str]] = {}
    for path in SOURCES:
        text = markdown_text(path)
        for label in re.findall(r"^\((eq-\d+)\)=\s*$", text, flags=re.M):
            defined.setdefault(label, []).append(path.name)
        for label in re.findall(r"<(eq-\d+)>`", text):
            referenced.setdefault(label, set()).add(path.name)
    twice = {k: v for k, v in defined.items() if len(v) > 1}
    assert not twice, f"equation labels defined more than once: {twice}"
    missing = {k: sorted(v) for k, v in referenced.items() if k not in defined}
    assert not missing, f"equation references without a target: {missing}"


# a reference MyST resolves by label: {ref}`text <label>`, {numref}, {eq}, [text](#label)
_LABEL_REFS = re.compile(r"\{(?:ref|numref|eq)\}`(?:[^`<]*<)?(?P<role>[^`<>]+)>?`"
                         r"|\]\(#(?P<link>[^)\s]+)\)")


def labels_and_references(text: str) -> tuple[set[str], list[str]]:
    """The labels a page's markdown defines (`(label)=`, a directive's `:label:` or `label:`)
    and the labels its references name, in order."""
    defined = set(re.findall(r"^\(([^)\s]+)\)=\s*$", text, flags=re.M))
    defined |= set(re.findall(r"^\s*:?label:\s*(\S+)\s*$", text, flags=re.M))
    refs = [(m["role"] or m["link"]).strip() for m in _LABEL_REFS.finditer(text)]
    return defined, refs


def test_labels_and_references_are_read_from_markdown():
    text = ("(eq-1)=\n$$x$$\n```{math}\n:label: eq-9\n```\nsee {ref}`(1) <eq-1>`, "
            "{eq}`eq-9`, {numref}`Book fig. %s <fig-a>`, [](#eq-2) and [(3)](other.ipynb#s)")
    assert labels_and_references(text) == ({"eq-1", "eq-9"}, ["eq-1", "eq-9", "fig-a", "eq-2"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_references_resolve_inside_the_notebook(path):
    """JupyterLab (jupyterlab-myst) renders a notebook alone: a {ref} to a label of another
    chapter is "Cross reference target was not found" there. A chapter names another chapter's
    equation with a link to the section that holds it, `[(2)](02_background.ipynb#slug)`, which
    both JupyterLab and the book resolve (the slug is checked by the build's nitpicky run)."""
    defined, refs = labels_and_references(markdown_text(path))
    foreign = sorted({r for r in refs if r not in defined})
    assert not foreign, (f"{path.name} refers to labels it does not define: {foreign}; link to "
                         "the section of the chapter that defines them instead")


def test_cite_keys_exist_in_bibliography():
    keys = set(re.findall(r"^@\w+\{([^,\s]+),", (BOOK / "references.bib").read_text(), re.M))
    for path in SOURCES:
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", markdown_text(path)):
            for key in (k.strip() for k in group.split(",")):
                assert key in keys, f"{path.name}: cite key {key!r} not in references.bib"


def _notebooks(folder: Path, sources: dict, alone: tuple = ()) -> list[Path]:
    """Write one-cell notebooks `folder/NAME.ipynb`; the names in `alone` ask to run alone."""
    folder.mkdir()
    for name, source in sources.items():
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        if name in alone:
            nb.metadata["lnbook"] = {"run_alone": True}
        nbformat.write(nb, folder / f"{name}.ipynb")
    return sorted(folder.glob("*.ipynb"))


def _environment() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("LNBOOK_") and k != "OMP_NUM_THREADS"}


def test_notebooks_that_train_in_processes_execute_alone_and_first(tmp_path):
    """A notebook with `run_alone` metadata gets the machine to itself (and torch's default
    threads) before the others run, two at a time, one torch thread per kernel."""
    dev = load_dev()
    probe = "import os, time\nprint(os.environ.get('OMP_NUM_THREADS'), time.time())"
    # the cache finds a notebook by its code, so each one's code must differ
    paths = _notebooks(tmp_path / "book", {n: f"# {n}\n{probe}"
                                           for n in ("alone", "shared1", "shared2")},
                       alone=("alone",))
    assert dev.runs_alone(paths[0]) and not dev.runs_alone(paths[1])
    ran = dev.execute_in_folders([(p, Path(sys.executable)) for p in paths], tmp_path / "out",
                                 _environment(), workers=2, save=True)
    seen = {}
    for name, result in ran.items():
        assert result["ok"], result["problem"]
        threads, when = nbformat.read(result["executed"], 4).cells[0].outputs[0]["text"].split()
        seen[name] = (threads, float(when))
    assert seen["alone"][0] == "None"
    assert seen["shared1"][0] == seen["shared2"][0] == "1"
    assert seen["alone"][1] < min(seen["shared1"][1], seen["shared2"][1])


def test_the_notebooks_book_executed_fill_the_cache_that_the_build_reads(tmp_path, monkeypatch,
                                                                           capsys):
    """`dev.py book` runs the notebooks as the routes check does, keeping each executed
    notebook; one that ran is found in the cache by its content with the outputs its kernel
    printed (as Jupyter Book looks it up), one that failed is not (so the build executes it
    again and shows its error)."""
    dev = load_dev()
    paths = _notebooks(tmp_path / "book", {"good": "print(6 * 7)\n6 * 7",
                                           "bad": "raise ValueError('boom')"})
    monkeypatch.setattr(dev, "ROOT", tmp_path)
    monkeypatch.setattr(dev, "BOOK", tmp_path / "book")
    ran = dev.execute_in_folders([(p, Path(sys.executable)) for p in paths], tmp_path / "out",
                                 _environment(), workers=2, save=True)
    printed = capsys.readouterr().out
    assert "good: " in printed and "bad: " in printed and "FAILED" in printed
    assert "ValueError: boom" in ran["bad"]["problem"] and "executed" not in ran["bad"]
    dev.fill_cache(ran)
    cache = get_cache(tmp_path / "_build" / ".jupyter_cache")
    _, good = cache.merge_match_into_notebook(nbformat.read(paths[1], 4))
    outputs = good.cells[0].outputs
    assert outputs[0]["text"] == "42\n" and outputs[1]["data"]["text/plain"] == "42"
    assert good.cells[0].execution_count == 1
    nbformat.validate(good)
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nbformat.read(paths[0], 4))


def test_dev_test_skips_only_what_book_executed_for_the_same_code(tmp_path, monkeypatch):
    """`_build/routes.json` spares `dev.py test` a second execution of a notebook only while
    neither the package (any file the wheel is built from) nor that notebook changed."""
    dev = load_dev()
    (tmp_path / "lnbook").mkdir()
    for name in ("pyproject.toml", "README.md", "requirements.txt", "lnbook/__init__.py"):
        (tmp_path / name).write_text(name)
    paths = _notebooks(tmp_path / "book", {"a": "1", "b": "2", "c": "3"})
    monkeypatch.setattr(dev, "ROOT", tmp_path)
    monkeypatch.setattr(dev, "BOOK", tmp_path / "book")
    monkeypatch.setattr(dev, "RECEIPT", tmp_path / "_build" / "routes.json")
    assert dev.executed_by_book() == []  # no receipt
    dev.RECEIPT.parent.mkdir()
    dev.RECEIPT.write_text(json.dumps({"key": dev.routes_key(), "notebooks": {
        "a": {"ok": True}, "b": {"ok": True}, "c": {"ok": False}}}))
    assert dev.executed_by_book() == ["a", "b"]
    paths[1].write_text(paths[1].read_text().replace('"2"', '"22"'))  # b's code changed
    assert dev.executed_by_book() == ["a"]
    (tmp_path / "lnbook" / "new.py").write_text("")  # the package changed
    assert dev.executed_by_book() == []
