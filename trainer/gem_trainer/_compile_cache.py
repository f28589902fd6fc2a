"""A torch.compile cache carried from one machine to the next (`--compile-cache FILE`).

A cold compile of the h200 preset's blocks takes ~75 s before the first step on the H200;
with the caches of a previous run on the same machine it takes ~17 s (trainer/BENCHMARKS.md).
A fresh machine has no such caches, so the trainer can carry them in one file: torch's
portable cache artifacts (`torch.compiler.save_cache_artifacts`: inductor's FX-graph cache,
AOTAutograd's cache, autotuning results), loaded before the first step and written after the
compile warm-up. A file from another torch / triton / GPU, or a changed model, is not an
error: its entries miss and the run compiles as without it. The file is only a cache: a
corrupt one is reported and replaced, never trusted.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch


def load(path: str) -> dict[str, Any]:
    """Loads the artifacts in `path` (if present) into this process's compile caches.

    Returns summary keys: `compile_cache` ("loaded", "absent" or "unreadable: <why>"),
    `compile_cache_load_s`, `compile_cache_entries`."""
    if not os.path.exists(path):
        return {"compile_cache": "absent"}
    t = time.perf_counter()
    try:
        with open(path, "rb") as f:
            blob = f.read()
        info = torch.compiler.load_cache_artifacts(blob)
    except Exception as e:  # a truncated or foreign file: compile from scratch, rewrite it later
        return {"compile_cache": f"unreadable: {type(e).__name__}: {str(e)[:160]}"}
    if info is None:  # torch logs why (e.g. a checksum mismatch) and loads nothing
        return {"compile_cache": "unreadable: torch could not deserialize it (its warning above says why)"}
    entries = sum(len(v) for v in info.artifacts.values())
    return {"compile_cache": "loaded", "compile_cache_load_s": round(time.perf_counter() - t, 3),
            "compile_cache_entries": entries}


def save(path: str) -> dict[str, Any]:
    """Writes this process's compile artifacts to `path` atomically (a temporary file in the
    same folder, then a rename: a kill mid-write leaves the old file or none, never half of
    one). Returns summary keys `compile_cache_saved_bytes` (0: nothing was compiled)."""
    got = torch.compiler.save_cache_artifacts()
    if got is None:
        return {"compile_cache_saved_bytes": 0}
    blob = got[0]
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".compile_cache.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"compile_cache_saved_bytes": len(blob)}
