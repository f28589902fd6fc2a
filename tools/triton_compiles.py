"""Which Triton kernels a gem_trainer run compiles (or loads from Triton's disk cache), when,
and for how long: what a cold first step spends on them.

    python3 tools/triton_compiles.py [--record MANIFEST] [gem_trainer arguments...]

Runs `python3 -m gem_trainer` with the given arguments, with Triton's `jit_cache_hook` (called
before a kernel's compile) and `jit_post_compile_hook` (after it) set. Only kernels launched as
`@triton.jit` functions pass these hooks (gem_kernels' and gem_precision's); inductor's
generated kernels do not. Prints one line per compile (seconds since start, duration, thread,
kernel name) and a summary JSON line: the compiles, their total time and each kernel's
durations (the trainer's own summary gives the time to first step to compare with). Run it over empty TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR
folders for the cold figures; over warm ones, each line is a load from the disk cache.

`--record MANIFEST` also writes the specializations of our kernels compiled in the run as a
manifest (`gem_kernels.precompile.record_compiles`): what the trainer's `triton_precompile` compiles in
parallel at the start of a later run. The shipped ones (gem_trainer/triton_manifests/) come
from `--record ... --preset h200 --steps 20 --eval-batches 0 --triton-precompile ''` over empty
caches on the GPU named in the file name.
"""
import contextlib
import json
import sys
import threading
import time
from collections import defaultdict
from typing import Any

from triton import knobs

T0 = time.perf_counter()
_open: dict[tuple[int, Any], float] = {}
rows: list[tuple[float, float, str, str]] = []
_lock = threading.Lock()


def _name(fn: Any) -> str:
    return f"{getattr(fn, 'module', '?')}.{getattr(fn, 'name', '?')}"


def _before(*, key: Any, fn: Any, **_: Any) -> bool:
    with _lock:
        _open[(threading.get_ident(), str(key))] = time.perf_counter()
    return False  # compile as usual


def _after(*, key: Any, fn: Any, **_: Any) -> None:
    now = time.perf_counter()
    with _lock:
        t = _open.pop((threading.get_ident(), str(key)), now)
        rows.append((t - T0, now - t, threading.current_thread().name, _name(fn)))


knobs.runtime.jit_cache_hook = _before
knobs.runtime.jit_post_compile_hook = _after

from gem_trainer.__main__ import main  # noqa: E402  (after the hooks: nothing compiles before)

args = sys.argv[1:]
try:
    with contextlib.ExitStack() as stack:
        if args[:1] == ["--record"]:
            import gem_kernels.precompile

            stack.enter_context(gem_kernels.precompile.record_compiles(args[1]))
            args = args[2:]
        main(args)
finally:
    rows.sort()
    for start, dur, thread, name in rows:
        print(f"triton_compile {start:8.2f} s {dur:6.2f} s  {thread:<14} {name}")
    per: dict[str, list[float]] = defaultdict(list)
    for _start, dur, _thread, name in rows:
        per[name].append(round(dur, 2))
    print(json.dumps({"triton_compiles": len(rows), "triton_compile_s": round(sum(r[1] for r in rows), 2),
                      "per_kernel": dict(sorted(per.items(), key=lambda kv: -sum(kv[1])))}))
