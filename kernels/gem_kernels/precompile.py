"""Compile a run's Triton kernels in parallel, before the run asks for them.

Why: a Triton kernel compiles the first time a specialization of it is launched (its
constexprs, launch options, each pointer's 16-byte alignment, each integer's "is 1" and
"divisible by 16"), and the launch waits for the compile. On an empty Triton cache the first
training step of the trainer's h200 preset launched 20 specializations of our kernels one
after the other and waited 15.8-18.7 s for them (two NVIDIA H100 boxes, triton 3.6,
`tools/triton_compiles.py`; trainer/BENCHMARKS.md, 2026-12-07): the JFA forward 3 times
(1.3-2.3 s each), its dK/dV kernel 3 times (1.3-2.8 s), the GDPA forward (0.9-2.4 s)...

What this module does about it:
- `record_compiles(path)`: a context manager that records every specialization of our kernels
  compiled inside it (Triton's `jit_cache_hook` hands each one over as the JSON that
  `JITFunction.preload` takes) into a manifest file.
- `start_precompile(path)`: starts worker processes that `preload` a manifest's
  specializations, split among them, and returns at once. `preload` compiles exactly what a
  launch of that specialization would compile, under the same cache key, into Triton's disk
  cache (or finds it there). When the run reaches a launch, Triton loads the kernel from the
  disk cache instead of compiling it; a launch that comes first compiles it itself, as it
  would have anyway. So a manifest that does not fit the run (another model, other batch
  shapes) costs only the workers' CPU time, and results never depend on it.

Once a manifest's workers all finished without an error, a marker in Triton's cache folder
(`<cache>/gem_precompile/<the manifest's hash>.done`) says so, and later runs over that cache
start no workers: their kernels load from the disk cache as they always did. Emptying the
cache folder removes the marker with the kernels.

The workers are processes, not threads: Triton's compile holds the GIL for much of its
work. Each worker initializes CUDA (a context of a few hundred MB of GPU memory until it
exits). A manifest is tied to the Triton version and the GPU target it was recorded with;
`start_precompile` skips one recorded elsewhere. The compile options' library paths (the
`extern_libs` entry, a path inside the recording machine's Triton install) are dropped, so
each machine fills in its own, as a launch does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Kernels from these packages are recorded (inductor's generated kernels do not pass Triton's
# JIT hooks; other @triton.jit users are not ours to replay).
RECORD_PACKAGES = ("gem_",)
MANIFEST_FORMAT = 1


def _target() -> dict[str, Any] | None:
    """The current GPU's Triton target as a dict (what `preload` compares), or None without a
    CUDA GPU or under the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    from triton.runtime import driver

    return dict(driver.active.get_current_target().__dict__)


def manifest_name() -> str | None:
    """The file name of a manifest for this Triton version and GPU target
    (`cuda90-triton3.6.0.json` on an H100 or H200 with triton 3.6.0), or None without a GPU."""
    target = _target()
    if target is None:
        return None
    return f"{target.get('backend')}{target.get('arch')}-triton{_triton_version()}.json"


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


@contextlib.contextmanager
def record_compiles(path: str | os.PathLike[str]) -> Iterator[list[dict[str, Any]]]:
    """Inside: every specialization of our kernels that Triton compiles (or loads from its
    disk cache into this process) is recorded; on exit the manifest is written to `path`
    (through a temporary file, so a kill leaves the old file or the new one, whole). Yields
    the list of entries so far. Chains to a `jit_cache_hook` already set, and restores it."""
    from triton import knobs

    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    lock = threading.Lock()
    previous = knobs.runtime.jit_cache_hook

    def hook(*, fn: Any, compile: dict[str, Any], **kwargs: Any) -> bool | None:
        module = str(getattr(fn, "module", ""))
        spec = compile.get("specialization_data")
        if spec and module.startswith(RECORD_PACKAGES):
            with lock:
                if spec not in seen:
                    seen.add(spec)
                    entries.append({"module": module, "name": str(getattr(fn, "name", "")), "spec": spec})
        return previous(fn=fn, compile=compile, **kwargs) if previous is not None else None

    knobs.runtime.jit_cache_hook = hook
    try:
        yield entries
    finally:
        knobs.runtime.jit_cache_hook = previous
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        doc = {"format": MANIFEST_FORMAT, "triton": _triton_version(), "target": _target(), "kernels": entries}
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, out)


def load_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads and checks a manifest; a clear ValueError naming the file and the rule if it is
    not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"precompile manifest {p}: not readable as JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"precompile manifest {p}: 'format' must be {MANIFEST_FORMAT}")
    kernels = doc.get("kernels")
    if not isinstance(kernels, list) or not all(
        isinstance(k, dict) and isinstance(k.get("module"), str) and isinstance(k.get("name"), str)
        and isinstance(k.get("spec"), str) for k in kernels
    ):
        raise ValueError(f"precompile manifest {p}: 'kernels' must be a list of {{module, name, spec}} entries")
    return doc


def done_marker(path: str | os.PathLike[str]) -> Path:
    """Where a finished precompile of the manifest at `path` is marked: Triton's cache folder
    (TRITON_CACHE_DIR, else ~/.triton/cache), `gem_precompile/<sha256 of the file>.done`."""
    from triton import knobs

    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:20]
    return Path(knobs.cache.dir) / "gem_precompile" / f"{digest}.done"


@dataclass
class Precompile:
    """The running workers of `start_precompile` (or why none started: `skipped`)."""

    manifest: str
    kernels: int = 0
    workers: list[subprocess.Popen[str]] = field(default_factory=list)
    skipped: str | None = None
    started: float = field(default_factory=time.perf_counter)
    marker: Path | None = None  # written by `wait` when every worker finished cleanly

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Waits for the workers (at most `timeout` s in all; those still running are then
        left to finish on their own) and returns a summary: the manifest, its kernels, the
        workers, why none started (`skipped`), how many kernels they preloaded, failed or left
        `unfinished`, and the seconds since they started."""
        done: dict[str, Any] = {"manifest": self.manifest, "kernels": self.kernels, "workers": len(self.workers),
                                "skipped": self.skipped, "preloaded": 0, "failed": 0, "unfinished": 0}
        end = None if timeout is None else time.perf_counter() + timeout
        for w in self.workers:
            left = None if end is None else max(end - time.perf_counter(), 0.0)
            try:
                out, _ = w.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                done["unfinished"] += 1
                continue
            try:
                res = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            except json.JSONDecodeError:
                res = {}
            done["preloaded"] += int(res.get("preloaded", 0))
            done["failed"] += int(res.get("failed", 0)) + (1 if w.returncode else 0)
        done["seconds"] = round(time.perf_counter() - self.started, 2)
        if self.marker is not None and self.workers and not done["unfinished"] and not done["failed"] \
                and done["preloaded"] == self.kernels:
            with contextlib.suppress(OSError):  # (an unwritable cache: the next run preloads again)
                self.marker.parent.mkdir(parents=True, exist_ok=True)
                self.marker.write_text(json.dumps({"manifest": self.manifest, "kernels": self.kernels}) + "\n")
        return done

    def stop(self) -> None:
        """Ends the workers still running (Triton writes each cache entry through a temporary
        file, so a worker ended mid-compile leaves no partial entry)."""
        for w in self.workers:
            if w.poll() is None:
                w.kill()
                w.wait()


def start_precompile(path: str | os.PathLike[str], workers: int = 4) -> Precompile:
    """Starts up to `workers` processes that preload the manifest's kernels into Triton's disk
    cache, and returns at once. Skipped (nothing started, `Precompile.skipped` says why) without
    a CUDA GPU, under TRITON_INTERPRET=1, for a manifest of another Triton version or GPU
    target, or one an earlier run compiled into this Triton cache (`done_marker`). A malformed
    manifest raises ValueError."""
    if workers < 1:
        raise ValueError(f"workers={workers}: must be >= 1")
    doc = load_manifest(path)
    pre = Precompile(manifest=str(path), kernels=len(doc["kernels"]))
    target = _target()
    if target is None:
        pre.skipped = "no CUDA GPU (or TRITON_INTERPRET=1)"
    elif doc.get("triton") != _triton_version():
        pre.skipped = f"recorded with triton {doc.get('triton')}, this is {_triton_version()}"
    elif doc.get("target") != target:
        pre.skipped = f"recorded for {doc.get('target')}, this GPU is {target}"
    elif not doc["kernels"]:
        pre.skipped = "no kernels in it"
    elif (marker := done_marker(path)).is_file():
        pre.skipped = f"compiled into this Triton cache by an earlier run ({marker})"
    else:
        pre.marker = marker
    if pre.skipped:
        return pre
    n = min(workers, len(doc["kernels"]))
    env = dict(os.environ)
    # The workers find gem_kernels where this process did (an uninstalled checkout too).
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for i in range(n):
        pre.workers.append(subprocess.Popen(
            [sys.executable, "-m", "gem_kernels.precompile", str(path), str(i), str(n)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env))
    return pre


def _spec_for_here(spec: str) -> str:
    """The recorded specialization with the recording machine's library paths dropped (each
    machine's Triton fills in its own, as at a launch)."""
    data = json.loads(spec)
    data.get("options", {}).pop("extern_libs", None)
    return json.dumps(data)


def _worker(path: str, index: int, count: int) -> dict[str, Any]:
    import importlib

    doc = load_manifest(path)
    done: dict[str, Any] = {"preloaded": 0, "failed": 0, "errors": []}
    for entry in doc["kernels"][index::count]:
        try:
            kernel = getattr(importlib.import_module(entry["module"]), entry["name"])
            kernel.preload(_spec_for_here(entry["spec"]))
            done["preloaded"] += 1
        except Exception as e:  # noqa: BLE001 (best effort: the run compiles what is missing)
            done["failed"] += 1
            done["errors"].append(f"{entry['module']}.{entry['name']}: {type(e).__name__}: {e}"[:300])
    return done


if __name__ == "__main__":
    print(json.dumps(_worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
