"""`python3 dev.py lab` as a reader meets it: JupyterLab starts headless on 127.0.0.1, answers its
REST API, and runs chapter code, then a whole chapter, through a kernel it started.

The server is started the way `dev.py lab` starts it. When this Python's environment is one that
`dev.py` installed from the current requirements (as under `python3 dev.py test`), the test runs
`python3 dev.py lab --no-browser ...` itself, with LNBOOK_VENV pointing at this environment; in
an environment installed otherwise it runs the command `dev.py lab` would run
(`dev.lab_command`), so the test never re-installs anyone's environment.
It talks to the server as JupyterLab's page does: REST calls with the token, then the kernel's
websocket. The last test opens a chapter in headless Chromium (Playwright driving Debian's
chromium; skipped when either is missing) and checks that jupyterlab-myst renders an exercise as
an admonition with its solution folded, and the math typeset, not as raw MyST text.
The server, its kernel and its runtime files are gone when the test ends, even when it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

pytest.importorskip(
    "jupyterlab", reason="JupyterLab is not installed in this environment (it is in "
    "requirements.txt; `python3 dev.py lab` installs it)"
)
websocket = pytest.importorskip("websocket", reason="websocket-client (a jupyter_server "
                                "dependency) is not installed")

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "04_related_work.ipynb"   # a short chapter: a few seconds in the book build
START_TIMEOUT = 60.0                # seconds for the server to answer /api/status
CELL_TIMEOUT = 60.0                 # seconds for one cell


def load_dev():
    """`dev.py` at the repository root, as a module (it imports only the standard library)."""
    spec = importlib.util.spec_from_file_location("lnbook_dev", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    token: str
    process: subprocess.Popen
    log: Path
    how: str   # "dev.py lab" or "dev.lab_command": which way the server was started

    def api(self, method: str, path: str, body: dict | None = None) -> dict | None:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text else None

    def log_tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def server_command(port: int, token: str) -> tuple[list[str], dict[str, str], str]:
    """How to start the server, with its environment and a word on which way was taken."""
    dev = load_dev()
    options = ["--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
               f"--IdentityProvider.token={token}"]
    if dev.is_installed(Path(sys.prefix)):
        env = {**os.environ, "LNBOOK_VENV": sys.prefix}
        return [sys.executable, str(ROOT / "dev.py"), "lab", *options], env, "dev.py lab"
    return dev.lab_command(sys.executable, options), dev.lab_environment(), "dev.lab_command"


def stop(server: Server) -> None:
    """Ask the server to shut down (it stops its kernels); kill its process group if it won't."""
    if server.process.poll() is None:
        try:
            server.api("POST", "/api/shutdown")
        except (OSError, urllib.error.URLError):
            pass
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if server.process.poll() is not None:
            break
        os.killpg(server.process.pid, sig)
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Server]:
    if os.name != "posix":
        pytest.skip("the test stops the server through its POSIX process group")
    tmp = tmp_path_factory.mktemp("lab")
    port, token = free_port(), uuid.uuid4().hex
    cmd, env, how = server_command(port, token)
    env = {**env, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
    log = tmp / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", token, process, log, how)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(f"{how}: the server exited with {process.returncode}:\n"
                            + server.log_tail())
            try:
                server.api("GET", "/api/status")
                break
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    pytest.fail(f"{how}: no answer from /api/status in {START_TIMEOUT:.0f} s:\n"
                                + server.log_tail())
                time.sleep(0.25)
        yield server
    finally:
        stop(server)


class Kernel:
    """A kernel of the server, driven through its websocket as JupyterLab's page drives it."""

    def __init__(self, server: Server, kernel_id: str):
        self.session = uuid.uuid4().hex
        ws_url = server.url.replace("http", "ws", 1)
        self.ws = websocket.create_connection(
            f"{ws_url}/api/kernels/{kernel_id}/channels?session_id={self.session}",
            header=[f"Authorization: token {server.token}"], timeout=CELL_TIMEOUT,
        )

    def execute(self, code: str, timeout: float = CELL_TIMEOUT) -> tuple[dict, str, list[str]]:
        """Run `code`; return the execute_reply's content, the printed text and any error."""
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": self.session, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        reply, idle, printed, errors = None, False, [], []
        deadline = time.monotonic() + timeout
        while reply is None or not idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply in {timeout:.0f} s to:\n{code[:200]}")
            self.ws.settimeout(left)
            try:
                raw = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                raise TimeoutError(f"no reply in {timeout:.0f} s to:\n{code[:200]}") from None
            if not isinstance(raw, str):
                continue   # a binary frame carries buffers (widgets); none are expected here
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                printed.append(content["text"])
            elif kind == "error":
                errors.append(f"{content['ename']}: {content['evalue']}")
            elif kind == "execute_reply":
                reply = content
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        return reply, "".join(printed), errors

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def chapter_kernel(lab: Server) -> Iterator[Kernel]:
    """A kernel started by the server for a chapter, as opening it in JupyterLab starts one."""
    session = lab.api("POST", "/api/sessions", {
        "path": CHAPTER, "name": CHAPTER, "type": "notebook", "kernel": {"name": "python3"},
    })
    kernel = Kernel(lab, session["kernel"]["id"])
    try:
        yield kernel
    finally:
        kernel.close()
        try:
            lab.api("DELETE", f"/api/sessions/{session['id']}")   # stops the kernel
        except (OSError, urllib.error.URLError):
            pass   # the server's shutdown stops it too


def test_lab_answers_its_status_api_with_the_token_only(lab: Server):
    print(f"server started with {lab.how}")
    status = lab.api("GET", "/api/status")
    assert isinstance(status["kernels"], int)
    assert "started" in status and "last_activity" in status
    anonymous = urllib.request.Request(lab.url + "/api/status")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=10)
    assert refused.value.code == 403
    # the page a browser opens: JupyterLab's built application, not an error page
    page = urllib.request.Request(lab.url + "/lab",
                                  headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(page, timeout=30) as response:
        html = response.read().decode()
    assert response.status == 200 and "jupyter-config-data" in html, html[:500]
    # the contents API is rooted at book/: the chapters are at its top level
    listing = lab.api("GET", "/api/contents")
    names = {item["name"] for item in listing["content"]}
    assert CHAPTER in names and "intro.md" in names, sorted(names)


def test_lab_kernel_runs_chapter_code_on_the_project_environment(chapter_kernel: Kernel):
    code = "\n".join([
        "import os, sys",
        "import torch",
        "import lnbook",
        "gen = torch.Generator().manual_seed(0)",
        "x = 3.0 * torch.randn(4, 8, generator=gen, dtype=torch.float64) + 1.0  # (B, H)",
        "y = lnbook.layer_norm(x, (8,))  # (B, H)",
        "ref = torch.nn.functional.layer_norm(x, (8,))  # (B, H)",
        "print(sys.prefix)",
        "print(os.getcwd())",
        "print(float((y - ref).abs().max()), float(y.mean(-1).abs().max()))",
    ])
    reply, printed, errors = chapter_kernel.execute(code)
    assert reply["status"] == "ok", errors
    prefix, cwd, numbers = printed.splitlines()
    assert Path(prefix) == Path(sys.prefix), "the kernel does not run on the project's Python"
    assert Path(cwd) == ROOT / "book", "the kernel does not start in book/ as the build does"
    worst, mean = map(float, numbers.split())
    assert worst < 1e-12 and mean < 1e-12, (worst, mean)


def test_lab_kernel_runs_a_whole_chapter(chapter_kernel: Kernel):
    nb = nbformat.read(ROOT / "book" / CHAPTER, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert len(cells) >= 3
    start = time.monotonic()
    for i, cell in enumerate(cells):
        reply, _, errors = chapter_kernel.execute(cell.source)
        assert reply["status"] == "ok", f"{CHAPTER} code cell {i} failed: {errors}"
    # the chapter's own asserts ran; say how long it took, for the record
    print(f"{CHAPTER}: {len(cells)} code cells in {time.monotonic() - start:.1f} s")


# ---------------------------------------------------------------------------------------------
# the page a reader sees: MyST rendered by jupyterlab-myst in Debian's Chromium

RENDER_CHAPTER = "01_introduction.ipynb"   # its exercises sit at the end of the notebook
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             "/usr/bin/chromium") if p and Path(p).exists()), None)


@pytest.fixture
def browser_page() -> Iterator[object]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed (pip install "
        "playwright; it drives Debian's chromium, no `playwright install` needed)")
    if CHROMIUM is None:
        pytest.skip("no Chromium found (apt-get install chromium); the rendering test needs it")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def test_lab_renders_an_exercise_as_an_admonition_with_its_solution_folded(lab: Server,
                                                                          browser_page):
    assert importlib.util.find_spec("jupyterlab_myst") is not None, (
        "jupyterlab-myst is not installed: JupyterLab would show the exercises as raw MyST "
        "text (it is in requirements.txt)")
    page = browser_page
    page.goto(f"{lab.url}/lab/tree/{RENDER_CHAPTER}?token={lab.token}", timeout=120_000)
    page.wait_for_selector(".jp-MarkdownCell .myst", timeout=120_000)
    # JupyterLab renders the cells near the viewport: scroll down until the exercise is there
    find = """() => {
      for (const a of document.querySelectorAll('.jp-MarkdownCell .myst aside')) {
        const head = a.querySelector('.myst-admonition-header-text');
        if (head && head.innerText.trim() === 'Exercise 1.1') {
          const sol = a.nextElementSibling;
          return {cls: a.className, body: a.innerText,
                  sol: sol ? {tag: sol.tagName, open: sol.open, text: sol.innerText} : null};
        }
      }
      return null;
    }"""
    found, deadline = None, time.monotonic() + 60
    while found is None and time.monotonic() < deadline:
        page.evaluate("() => document.querySelectorAll('.jp-WindowedPanel-outer')"
                      ".forEach(e => { e.scrollTop = e.scrollHeight; })")
        page.wait_for_timeout(300)
        found = page.evaluate(find)
    assert found is not None, "Exercise 1.1 was not rendered as an admonition (aside)"
    assert "myst-admonition" in found["cls"], found["cls"]
    assert "covariate shift" in found["body"]
    # its solution: a dropdown, folded until the reader opens it
    assert found["sol"] is not None and found["sol"]["tag"] == "DETAILS", found["sol"]
    assert found["sol"]["open"] is False and "Solution" in found["sol"]["text"]
    rendered = page.evaluate("() => [...document.querySelectorAll('.jp-MarkdownCell .myst')]"
                             ".map(w => w.innerText).join('\\n')")
    assert "{admonition}" not in rendered and ":class: dropdown" not in rendered
    # the math of the chapter is typeset, not shown as $...$ source
    assert "$\\mathbf" not in rendered and "P(y \\mid" not in rendered
    maths = page.evaluate("() => document.querySelectorAll('.jp-MarkdownCell .myst .math,"
                          " .jp-MarkdownCell .myst .katex, .jp-MarkdownCell .myst mjx-container')"
                          ".length")
    assert maths > 0
