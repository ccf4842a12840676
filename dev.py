"""Build the book and run the tests with nothing but Python 3.10+ and pip.

    python3 dev.py book    # make .venv, install requirements.txt, execute every notebook, write _build/html
    python3 dev.py test    # ruff, unit tests, and nbval over every notebook in book/

Both create (or reuse) the virtual environment `.venv` next to this file and re-install when
requirements.txt or pyproject.toml changed. Set LNBOOK_VENV to use another folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("LNBOOK_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")


def run(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True)


def ensure_venv() -> None:
    """Create .venv and install requirements.txt into it, unless already done for these files."""
    digest = hashlib.sha256(
        b"".join((ROOT / f).read_bytes() for f in ("requirements.txt", "pyproject.toml"))
    ).hexdigest()
    stamp = VENV / ".lnbook-installed"
    if stamp.exists() and stamp.read_text() == digest:
        return
    if not (BIN / "python").exists() and not (BIN / "python.exe").exists():
        print(f"+ creating virtual environment {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
    run(BIN / "python", "-m", "pip", "install", "--disable-pip-version-check", "-q",
        "-r", "requirements.txt")
    stamp.write_text(digest)


def book() -> None:
    ensure_venv()
    # every build executes every chapter (--all), and the claims ledger is made only of the
    # records this build's chapters write (lnbook.ledger), never of an older build's
    shutil.rmtree(ROOT / "_build" / "ledger", ignore_errors=True)
    run(BIN / "jupyter-book", "build", ".", "--all", "--warningiserror", "--nitpick",
        "--keep-going")


def test() -> None:
    ensure_venv()
    run(BIN / "ruff", "check", "lnbook", "tests", "book", "benchmarks")
    run(BIN / "python", "-m", "pytest", "tests", "book", "--nbval-lax", "--nbval-current-env",
        "-p", "no:cacheprovider")


if __name__ == "__main__":
    tasks = {"book": book, "test": test}
    if len(sys.argv) != 2 or sys.argv[1] not in tasks:
        print(f"usage: python3 dev.py {{{'|'.join(tasks)}}}", file=sys.stderr)
        sys.exit(2)
    try:
        tasks[sys.argv[1]]()
    except subprocess.CalledProcessError as err:
        sys.exit(err.returncode or 1)
