"""The repository keeps its promises: the README's Quickstart is what CI runs and what the
publishing workflow builds, and `dev.py` offers the tasks its docstring lists."""

import ast
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import types
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github/workflows/book.yml"


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_quickstart_is_two_commands_and_ci_runs_exactly_them():
    cmds = quickstart_commands()
    assert cmds == ["python3 dev.py book", "python3 dev.py test"]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
          if "dev.py" in line and not line.lstrip().startswith("#")]
    assert ci[:2] == cmds  # then the routes outside the checkout (test_ci_checks_the_routes)


def test_requirements_pin_what_the_book_needs():
    req = (ROOT / "requirements.txt").read_text()
    for needed in ("torch==2.13.0", "jupyter-book>=1.0.4.post1,<2", "nbval", "pytest",
                   "ipykernel", "tqdm", "sphinxcontrib-bibtex", "matplotlib", "numpy",
                   "mlxtend", "jupyterlab", "build", "twine", "readme-renderer[md]", "-e ."):
        assert needed in req, needed


@pytest.mark.parametrize("argv", [["bake"], [], ["book", "extra"], ["sync", "--all"]])
def test_dev_py_rejects_unknown_task_with_usage_and_exit_code_2(argv):
    out = subprocess.run([sys.executable, str(ROOT / "dev.py"), *argv], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "usage" in out.stderr
    for task in ("book", "test", "lab", "sync", "pdf", "replicate", "routes"):
        assert task in out.stderr, f"usage does not name the task {task!r}"


def test_dev_py_docstring_lists_its_tasks():
    doc = (ROOT / "dev.py").read_text().split('"""')[1]
    listed = list(dict.fromkeys(re.findall(r"^\s+python3 dev\.py (\w+)", doc, re.M)))
    assert listed == ["book", "test", "lab", "sync", "pdf", "replicate", "routes", "confirm",
                      "pilot"]


# --- publishing: .github/workflows/book.yml -------------------------------------------------


def load_workflow() -> dict:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 (PyYAML) reads the key `on` as the boolean True; GitHub reads it as "on"
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def steps_using(job: dict, action: str) -> list[dict]:
    return [s for s in job["steps"] if str(s.get("uses", "")).split("@")[0] == action]


def test_workflow_runs_on_push_to_main():
    on = load_workflow()["on"]
    assert on["push"]["branches"] == ["main"], on


def test_workflow_builds_with_the_readme_command():
    build = load_workflow()["jobs"]["build"]
    assert [s["with"]["python-version"] for s in steps_using(build, "actions/setup-python")] \
        == ["3.11"]
    run = [s["run"].strip() for s in build["steps"] if "run" in s]
    assert run == [quickstart_commands()[0], "python3 dev.py pdf"], (
        f"the workflow must build with the README's Quickstart command, then print the PDF; "
        f"runs {run}"
    )
    names = [str(s.get("uses", s.get("run"))).split("@")[0] for s in build["steps"]]
    assert names.index("actions/checkout") < names.index("actions/setup-python") \
        < names.index(quickstart_commands()[0]) < names.index("actions/upload-pages-artifact")


def test_workflow_deploys_the_built_html_to_pages():
    workflow = load_workflow()
    assert workflow["permissions"]["pages"] == "write"
    assert workflow["permissions"]["id-token"] == "write"
    assert workflow["concurrency"]["group"]
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    assert steps_using(build, "actions/configure-pages")
    (upload,) = steps_using(build, "actions/upload-pages-artifact")
    assert upload["with"]["path"] == "_build/html"
    assert deploy["needs"] == "build"
    assert deploy["environment"]["name"] == "github-pages"
    (step,) = steps_using(deploy, "actions/deploy-pages")
    assert deploy["environment"]["url"] == f"${{{{ steps.{step['id']}.outputs.page_url }}}}"
    for job in (build, deploy):
        for s in job["steps"]:
            if "uses" in s:
                assert re.fullmatch(r"actions/[\w-]+@v\d+", s["uses"]), s["uses"]


# --- the files every open project has ---------------------------------------------------------


def pages_address() -> str:
    """The GitHub Pages address of the repository named in _config.yml's repository.url."""
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    owner, name = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+)", url).groups()
    return f"https://{owner.lower()}.github.io/{name}/"


def project_version() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]


def test_licences_split_code_and_text():
    code, text = (ROOT / "LICENSE").read_text(), (ROOT / "LICENSE-TEXT").read_text()
    assert "MIT License" in code and "Permission is hereby granted, free of charge" in code
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '\nlicense = "MIT"\n' in pyproject  # the package is code: MIT (SPDX)
    assert 'license-files = ["LICENSE", "LICENSE-TEXT"]' in pyproject
    assert "LICENSE-TEXT" in code, "LICENSE must say where the text's licence is"
    assert "Creative Commons Attribution 4.0" in text
    assert "https://creativecommons.org/licenses/by/4.0/legalcode" in text


def test_citation_cff_is_valid_and_agrees_with_the_project():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    # the keys CFF 1.2.0 requires, and the types its schema gives them
    assert cff["cff-version"] == "1.2.0"
    assert isinstance(cff["message"], str) and cff["message"].strip()
    assert isinstance(cff["title"], str) and cff["title"].strip()
    assert cff["authors"] and all(
        isinstance(a, dict) and (a.get("name") or a.get("family-names")) for a in cff["authors"])
    assert cff["type"] in {"software", "dataset"}
    assert cff["version"] == project_version()
    assert sorted(cff["license"]) == ["CC-BY-4.0", "MIT"]
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cff["repository-code"] == config["repository"]["url"].rstrip("/")
    assert cff["url"] == pages_address()
    for ref in cff.get("references", []):
        assert ref["type"] and ref["title"] and ref["authors"], ref


def test_readme_gives_the_address_how_to_cite_and_the_licences():
    readme = (ROOT / "README.md").read_text()
    assert pages_address() in readme, f"README does not give the book's address {pages_address()}"
    links = set(re.findall(r"\]\(([^)#]+)\)", readme))
    for name in ("LICENSE", "LICENSE-TEXT", "CITATION.cff", "CHANGELOG.md"):
        assert name in links, f"README does not link to {name}"
        assert (ROOT / name).is_file(), name
    assert "python3 dev.py pdf" in readme
    assert "## How to cite" in readme and "arXiv:1607.06450" in readme


def test_changelog_has_the_current_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert versions[0] == "Unreleased" and project_version() in versions, versions
    section = changelog.split(f"## [{project_version()}]", 1)[1]
    assert re.match(r" - \d{4}-\d{2}-\d{2}\n", section), "the version needs its date"
    for kind in ("### Added", "### Changed", "### Fixed"):
        assert kind in section, kind


# --- the README stays true ----------------------------------------------------------------------


def _title(file: str) -> str:
    """The first level-1 heading of a chapter (a notebook's markdown or a .md page)."""
    nb = ROOT / f"{file}.ipynb"
    if nb.is_file():
        cells = json.loads(nb.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = (ROOT / f"{file}.md").read_text()
    return re.search(r"^# (.+)$", text, re.M)[1].strip()


def contents_from_toc() -> str:
    """The README's Contents list as `_toc.yml` gives it: each part's caption, its chapters
    (titles from their first heading) and their sections, linked to their sources."""
    def item(entry: dict, indent: str) -> list[str]:
        file = entry["file"]
        path = f"{file}.ipynb" if (ROOT / f"{file}.ipynb").is_file() else f"{file}.md"
        lines = [f"{indent}- [{_title(file)}]({path})"]
        for section in entry.get("sections", []):
            lines += item(section, indent + "  ")
        return lines

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    lines = []
    for part in toc["parts"]:
        lines.append(f"- **{part['caption']}**")
        for chapter in part["chapters"]:
            lines += item(chapter, "  ")
    return "\n".join(lines) + "\n"


def test_readme_lists_the_parts_and_chapters_of_the_toc():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = "\n".join(line for line in section.splitlines()
                       if line.lstrip().startswith("- ")) + "\n"
    want = contents_from_toc()
    assert listed == want, f"README's Contents differ from _toc.yml; it should list:\n{want}"


# what pyproject's `data` extra installs, as distribution -> the name it is imported by
DATA_EXTRA = {"mlxtend": "mlxtend", "scikit-learn": "sklearn", "scipy": "scipy"}
DATA_LOADERS = {"load_mnist", "load_digits_tensor", "mnist_train_test"}  # lnbook.data's


def _reaches_the_data_extra(module: types.ModuleType) -> bool:
    """Whether the experiment's ``run`` reaches, through the module's own functions, classes
    and constants, a loader of lnbook.data that needs the extra or an import of one of its
    packages (read from the source, so nothing trains)."""
    tree = ast.parse(inspect.getsource(module))
    defs: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                defs.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
    seen, todo = set(), ["run"]
    while todo:
        name = todo.pop()
        if name in DATA_LOADERS:
            return True
        if name in seen or name not in defs:
            continue
        seen.add(name)
        for n in ast.walk(defs[name]):
            if isinstance(n, ast.Name):
                todo.append(n.id)
            elif isinstance(n, ast.Attribute):
                todo.append(n.attr)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module]
                if any(m.split(".")[0] in DATA_EXTRA.values() for m in mods):
                    return True
    return False


def test_readme_names_exactly_the_experiments_that_need_the_data_extra():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^data = \[(.*)\]$", pyproject, re.M)[1]
    assert sorted(re.findall(r'"([\w-]+)', extra)) == sorted(DATA_EXTRA), \
        "the data extra changed: update DATA_EXTRA (and the README)"
    from lnbook.experiments import EXPERIMENTS

    readme = (ROOT / "README.md").read_text()
    paragraph = readme.split("The `data` extra", 1)[1].split("Without it", 1)[0]
    listed = sorted(n for n in re.findall(r"`(\w+)`", paragraph) if n in EXPERIMENTS)
    need = sorted(n for n, m in EXPERIMENTS.items() if _reaches_the_data_extra(m))
    assert listed == need, f"README lists {listed} as needing [data]; these reach it: {need}"
    assert "mistakes" not in need and "`mistakes` included" in readme


def test_without_the_data_extra_the_loaders_name_it_and_mistakes_runs(tmp_path, monkeypatch):
    """As a plain `pip install .`, offline, without MNIST files: each of lnbook.data's loaders
    stops with MissingExtra, and the `mistakes` sweep (sorted sequences) runs."""
    from lnbook import data
    from lnbook.experiments import mistakes

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.split(
        ".")[0] in DATA_EXTRA.values() else real(name, *a))
    for name in DATA_EXTRA.values():
        monkeypatch.setitem(sys.modules, name, None)

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network (the test)")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setenv("LNBOOK_DATA", str(tmp_path))
    monkeypatch.setattr(data, "_SUBSET_CACHE", {})  # as in a fresh process: nothing loaded yet
    for loader in DATA_LOADERS:
        with pytest.raises(data.MissingExtra, match=r"pip install 'lnbook\[data\]'"):
            getattr(data, loader)()
    config = mistakes.get_config("quick", depths=(2,), seeds=(0,))
    results = mistakes.run(config, device="cpu")
    assert len(results.runs) == len(config.kinds) and results.runs[0].history.metrics


def test_the_release_agrees_everywhere_and_the_changelog_links_compare_tags():
    """pyproject, lnbook.__version__, CITATION.cff (version and date) and the CHANGELOG's
    newest section name one release; each version's link compares it with the one before
    (the first links to its tag), [Unreleased] compares the newest tag with HEAD."""
    import lnbook

    version = project_version()
    assert lnbook.__version__ == version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert released[0][0] == version, f"the CHANGELOG's newest section is {released[0]}"
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert str(cff["date-released"]) == released[0][1]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"version {version}." in readme and f"/lnbook@v{version}\"" in readme
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    links = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", changelog, re.M))
    tags = [f"v{v}" for v, _ in released]
    assert links.pop("Unreleased") == f"{repo}/compare/{tags[0]}...HEAD"
    for newer, older in zip(tags, tags[1:], strict=False):
        assert links.pop(newer[1:]) == f"{repo}/compare/{older}...{newer}", newer
    assert links.pop(tags[-1][1:]) == f"{repo}/releases/tag/{tags[-1]}"
    assert not links, f"links to no section: {links}"
    assert "commits/main" not in changelog
    section = changelog.split(f"## [{version}]", 1)[1].split("\n## [", 1)[0]
    assert f"### Upgrading from {released[1][0]}" in section, "say what changed for its users"


# --- the release: wheel and sdist ---------------------------------------------------------------

_PACKAGED = ("pyproject.toml", "README.md", "LICENSE", "LICENSE-TEXT", "lnbook")


def test_the_wheel_and_sdist_build_offline_and_pass_twine_check(tmp_path):
    """What `python -m build` makes from the release (from a copy of what it packs, so the
    checkout gets no build/ or egg-info): both pass `twine check --strict`, their metadata
    name the release, its Python, dependencies and extras, the README is the long description
    and renders as PyPI renders it, and every module of the package is inside."""
    from email.parser import Parser

    from readme_renderer.markdown import render

    src, dist = tmp_path / "src", tmp_path / "dist"
    src.mkdir()
    for name in _PACKAGED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "deprecated" not in built.stdout + built.stderr, "setuptools warns of a deprecation"
    version = project_version()
    wheel, sdist = dist / f"lnbook-{version}-py3-none-any.whl", dist / f"lnbook-{version}.tar.gz"
    assert sorted(dist.iterdir()) == sorted([wheel, sdist])
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel),
                            str(sdist)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and check.stdout.count("PASSED") == 2, check.stdout

    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lnbook").rglob("*.py")}
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        meta = Parser().parsestr(whl.read(f"lnbook-{version}.dist-info/METADATA").decode())
    assert modules <= names, f"modules missing from the wheel: {sorted(modules - names)}"
    assert not any(n.startswith(("tests/", "book/")) for n in names)
    assert {f"lnbook-{version}.dist-info/licenses/{n}" for n in ("LICENSE", "LICENSE-TEXT")} \
        <= names
    with tarfile.open(sdist) as tar:
        inside = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        sdist_meta = Parser().parsestr(
            tar.extractfile(f"lnbook-{version}/PKG-INFO").read().decode())
    assert modules | {"pyproject.toml", "README.md", "LICENSE", "LICENSE-TEXT"} <= inside

    pyproject = (ROOT / "pyproject.toml").read_text()
    for m in (meta, sdist_meta):
        assert (m["Name"], m["Version"]) == ("lnbook", version)
        assert m["Requires-Python"] == ">=3.10" and m["License-Expression"] == "MIT"
        assert sorted(m.get_all("Provides-Extra")) == ["cluster", "data"]
        requires = m.get_all("Requires-Dist")
        for dependency in re.search(r"^dependencies = \[(.*)\]$", pyproject, re.M)[1].split(", "):
            assert dependency.strip('"') in requires, dependency
        assert 'mlxtend>=0.23; extra == "data"' in requires
        assert m["Description-Content-Type"] == "text/markdown"
        assert m.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    html = render(meta.get_payload())
    assert html is not None, "the README does not render as Markdown"
    headings = re.findall(r"<h([12]) id=\"([^\"]+)\">([^<]+)<", html)
    assert headings[0][::2] == ("1", "lnbook: Layer Normalization, an executable textbook")
    titles = [text for level, _, text in headings if level == "2"]
    assert {"Quickstart", "Install", "Contents", "How to cite"} <= set(titles), titles
    ids = {anchor for _, anchor, _ in headings}
    for anchor in re.findall(r'href="#([^"]+)"', html):  # the README's own links, on PyPI
        assert anchor in ids, f"#{anchor} names no heading"
    with zipfile.ZipFile(wheel) as whl:
        entry = whl.read(f"lnbook-{version}.dist-info/entry_points.txt").decode()
    assert "lnbook = lnbook.__main__:main" in entry
    # `pip install .` and `python -m build .` in a checkout leave these behind: git ignores them
    assert {"build/", "dist/"} <= set((ROOT / ".gitignore").read_text().split())


# --- the routes outside the checkout: Binder, and dev.py routes in CI ------------------------


def requirement_lines(path: Path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines()
            if line.split("#")[0].strip()]


def test_binder_installs_the_package_and_jupyterlab_not_the_build_and_test_tools():
    binder = requirement_lines(ROOT / "binder/requirements.txt")
    assert ".[data]" in binder, "Binder reads the chapters with lnbook and its data extra"
    assert any(line.startswith("jupyterlab>=") for line in binder), binder
    book_torch = next(x for x in requirement_lines(ROOT / "requirements.txt")
                      if x.startswith("torch"))
    assert book_torch in binder, "Binder runs the book's torch"
    names = " ".join(binder).lower()
    for tool in ("jupyter-book", "pytest", "ruff", "dask", "distributed", "playwright",
                 "nbval", "sphinx"):
        assert tool not in names, f"{tool} is a build or test tool, not needed to read"
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert config["launch_buttons"]["notebook_interface"] == "jupyterlab"
    readme = (ROOT / "README.md").read_text()
    assert "binder/requirements.txt" in readme


def test_ci_runs_the_quickstart_and_the_tests_end_with_nbval_over_the_routes():
    steps = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
             if "dev.py" in line and not line.lstrip().startswith("#")]
    assert steps == ["python3 dev.py book", "python3 dev.py test"]
    dev = load_dev()
    source = inspect.getsource(dev.test)
    assert ("check_routes(skip=executed_by_book())" in source
            and '"pytest", "tests", "-p"' in source), (
        "dev.py test runs the unit tests, then nbval over every notebook from the wheel "
        "that dev.py book did not just execute that way")


def test_routes_usage():
    out = subprocess.run([sys.executable, str(ROOT / "dev.py"), "routes", "--all"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "usage: python3 dev.py routes" in out.stderr


def load_dev():
    spec = importlib.util.spec_from_file_location("lnbook_dev", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("source, ok, problem", [
    ("import os\nprint(os.listdir('.'))", True, ""),
    ("open('C07.json', 'w').write('{}')", False, "the ledger wrote into the reader's folder"),
    ("raise ValueError('bad chapter')", False, "ValueError: bad chapter"),
])
def test_routes_executes_a_notebook_alone_in_an_empty_folder(tmp_path, source, ok, problem):
    """dev.py routes' step for one notebook, here with this environment's Python."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LNBOOK_")}
    name, got_ok, seconds, got_problem = load_dev()._execute_in_empty_folder(
        Path(sys.executable), path, tmp_path / "run", env, 60)
    assert (name, got_ok) == ("chapter", ok) and seconds > 0
    assert problem in got_problem and (ok or got_problem)
