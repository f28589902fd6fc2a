"""Start-up work a compiled run can do in the background.

Triton's cache key (`triton.runtime.cache.triton_key`) is a sha256 over Triton's compiler
sources and its ~400 MB `libtriton.so`. It is computed once per process, the first time a
Triton kernel is compiled or loaded from a cache: for a warm start of the h200 trainer that
is inside the first step, when the stored blocks load (py-spy on the H200, thirty-first
session: 1.0 s of self time, the largest single item of the load). Hashing and file reads
release the GIL, so a thread can do it while the main thread sets up CUDA, builds the model
and starts the loader.

`start_triton_key()` starts that thread. The thread imports nothing: it runs only when Triton
and the packages the key walks are already imported (they are once `gem_kernels` is), so it
cannot race the main thread's imports. A failure in the thread is dropped; the key is then
computed where Triton first needs it, as without the thread.
"""
from __future__ import annotations

import importlib.util
import os
import pkgutil
import sys
import threading
from typing import Any

THREAD_NAME = "gem-triton-key"


def _key_packages() -> list[str] | None:
    """The packages `triton_key` walks (its compiler, backends and language folders, and their
    sub-packages), or None if Triton is not imported or a folder is missing."""
    triton = sys.modules.get("triton")
    init = getattr(triton, "__file__", None) if triton is not None else None
    if not isinstance(init, str):
        return None
    root = os.path.dirname(init)
    names: list[str] = []

    def walk(path: str, name: str) -> None:  # (pkgutil.walk_packages imports to recurse; this reads folders)
        names.append(name)
        for m in pkgutil.iter_modules([path], prefix=f"{name}."):
            if m.ispkg:
                walk(os.path.join(path, m.name.rpartition(".")[2]), m.name)

    for sub in ("compiler", "backends", "language"):
        path = os.path.join(root, sub)
        if not os.path.isdir(path):
            return None
        walk(path, f"triton.{sub}")
    return names


def start_triton_key() -> threading.Thread | None:
    """Computes Triton's cache key in a daemon thread (see the module docstring) and returns the
    thread, to `join()` before the first compiled call; None (nothing started) when Triton is
    not imported, when the key is already computed, or when a package the key walks is not yet
    imported (the thread would import it)."""
    names = _key_packages()
    if names is None or any(n not in sys.modules for n in names):
        return None
    if importlib.util.find_spec("triton.runtime.cache") is None:
        return None
    from triton.runtime.cache import triton_key

    info = getattr(triton_key, "cache_info", None)
    if info is None or info().currsize:
        return None

    def run() -> None:
        try:
            triton_key()
        except Exception:  # computed again where Triton needs it
            pass

    t = threading.Thread(target=run, name=THREAD_NAME, daemon=True)
    t.start()
    return t


def triton_key_ready() -> Any:
    """Whether the key is computed in this process (for tests and start-up reports); None
    without Triton."""
    if "triton" not in sys.modules or importlib.util.find_spec("triton.runtime.cache") is None:
        return None
    from triton.runtime.cache import triton_key

    info = getattr(triton_key, "cache_info", None)
    return None if info is None else bool(info().currsize)
