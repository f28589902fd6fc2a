"""The GPU check shared by the ops whose eager plans launch a kept binary directly
(BlockAttention, JFA, GDPA): under a Triton launch hook (a profiler such as proton) the plan
must hand the launch to Triton's own path, which calls the hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def under_launch_hook(call: Callable[[], T]) -> tuple[T, list[object]]:
    """(call()'s result, what a launch-enter hook saw while it ran); skips the test on a
    Triton without launch-hook chains."""
    import triton

    seen: list[object] = []
    hooks = triton.knobs.runtime.launch_enter_hook
    if not hasattr(hooks, "add"):
        pytest.skip("a Triton without HookChain")
    hooks.add(seen.append)
    try:
        out = call()
    finally:
        hooks.remove(seen.append)
    return out, seen
