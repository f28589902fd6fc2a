"""A cheaper eager launch of a Triton kernel: Triton's binder and cache lookup done once per
specialization, then the compiled kernel's own runner.

Why: a memory-bound kernel such as the BlockAttention forward takes ~60 us on the H200, and an
eager call pays its host time on top. `kernel[grid](...)` spends 24-34 us of host time
binding and specializing the forward's 26 arguments, the compiled kernel's runner alone 11-15
us (two boxes, `tools/probe_launch.py`, kernels/BENCHMARKS.md 2026-12-04). This launch costs
the runner plus the key below: 3 us less than `kernel[grid](...)` per call as measured on the
slower box (30.6 vs 33.6 us). A small gain; the rest of Triton's cost is the runner itself.

What is safe to skip: Triton compiles one binary per *specialization* of the arguments; for
each integer whether it is 1, whether it is divisible by 16 and its type (i32, i64, u64);
for each tensor its dtype and whether its address is 16-byte aligned; plus the constexprs and
launch options. `spec_key` records all of those, and more (every integer's three flags, even
where Triton ignores one). Equal keys therefore select the binary Triton itself would select.
On the first call with a key, `CachedLaunch` launches through `kernel[grid](...)`, so Triton
compiles and checks as always, and keeps the compiled kernel it returns. A later call with the
same key, on the same current CUDA device, goes straight to that kernel's runner. Under
Triton's CPU interpreter (TRITON_INTERPRET=1), and with Triton's launch hooks set (a profiler
such as proton), every call takes Triton's own path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

try:
    from triton import knobs as _knobs
except ImportError:  # an older Triton without knobs: no hooks to honour here
    _knobs = None

_I32 = 1 << 31
_I64 = 1 << 63


def spec_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What Triton's specialization of `args` depends on (a superset): see the module doc."""
    return tuple([(a.dtype, not a.data_ptr() & 15) if isinstance(a, torch.Tensor)
                  else (a == 1, not a % 16, -_I32 <= a < _I32, a < _I64) if type(a) is int
                  else _other(a) for a in args])


def _other(a: Any) -> Any:
    if a is None or isinstance(a, bool):
        return a
    if isinstance(a, float):
        return float
    raise TypeError(f"spec_key: argument of type {type(a).__name__} is not a tensor, int, float, bool or None")


class CachedLaunch:
    """`launch(grid, args, consts)` runs `kernel[grid](*args, **consts)`; `args` are the
    kernel's leading runtime arguments in order, `consts` its constexprs (every one the kernel
    declares after `args`) plus launch options (`num_warps`, `num_stages`), all hashable (they
    are part of the cache key)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.names: list[str] = list(kernel.arg_names)
        self._cache: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}
        # Triton reads TRITON_INTERPRET when it decorates the kernel: a kernel made under the
        # interpreter stays interpreted.
        self._interpret = os.environ.get("TRITON_INTERPRET") == "1"

    def __call__(self, grid: tuple[int, ...], args: tuple[Any, ...], consts: dict[str, Any]) -> None:
        if self._interpret or _hooks_set():
            self.kernel[grid](*args, **consts)
            return
        key = (torch.cuda.current_device(), tuple(consts.items()), spec_key(args))
        hit = self._cache.get(key)
        if hit is None:
            compiled = self.kernel[grid](*args, **consts)
            tail = tuple(consts[n] for n in self.names[len(args):])
            if compiled is not None and hasattr(compiled, "__getitem__"):
                self._cache[key] = (compiled, tail)
            return
        compiled, tail = hit
        compiled[(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)](*args, *tail)

    def cache_size(self) -> int:
        """How many specializations have a compiled kernel kept (tests)."""
        return len(self._cache)


def _hooks_set() -> bool:
    """Whether a launch hook is installed (Triton >= 3.6 keeps an always-present `HookChain`
    whose `calls` list is empty until a profiler adds one; older ones None)."""
    if _knobs is None:
        return False
    rt = _knobs.runtime
    return _active(rt.launch_enter_hook) or _active(rt.launch_exit_hook)


def _active(hook: Any) -> bool:
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0
