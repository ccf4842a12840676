"""The repository keeps its promises: the README's Quickstart is what CI runs."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    assert ci == cmds


def test_requirements_pin_what_the_book_needs():
    req = (ROOT / "requirements.txt").read_text()
    for needed in ("torch==2.13.0", "jupyter-book>=1.0.4.post1,<2", "nbval", "pytest",
                   "ipykernel", "tqdm", "sphinxcontrib-bibtex", "matplotlib", "numpy",
                   "mlxtend", "-e ."):
        assert needed in req, needed


def test_dev_py_rejects_unknown_task_with_usage_and_exit_code_2():
    out = subprocess.run([sys.executable, str(ROOT / "dev.py"), "bake"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "usage" in out.stderr
