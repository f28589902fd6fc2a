"""gem_parallel.start_triton_key: Triton's cache key computed in a background thread.

Checked against Triton's own `triton_key` (its lru cache cleared first): the thread's key is
the one computed in the main thread, the thread imports no module, and nothing is started
when the key is already known or when a package the key walks is not imported yet (the thread
would import it and could race the main thread's imports).
"""

from __future__ import annotations

import sys
import threading

import pytest

pytest.importorskip("triton")

import triton.language  # noqa: F401,E402  (what gem_kernels imports in the trainer)
from triton.runtime.cache import triton_key  # noqa: E402

from gem_parallel import _warm, start_triton_key  # noqa: E402


def test_the_thread_computes_triton_s_key_and_imports_nothing() -> None:
    triton_key.cache_clear()
    expected = triton_key()
    triton_key.cache_clear()
    assert _warm.triton_key_ready() is False
    before = set(sys.modules)
    t = start_triton_key()
    assert isinstance(t, threading.Thread) and t.name == _warm.THREAD_NAME and t.daemon
    t.join(timeout=120)
    assert not t.is_alive()
    assert set(sys.modules) == before
    assert _warm.triton_key_ready() is True
    assert triton_key.cache_info().currsize == 1 and triton_key() == expected


def test_nothing_starts_when_the_key_is_known() -> None:
    triton_key()
    assert _warm.triton_key_ready() is True
    assert start_triton_key() is None


def test_nothing_starts_while_a_walked_package_is_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    names = _warm._key_packages()
    assert names is not None and "triton.language" in names and "triton.compiler" in names
    assert all(n in sys.modules for n in names)
    triton_key.cache_clear()
    monkeypatch.delitem(sys.modules, names[-1])
    assert start_triton_key() is None
    assert _warm.triton_key_ready() is False


def test_nothing_starts_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "triton")
    assert _warm._key_packages() is None
    assert start_triton_key() is None
