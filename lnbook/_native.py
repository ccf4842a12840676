"""Compile lnbook's C kernels (``lnbook/csrc/*.c``) on first use and load them with ctypes.

There is one kernel so far, ``ln_lstm.c``: the elementwise work of one LN-LSTM time step, which
:class:`lnbook.rnn.LSTM` calls between torch's matrix products (Supplement chapter, section
"Speed"). It is plain C with no dependency beyond the C library, built with the first compiler
found (``$CC``, Python's own, then ``cc``, ``gcc``, ``clang``) into the cache folder
``$XDG_CACHE_HOME/lnbook/native`` (default ``~/.cache/lnbook/native``), under a name that
hashes the source, the compiler, its flags and the CPU, so a changed file or machine builds
anew. Building takes about a second.

Nothing here is required: where no compiler is found, the build fails, or the environment
variable ``LNBOOK_NATIVE`` is ``0``, :func:`load` says why and the callers run the same
computation as torch operations.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"

# tried in order: the fastest code for this CPU first, then flags any C compiler accepts
FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-O3", "-march=native", "-fopenmp-simd"),
    ("-O3", "-fopenmp-simd"),
    ("-O2",),
)


@dataclass(frozen=True)
class NativeLibrary:
    """A compiled kernel library, or the reason there is none.

    Attributes:
        name: the source's stem (``"ln_lstm"`` for ``csrc/ln_lstm.c``).
        lib: the loaded library, or None.
        status: how it was built and where it lies, or why it is not available.
    """

    name: str
    lib: ctypes.CDLL | None
    status: str


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/lnbook/native``, default ``~/.cache/lnbook/native``."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "lnbook" / "native"


def _compilers() -> list[str]:
    """C compilers on this machine, in order of preference, without repeats."""
    names = [os.environ.get("CC", ""), sysconfig.get_config_var("CC") or "", "cc", "gcc", "clang"]
    found: list[str] = []
    for name in names:
        argv = shlex.split(name)
        path = shutil.which(argv[0]) if argv else None
        if path and path not in found:
            found.append(path)
    return found


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the machine and, on Linux, the CPU's feature flags."""
    ident = f"{platform.system()} {platform.machine()} {platform.processor()}"
    try:
        with open("/proc/cpuinfo") as f:
            ident += next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return ident


def _writable_folder() -> Path | None:
    """The cache folder, else a per-user temporary folder; None if neither can be written."""
    for folder in (cache_dir(), Path(tempfile.gettempdir()) / f"lnbook-native-{os.getuid()}"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    return None


def _build(cc: str, flags: tuple[str, ...], src: Path, out: Path) -> str | None:
    """Compile ``src`` into the shared library ``out``; return None, or what went wrong."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)  # renamed into place when done
    os.close(fd)
    cmd = [cc, *flags, "-fPIC", "-shared", "-o", tmp, str(src), "-lm"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if run.returncode != 0:
            lines = (run.stderr or run.stdout).strip().splitlines()
            return f"{' '.join(cmd)}: {lines[-1] if lines else f'exit {run.returncode}'}"
        os.replace(tmp, out)  # atomic: another process never sees half a library
        return None
    except (OSError, subprocess.SubprocessError) as err:
        return f"{' '.join(cmd)}: {err}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def load(name: str) -> NativeLibrary:
    """Build (once per source, compiler, flags and CPU) and load ``csrc/<name>.c``.

    Never raises for a missing compiler or a failed build: the result's ``lib`` is then None and
    its ``status`` says why. The result is kept for the life of the process.
    """
    if os.environ.get("LNBOOK_NATIVE", "1").strip() == "0":
        return NativeLibrary(name, None, "switched off by LNBOOK_NATIVE=0")
    if sys.platform == "win32":
        return NativeLibrary(name, None, "not built on Windows (no C compiler is assumed there)")
    src = CSRC / f"{name}.c"
    if not src.is_file():
        return NativeLibrary(name, None, f"source {src} is missing from this installation")
    compilers = _compilers()
    if not compilers:
        return NativeLibrary(name, None, "no C compiler found ($CC, cc, gcc or clang)")
    folder = _writable_folder()
    if folder is None:
        return NativeLibrary(name, None, f"neither {cache_dir()} nor a temporary folder is "
                                         "writable")
    errors: list[str] = []
    source, cpu = src.read_bytes(), _cpu_id().encode()
    for cc in compilers:
        for flags in FLAG_SETS:  # the fastest flags first; a compiler that refuses them: next
            key = hashlib.sha256(
                b"\0".join([source, cc.encode(), " ".join(flags).encode(), cpu])).hexdigest()[:16]
            so = folder / f"{name}-{key}.so"
            error = None if so.is_file() else _build(cc, flags, src, so)
            if error is None:
                try:
                    lib = ctypes.CDLL(str(so))
                except OSError as err:
                    error = f"{so}: {err}"
                else:
                    return NativeLibrary(name, lib, f"built with {cc} {' '.join(flags)}: {so}")
            errors.append(error)
    return NativeLibrary(name, None, "the C build failed: " + " | ".join(errors[-3:]))
