"""Triton BlockAttention vs the plain-PyTorch reference, RoPE on and off, fwd and dq/dk/dv.

CPU: Triton's interpreter (TRITON_INTERPRET=1, set by Bazel) at tiny sizes; block sizes 16
(a whole tile) and 5 (a padded tile), lengths 0, 1, block - 1, block, block + 1 and a
partial last block. GPU (skipped without CUDA): real sizes, block 64, D 64/128.
"""

import math
import os

import pytest
import torch

from gem_kernels import block_attention
from gem_kernels._block import apply_rope_reference, rope_tables
from _launch_hook import under_launch_hook
from _respecialize import check_respecializes
from _strided import every_other

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
DEVICE = "cuda" if CUDA else "cpu"

TOL = {
    torch.float32: {"out": (2e-5, 1e-4), "grad": (5e-5, 1e-4)},
    torch.bfloat16: {"out": (2e-2, 2e-2), "grad": (5e-2, 5e-2)},
    torch.float16: {"out": (4e-3, 4e-3), "grad": (1e-2, 1e-2)},
}


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _check(
    lengths: list[int],
    *,
    block_size: int,
    rope: bool,
    h: int = 1,
    d: int = 32,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    off = _offsets(lengths)
    max_len = max(lengths, default=0)

    def rnd() -> torch.Tensor:
        return torch.randn(sum(lengths), h, d, generator=g, device=DEVICE).to(dtype).requires_grad_()

    q, k, v = rnd(), rnd(), rnd()
    tables = rope_tables(max(max_len, 1), d, device=DEVICE) if rope else None
    out = block_attention(q, k, v, off, max_len, block_size=block_size, rope=tables, backend="triton")
    dout = torch.randn(out.shape, generator=g, device=DEVICE).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = block_attention(q32, k32, v32, off, max_len, block_size=block_size, rope=tables, backend="reference")
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    assert out.dtype == dtype and out.shape == q.shape
    atol, rtol = TOL[dtype]["out"]
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
    atol, rtol = TOL[dtype]["grad"]
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


@needs_triton
@pytest.mark.parametrize("rope", [False, True])
def test_edges_whole_tile(rope: bool) -> None:
    _check([0, 1, 15, 16, 17, 40], block_size=16, rope=rope, h=2)


@needs_triton
@pytest.mark.parametrize("rope", [False, True])
def test_heads_inner_launch_layout(rope: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch layouts other than the defaults (1-D heads-inner vs 2-D grid, other warp
    counts) that tools/sweep_block.py tries on the GPU compute the same forward and backward
    as the reference, with several heads (the defaults are checked by every other test)."""
    from gem_kernels import _block

    monkeypatch.setitem(_block.LAUNCH, "heads_inner", not _block.LAUNCH["heads_inner"])
    monkeypatch.setitem(_block.LAUNCH, "heads_inner_bwd", not _block.LAUNCH["heads_inner_bwd"])
    monkeypatch.setitem(_block.LAUNCH, "num_warps", 8)
    monkeypatch.setitem(_block.LAUNCH, "num_warps_bwd", 2)
    _check([0, 1, 15, 16, 17, 40], block_size=16, rope=rope, h=3, seed=5)


@needs_triton
@pytest.mark.parametrize("rope", [False, True])
def test_block_smaller_than_tile(rope: bool) -> None:
    _check([4, 5, 6, 13, 0], block_size=5, rope=rope)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_with_rope(dtype: torch.dtype) -> None:
    _check([17, 1, 33], block_size=16, rope=True, dtype=dtype, d=64)


@needs_triton
def test_empty_batch_and_empty_tokens() -> None:
    for lengths in ([], [0, 0]):
        off = _offsets(lengths)
        x = torch.randn(0, 2, 32, device=DEVICE, requires_grad=True)
        out = block_attention(x, x, x, off, 0, backend="triton")
        assert out.shape == (0, 2, 32)


def test_reference_is_blockwise_softmax() -> None:
    # The definition, written out: blocks cut from each sequence's start, softmax inside.
    g = torch.Generator().manual_seed(2)
    lengths, bs, d = [7, 3], 4, 8
    q, k, v = (torch.randn(10, 1, d, generator=g) for _ in range(3))
    out = block_attention(q, k, v, torch.tensor([0, 7, 10]), 7, block_size=bs, backend="reference")
    for lo, hi in ((0, 4), (4, 7), (7, 10)):  # sample 0: [0,4) [4,7); sample 1: [7,10)
        p = torch.softmax(q[lo:hi, 0] @ k[lo:hi, 0].T / math.sqrt(d), -1)
        torch.testing.assert_close(out[lo:hi, 0], p @ v[lo:hi, 0])


def test_rope_positions_restart_per_sequence() -> None:
    # With rope, sample 1 must see positions 0.. again: equal to running it alone.
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(9, 2, 8, generator=g) for _ in range(3))
    tables = rope_tables(16, 8)
    both = block_attention(q, k, v, torch.tensor([0, 5, 9]), 5, block_size=4, rope=tables, backend="reference")
    alone = block_attention(q[5:], k[5:], v[5:], torch.tensor([0, 4]), 4, block_size=4, rope=tables, backend="reference")
    torch.testing.assert_close(both[5:], alone)
    # And rope is the rotate-half rotation (norm-preserving, identity at position 0).
    r = apply_rope_reference(q[:5], *tables)
    torch.testing.assert_close(r.norm(dim=-1), q[:5].norm(dim=-1))
    torch.testing.assert_close(r[0], q[0])


@needs_triton
def test_opcheck_custom_op() -> None:
    off = _offsets([3, 0, 5])
    q, k, v = (torch.randn(8, 1, 32, device=DEVICE, requires_grad=True) for _ in range(3))
    cos, sin = rope_tables(5, 32, device=DEVICE)
    torch.library.opcheck(
        torch.ops.gem_kernels.block_attention_fwd.default,
        (q, k, v, off, 5, 4, cos, sin, 0.3),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


@needs_triton
def test_torch_compile_fullgraph() -> None:
    off = _offsets([3, 4])
    q = torch.randn(7, 1, 32, device=DEVICE, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return block_attention(x, x, x, off, 4, block_size=2, backend="triton").sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    (g1,) = torch.autograd.grad(compiled(q), (q,))
    (g2,) = torch.autograd.grad(f(q), (q,))
    torch.testing.assert_close(g1, g2)


# --- bad inputs ------------------------------------------------------------------------------


def test_bad_inputs() -> None:
    x = torch.randn(5, 2, 32)
    off = torch.tensor([0, 2, 5])
    cos, sin = rope_tables(3, 32)
    with pytest.raises(ValueError, match="block_size=0 must be"):
        block_attention(x, x, x, off, 3, block_size=0)
    with pytest.raises(ValueError, match="backend='gpu' must be one of"):
        block_attention(x, x, x, off, 3, backend="gpu")
    with pytest.raises(ValueError, match="max_len=2 is smaller"):
        block_attention(x, x, x, off, 2)
    with pytest.raises(ValueError, match="must be equal"):
        block_attention(x, x[:4], x, off, 3)
    with pytest.raises(TypeError, match="offsets.dtype"):
        block_attention(x, x, x, off.int(), 3)
    with pytest.raises(ValueError, match=r"rope\[0\] \(cos\).shape=\(3, 32\) must be \[P, D/2\]"):
        block_attention(x, x, x, off, 3, rope=(torch.ones(3, 32), torch.ones(3, 32)))
    with pytest.raises(ValueError, match=r"rope\[0\] \(cos\).shape=\(2, 16\)"):
        block_attention(x, x, x, off, 3, rope=(cos[:2], sin[:2]))
    with pytest.raises(TypeError, match="rope must be None or a"):
        block_attention(x, x, x, off, 3, rope=cos)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size=200 must be <= 128"):
        block_attention(x, x, x, off, 3, block_size=200, backend="triton")
    with pytest.raises(ValueError, match="head dim D"):
        y = torch.randn(5, 2, 16)
        block_attention(y, y, y, off, 3, backend="triton")


# --- GPU, real sizes -------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("rope", [False, True])
def test_gpu_real_sizes(d: int, rope: bool) -> None:
    g = torch.Generator().manual_seed(d)
    lengths = torch.randint(0, 3000, (12,), generator=g).tolist() + [0, 1, 63, 64, 65]
    _check(lengths, block_size=64, rope=rope, h=4, d=d, dtype=torch.bfloat16)


@needs_triton
def test_no_grad_call_skips_autograd_and_matches() -> None:
    # Inputs that want no gradient take the bare launcher (no autograd.Function): same values
    # as the autograd path and the reference, and no graph.
    g = torch.Generator(device=DEVICE).manual_seed(5)
    lengths = [7, 0, 20, 33]
    off = _offsets(lengths)
    q, k, v = (torch.randn(sum(lengths), 2, 32, generator=g, device=DEVICE) for _ in range(3))
    bare = block_attention(q, k, v, off, 33, block_size=16, backend="triton")
    assert bare.grad_fn is None
    qg = q.clone().requires_grad_()
    tracked = block_attention(qg, k, v, off, 33, block_size=16, backend="triton")
    assert tracked.grad_fn is not None
    with torch.no_grad():
        assert block_attention(qg, k, v, off, 33, block_size=16, backend="triton").grad_fn is None
    torch.testing.assert_close(bare, tracked.detach(), atol=0, rtol=0)
    ref = block_attention(q, k, v, off, 33, block_size=16, backend="reference")
    torch.testing.assert_close(bare, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.skipif(not CUDA, reason="the cached launch runs only on CUDA (the interpreter takes Triton's path)")
def test_gpu_cached_launch_respecializes() -> None:
    # The cached launch (gem_kernels._launch) must pick a new binary whenever Triton would:
    # a misaligned view (address not 16-byte aligned), another dtype, another head count.
    from gem_kernels._block import _launchers

    lengths = [100, 1, 64, 300, 0, 65]
    off = _offsets(lengths)

    def run_and_check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        out = block_attention(q, k, v, off, 300, block_size=64)
        ref = block_attention(q.float(), k.float(), v.float(), off, 300, block_size=64, backend="reference")
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)

    check_respecializes(_launchers()[0], sum(lengths), DEVICE, 9, run_and_check)


# --- the eager fast path (one plan per call signature, gem_kernels._block._Plan) --------------


class _Ordinary:
    """Counts the calls that take the ordinary (checking) path: it is the one that calls
    check_jagged."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from gem_kernels import _block
        from gem_kernels._jagged import check_jagged as real

        self.calls = 0

        def counted(*args: object, **kwargs: object) -> torch.device:
            self.calls += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(_block, "check_jagged", counted)
        monkeypatch.setattr(_block, "_PLANS", {})
        self.plans = _block._PLANS


def _fresh(lengths: list[int], *, h: int = 2, d: int = 32, dtype: torch.dtype = torch.float32,
           seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return tuple(torch.randn(sum(lengths), h, d, generator=g, device=DEVICE).to(dtype) for _ in range(3))


def _ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, off: torch.Tensor, max_len: int, *, block_size: int,
         rope: object = None, scale: float | None = None) -> torch.Tensor:
    """The reference itself (not through block_attention: its checks are being counted)."""
    from gem_kernels._block import block_attention_reference

    return block_attention_reference(
        q.float(), k.float(), v.float(), off, block_size=block_size, rope=None if rope is None else tuple(rope),  # type: ignore[arg-type]
        scale=q.shape[2] ** -0.5 if scale is None else scale)


@needs_triton
def test_plan_serves_repeat_calls_on_fresh_data(monkeypatch: pytest.MonkeyPatch) -> None:
    # The second call with a signature skips the checks and matches the reference on new data;
    # so does a batch with other T and max_len but the same B (they are not in the signature).
    ordinary = _Ordinary(monkeypatch)
    for seed, lengths in enumerate(([7, 0, 20, 33], [7, 1, 20, 33], [40, 16, 17, 1], [1, 0, 0, 2])):
        q, k, v = _fresh(lengths, seed=seed)
        off, mx = _offsets(lengths), max(lengths)
        out = block_attention(q, k, v, off, mx, block_size=16, backend="triton")
        torch.testing.assert_close(out, _ref(q, k, v, off, mx, block_size=16), atol=2e-5, rtol=1e-4)
        assert out.grad_fn is None
    assert ordinary.calls == 1 and len(ordinary.plans) == 1
    # Inputs that want a gradient: the same plan, through the autograd.Function.
    q, k, v = (x.requires_grad_() for x in _fresh([5, 16, 3, 9], seed=7))
    off = _offsets([5, 16, 3, 9])
    out = block_attention(q, k, v, off, 16, block_size=16, backend="triton")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q32, k32, v32 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    ref = _ref(q32, k32, v32, off, 16, block_size=16)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    for got, want in zip(grads, torch.autograd.grad(ref, (q32, k32, v32), dout)):
        torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-4)
    assert ordinary.calls == 1


@needs_triton
def test_strided_offsets_match_contiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    # Offsets that are a strided view (every other element of a buffer): the kernel reads them
    # contiguously, so the launchers make them contiguous, and no plan is kept for them (the
    # plan launches the caller's pointer). Forward and backward, twice each (a second call
    # would be a plan's).
    ordinary = _Ordinary(monkeypatch)
    lengths = [9, 0, 21, 4]
    off, mx = _offsets(lengths), max(lengths)
    strided = every_other(off)
    for seed in (0, 1):
        q, k, v = (x.requires_grad_() for x in _fresh(lengths, seed=seed))
        out = block_attention(q, k, v, strided, mx, block_size=8, backend="triton")
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        q32, k32, v32 = (x.detach().clone().requires_grad_() for x in (q, k, v))
        ref = _ref(q32, k32, v32, off, mx, block_size=8)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
        for got, want in zip(grads, torch.autograd.grad(ref, (q32, k32, v32), dout)):
            torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-4)
    assert ordinary.calls == 2 and not ordinary.plans


@needs_triton
def test_plan_not_served_for_another_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each change of signature runs the checks again (and is right); a misaligned view never
    # gets a plan; a changed LAUNCH layout is a new plan.
    from gem_kernels import _block

    ordinary = _Ordinary(monkeypatch)
    lengths = [7, 0, 20, 33]
    off, mx = _offsets(lengths), 33
    tables = rope_tables(40, 32, device=DEVICE)
    base = torch.randn(3 * sum(lengths) * 2 * 32 + 1, device=DEVICE)
    misaligned = tuple(base[1 + i * sum(lengths) * 64:][: sum(lengths) * 64].view(sum(lengths), 2, 32) for i in range(3))
    assert misaligned[0].data_ptr() % 16
    cases: list[tuple[tuple[torch.Tensor, ...], dict[str, object]]] = [
        (_fresh(lengths), {"block_size": 16}),
        (_fresh(lengths, dtype=torch.bfloat16), {"block_size": 16}),
        (misaligned, {"block_size": 16}),
        (misaligned, {"block_size": 16}),
        (_fresh(lengths), {"block_size": 5}),
        (_fresh(lengths), {"block_size": 16, "rope": tables}),
        (_fresh(lengths), {"block_size": 16, "rope": list(tables)}),
        (_fresh(lengths), {"block_size": 16, "scale": 0.3}),
        (_fresh(lengths, h=3), {"block_size": 16}),
    ]
    for i, ((q, k, v), kw) in enumerate(cases):
        out = block_attention(q, k, v, off, mx, backend="triton", **kw)  # type: ignore[arg-type]
        tol = TOL[q.dtype]["out"]
        torch.testing.assert_close(out.float(), _ref(q, k, v, off, mx, **kw), atol=tol[0], rtol=tol[1])  # type: ignore[arg-type]
        assert ordinary.calls == i + 1, f"case {i} was served from another signature's plan"
    assert len(ordinary.plans) == len(cases) - 2  # the misaligned view: no plan
    monkeypatch.setitem(_block.LAUNCH, "heads_inner", not _block.LAUNCH["heads_inner"])
    q, k, v = _fresh(lengths, seed=3)
    out = block_attention(q, k, v, off, mx, block_size=16, backend="triton")
    torch.testing.assert_close(out, _ref(q, k, v, off, mx, block_size=16), atol=2e-5, rtol=1e-4)
    assert ordinary.calls == len(cases) + 1


@needs_triton
def test_plan_keeps_the_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    # With a plan for the signature, bad values still raise the ordinary path's errors: the
    # offsets' contents (read where the ordinary path reads them), max_len against the rope
    # tables, T of k, and the interpreter's environment on CPU tensors.
    _Ordinary(monkeypatch)
    lengths = [7, 0, 20, 33]
    q, k, v = _fresh(lengths)
    off = _offsets(lengths)
    tables = rope_tables(33, 32, device=DEVICE)
    for rope in (None, tables):
        block_attention(q, k, v, off, 33, block_size=16, rope=rope, backend="triton")
    if not CUDA:
        with pytest.raises(ValueError, match="max_len=20 is smaller than the longest"):
            block_attention(q, k, v, off, 20, block_size=16, backend="triton")
        bad = off.clone()
        bad[2] = bad[1] - 1
        with pytest.raises(ValueError, match="offsets must be non-decreasing"):
            block_attention(q, k, v, bad, 33, block_size=16, backend="triton")
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
            block_attention(q, k, v, off, 33, block_size=16, backend="triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match=r"rope\[0\] \(cos\).shape=\(33, 16\) must be \[P, D/2\] = \[>= max_len=34"):
        block_attention(q, k, v, off, 34, block_size=16, rope=tables, backend="triton")
    with pytest.raises(ValueError, match="must be equal"):
        block_attention(q, k[1:], v, off, 33, block_size=16, backend="triton")
    with pytest.raises(ValueError, match="max_len=-1 must be >= 0"):
        block_attention(q, k, v, off, -1, block_size=16, backend="triton")
    with pytest.raises(TypeError, match="max_len=True must be a host int"):
        block_attention(q, k, v, off, True, block_size=16, backend="triton")


@pytest.mark.skipif(not CUDA, reason="the plan's direct launch runs only on CUDA")
def test_gpu_plan_direct_launch_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # Real size (issue 15's shape: H=4, D=128, bf16, lengths up to thousands): the second call
    # goes through the plan's DirectLaunch, a batch with other T too; with a launch hook set,
    # the plan hands the launch to Triton's own path, which calls the hook.
    ordinary = _Ordinary(monkeypatch)
    g = torch.Generator().manual_seed(15)
    lengths = torch.randint(64, 3000, (24,), generator=g).tolist()
    for seed in range(3):
        if seed == 2:
            lengths = lengths[::-1][:23] + [5]
        q, k, v = _fresh(lengths, h=4, d=128, dtype=torch.bfloat16, seed=seed)
        off, mx = _offsets(lengths), max(lengths)
        out = block_attention(q, k, v, off, mx, block_size=64)
        torch.testing.assert_close(out.float(), _ref(q, k, v, off, mx, block_size=64), atol=2e-2, rtol=2e-2)
    assert ordinary.calls == 1
    (plan,) = ordinary.plans.values()
    assert plan.direct is not None
    out, seen = under_launch_hook(lambda: block_attention(q, k, v, off, mx, block_size=64))
    assert seen and ordinary.calls == 1
    torch.testing.assert_close(out.float(), _ref(q, k, v, off, mx, block_size=64), atol=2e-2, rtol=2e-2)
