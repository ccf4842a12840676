"""Tests of lnbook._native (building the C kernels) and of the kernel's elementwise functions."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

from lnbook import _native
from lnbook.rnn import _lstm_kernel, native_status

HAVE_CC = bool(_native._compilers()) and os.name != "nt"
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler on this machine")


def _kernel() -> ctypes.CDLL:
    lib, status = _lstm_kernel()
    if lib is None:
        pytest.skip(f"the C kernel is not available here: {status}")
    return lib


def _apply(fn, x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    fn(x.numel(), x.data_ptr(), y.data_ptr())
    return y


@needs_cc
def test_kernel_builds_and_is_used_where_a_compiler_exists():
    assert native_status().startswith("C kernel in use"), native_status()


@needs_cc
def test_build_is_cached_by_source_compiler_and_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    builds = []
    real = _native._build
    monkeypatch.setattr(_native, "_build", lambda *a: builds.append(a) or real(*a))
    first = _native.load.__wrapped__("ln_lstm")
    assert first.lib is not None and str(tmp_path) in first.status
    assert len(builds) == 1
    libs = list((tmp_path / "lnbook" / "native").glob("ln_lstm-*.so"))
    assert len(libs) == 1 and libs[0].stat().st_size > 0
    again = _native.load.__wrapped__("ln_lstm")  # a new process would find the same file
    assert again.lib is not None and len(builds) == 1


@needs_cc
def test_unwritable_cache_falls_back_to_a_temporary_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the cache folder would have to be created under a file
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    got = _native.load.__wrapped__("ln_lstm")
    assert got.lib is not None and "lnbook-native-" in got.status


def test_switched_off_or_without_a_compiler_it_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("LNBOOK_NATIVE", "0")
    off = _native.load.__wrapped__("ln_lstm")
    assert off.lib is None and "LNBOOK_NATIVE=0" in off.status
    monkeypatch.delenv("LNBOOK_NATIVE")
    monkeypatch.setattr(_native, "_compilers", lambda: [])
    none = _native.load.__wrapped__("ln_lstm")
    assert none.lib is None and "no C compiler" in none.status
    assert _native.load.__wrapped__("no_such_kernel").lib is None


@pytest.mark.skipif(not os.path.exists("/bin/false"), reason="needs /bin/false")
def test_a_failing_compiler_gives_a_status_not_an_exception(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(_native, "_compilers", lambda: ["/bin/false"])
    got = _native.load.__wrapped__("ln_lstm")
    assert got.lib is None and got.status.startswith("the C build failed: /bin/false")
    assert not list(tmp_path.rglob("*.so"))  # no half-written library is left behind


def test_sigmoid_and_tanh_match_torch_in_float64():
    lib = _kernel()
    x = torch.cat([torch.linspace(-30, 30, 600_001), torch.logspace(-30, 1.9, 2000),
                   -torch.logspace(-30, 1.9, 2000), torch.tensor([0.0, -0.0, 88.0, -88.0, 200.0,
                                                                  -200.0, 1e30, -1e30])])
    for fn, ref in ((lib.lnbook_sigmoid_f32, torch.sigmoid), (lib.lnbook_tanh_f32, torch.tanh)):
        y, r = _apply(fn, x).double(), ref(x.double())
        tiny = r.abs() < 1e-35  # sigmoid far below zero: compare absolutely
        rel = ((y - r).abs() / r.abs().clamp_min(1e-300))[~tiny]
        assert rel.max() < 3e-7, (fn.__name__, rel.max().item())
        assert (y - r)[tiny].abs().max() < 1e-37
        torch_rel = ((ref(x).double() - r).abs() / r.abs().clamp_min(1e-300))[~tiny].max()
        assert rel.max() < 4 * torch_rel + 1e-7  # within a few roundings of torch's own


def test_sigmoid_and_tanh_at_infinities_and_nan():
    lib = _kernel()
    x = torch.tensor([float("inf"), float("-inf"), float("nan")])
    s, t = _apply(lib.lnbook_sigmoid_f32, x), _apply(lib.lnbook_tanh_f32, x)
    assert s[0] == 1.0 and 0.0 <= s[1] < 1e-37 and s[2].isnan()
    assert t[0] == 1.0 and t[1] == -1.0 and t[2].isnan()
