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

`DirectLaunch` goes one step further for a caller that already knows its arguments'
specialization (an op that caches its own checks per call signature, `_block._Plan`): no key
at all, and the kept binary's launcher called as Triton's runner calls it, minus the runner's
per-call closure and launch-metadata dict, which only a launch hook reads.
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


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host ints. `triton.cdiv` is a constexpr function since Triton 3.5: ~2 us
    per host call, several per launch (kernels/BENCHMARKS.md, 2026-12-07)."""
    return -(-a // b)


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
        self.interpret = os.environ.get("TRITON_INTERPRET") == "1"

    def __call__(self, grid: tuple[int, ...], args: tuple[Any, ...], consts: dict[str, Any]) -> None:
        if self.interpret or _hooks_set():
            self.kernel[grid](*args, **consts)
            return
        key = self._key(args, consts)
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

    def direct(self, args: tuple[Any, ...], consts: dict[str, Any]) -> DirectLaunch | None:
        """The binary that an earlier call with `args`' specialization kept, as a `DirectLaunch`;
        None where there is none (no such call yet, the interpreter, a launch under a hook)."""
        if self.interpret:
            return None
        key = self._key(args, consts)
        hit = self._cache.get(key)
        return None if hit is None else DirectLaunch(hit[0], hit[1], key[0])

    def _key(self, args: Sequence[Any], consts: dict[str, Any]) -> tuple[Any, ...]:
        return (torch.cuda.current_device(), tuple(consts.items()), spec_key(args))


_OF: dict[int, CachedLaunch] = {}


def launch_of(kernel: Any) -> CachedLaunch:
    """The `CachedLaunch` of `kernel`, one per kernel object, made at its first use. Looked up
    per call by the launchers that read their kernel from the module at call time (so a test's
    stand-in for a kernel gets a launch of its own, and a kernel decorated under Triton's
    interpreter stays interpreted)."""
    got = _OF.get(id(kernel))
    if got is None or got.kernel is not kernel:
        got = _OF[id(kernel)] = CachedLaunch(kernel)
    return got


class DirectLaunch:
    """`launch(grid, args)` runs one kept binary of a `CachedLaunch` on the current stream.

    The caller vouches that `args` has the specialization of the call that compiled it (same
    dtypes, 16-byte alignment, integer flags; `spec_key`): nothing here looks at them. Pointer
    arguments may be passed as ints (`data_ptr()`), which also skips the launcher's own
    per-pointer driver query. `grid` has three entries. Returns False, launching nothing, on
    another current device or with a launch hook set: the caller then goes through the
    `CachedLaunch` (with tensors).
    """

    def __init__(self, compiled: Any, tail: tuple[Any, ...], device: int) -> None:
        from triton.runtime import driver

        self.tail, self.device = tail, device
        # What Triton's runner (CompiledKernel.__getitem__) passes to the launcher, resolved once.
        self.run = compiled.run
        self.function, self.packed = compiled.function, compiled.packed_metadata
        self.current_device = driver.active.get_current_device
        self.current_stream = driver.active.get_current_stream

    def __call__(self, grid: tuple[int, int, int], args: tuple[Any, ...]) -> bool:
        device = self.current_device()
        if device != self.device or _hooks_set():
            return False
        # No launch metadata and no hooks (None): only a hook reads them, and none is set.
        self.run(grid[0], grid[1], grid[2], self.current_stream(device), self.function, self.packed,
                 None, None, None, *args, *self.tail)
        return True


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
