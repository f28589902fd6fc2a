"""gem_kernels._launch: the specialization key of the cached Triton launch (CPU), and that the
interpreter takes Triton's own path. The launch itself is checked on the GPU in
test_block.py::test_gpu_cached_launch_respecializes."""

import os

import pytest
import torch

from gem_kernels._launch import CachedLaunch, spec_key


def test_spec_key_separates_what_triton_specializes() -> None:
    # Every property Triton compiles a separate binary for must change the key.
    x = torch.zeros(64, dtype=torch.bfloat16)
    base = spec_key((x, 32, 7, 0.5, True))
    assert spec_key((x, 32, 7, 0.5, True)) == base
    assert spec_key((x[1:], 32, 7, 0.5, True)) != base  # address not 16-byte aligned
    assert spec_key((x[8:], 32, 7, 0.5, True)) == base  # 16 bytes further: aligned again
    assert spec_key((x.to(torch.float16), 32, 7, 0.5, True)) != base  # dtype
    assert spec_key((x, 33, 7, 0.5, True)) != base  # divisibility by 16
    assert spec_key((x, 32, 1, 0.5, True)) != base  # the value 1
    assert spec_key((x, 32, 7 + (1 << 31), 0.5, True)) != base  # past int32
    assert spec_key((x, 32, 7 + (1 << 63), 0.5, True)) != spec_key((x, 32, 7 + (1 << 31), 0.5, True))  # u64
    assert spec_key((x, 32, 7, 0.25, True)) == base  # floats are not specialized
    assert spec_key((x, 32, 7, 0.5, False)) != base  # bools are values
    assert spec_key((x, 48, 23, 0.5, True)) == base  # same flags, other values: one binary
    with pytest.raises(TypeError, match="argument of type str"):
        spec_key((x, "a"))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="checks the interpreter's path")
def test_interpreter_takes_tritons_path() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(X, Y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i < n) + 1, mask=i < n)

    launch = CachedLaunch(add_one)
    x = torch.randn(10)
    for _ in range(2):
        y = torch.empty_like(x)
        launch((1,), (x, y, 10), {"BLOCK": 16})
        torch.testing.assert_close(y, x + 1)
    assert launch.cache_size() == 0
    assert launch.direct((x, y, 10), {"BLOCK": 16}) is None  # no kept binary to launch directly


def test_hook_detection() -> None:
    # Triton >= 3.6 keeps an empty HookChain where older ones kept None: only a hook that
    # would run (a profiler's) sends launches through Triton's own path.
    from gem_kernels import _launch

    class Chain:
        def __init__(self, calls: list[object]) -> None:
            self.calls = calls

    assert not _launch._active(None)
    assert not _launch._active(Chain([]))
    assert _launch._active(Chain([print]))
    assert _launch._active(print)  # a bare callable (older Triton)
