"""The repository keeps its promises: the README's Quickstart is what CI runs and what the
publishing workflow builds, and `dev.py` offers the tasks its docstring lists."""

import importlib.util
import os
import re
import subprocess
import sys
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
                   "mlxtend", "jupyterlab", "-e ."):
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
    listed = re.findall(r"^\s+python3 dev\.py (\w+)", doc, re.M)
    assert listed == ["book", "test", "lab", "sync", "pdf", "replicate", "routes"]


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
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()
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


def test_ci_checks_the_routes_after_the_tests():
    steps = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
             if "dev.py" in line and not line.lstrip().startswith("#")]
    assert steps == ["python3 dev.py book", "python3 dev.py test", "python3 dev.py routes"]


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
