"""GDPA backward with the narrow tiles (dQ 64x32, dK/dV 32x64) under a bounds-checked interpreter.

Why: those tiles won the H200 backward sweep (1.61 vs 2.39 ms fwd+bwd) but a GPU run with
them as the default hit an illegal memory access (kernels/BENCHMARKS.md, GDPA). Here every
load, store and atomic of every Triton program is checked against the argument tensors'
storage (`bounds_checked`), on lengths that hit the 32- and 64-row tile edges, for the four
visibility variants; the results must also equal the reference. The same check runs over the
JFA and BlockAttention kernels. GPU (skipped without CUDA): the narrow tiles at real size,
the shape of the failed run (`test_gdpa.py::test_gpu_real_sizes`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from gem_kernels import block_attention, generalized_dot_product_attention, jagged_flash_attention
from gem_kernels._gdpa import GdpaTiles, force_tiles

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if CUDA else "cpu"

NARROW = {
    "dq": GdpaTiles(block_m=64, block_n=32, num_warps=4, num_stages=3),
    "dkdv": GdpaTiles(block_m=32, block_n=64, num_warps=4, num_stages=3),
}
VARIANTS = {
    "full": dict(causal=False, window=None),
    "causal": dict(causal=True, window=None),
    "causal_window": dict(causal=True, window=5),
    "band": dict(causal=False, window=3),
}
EDGE = [65, 0, 1, 31, 32, 33, 63, 64, 129, 17]


@pytest.fixture
def bounds_checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Makes Triton's interpreter raise on any access outside the launch's tensor arguments."""
    import triton.runtime.interpreter as interp
    from triton.tools.tensor_descriptor import TensorDescriptor

    ranges: list[tuple[int, int]] = []
    accesses: list[str] = []
    builder = interp.interpreter_builder
    init = interp.GridExecutor._init_args_hst

    def init_args(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args, kw = init(self, args_dev, kwargs)
        ranges.clear()
        for x in [*args, *kw.values()]:
            if isinstance(x, TensorDescriptor):  # its loads are checked against its base tensor
                x = x.base
            if isinstance(x, torch.Tensor):
                s = x.untyped_storage()
                ranges.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
        return args, kw

    def check(ptrs: Any, mask: Any, what: str) -> None:
        addr = ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)].astype(np.uint64)
        size = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        ok = np.zeros(addr.shape, dtype=bool)
        for lo, hi in ranges:
            ok |= (addr >= lo) & (addr + size <= hi)
        accesses.append(what)
        if not ok.all():
            raise IndexError(f"out-of-bounds {what}: {int((~ok).sum())} lanes, program {builder.grid_idx}")

    load, store, rmw = builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw

    def checked_load(ptrs: Any, mask: Any, *a: Any, **kw: Any) -> Any:  # kw: descriptor loads' cache args
        check(ptrs, mask, "load")
        return load(ptrs, mask, *a, **kw)

    def checked_store(ptrs: Any, value: Any, mask: Any, *a: Any) -> Any:
        check(ptrs, mask, "store")
        return store(ptrs, value, mask, *a)

    def checked_rmw(op: Any, ptr: Any, val: Any, mask: Any, *a: Any) -> Any:
        check(ptr, mask, "atomic")
        return rmw(op, ptr, val, mask, *a)

    monkeypatch.setattr(interp.GridExecutor, "_init_args_hst", init_args)
    monkeypatch.setattr(builder, "create_masked_load", checked_load)
    monkeypatch.setattr(builder, "create_masked_store", checked_store)
    monkeypatch.setattr(builder, "create_atomic_rmw", checked_rmw)
    yield accesses


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _gdpa_vs_reference(lengths: list[int], *, activation: str, h: int, d: int, dtype: torch.dtype,
                       atol: float, tiles: dict[str, GdpaTiles] | None = None, lk: list[int] | None = None,
                       **vis: Any) -> None:
    """GDPA with `tiles` (default NARROW) against the fp32 reference: q lengths `lengths`, kv
    lengths `lk` (default the same: self-attention)."""
    lk = lengths if lk is None else lk
    g = torch.Generator(device=DEVICE).manual_seed(sum(lengths))
    off, m, ko, mk = _offsets(lengths), max(lengths), _offsets(lk), max(lk)
    q, do = (torch.randn(sum(lengths), h, d, generator=g, device=DEVICE).to(dtype) for _ in range(2))
    k, v = (torch.randn(sum(lk), h, d, generator=g, device=DEVICE).to(dtype) for _ in range(2))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    with force_tiles(**(NARROW if tiles is None else tiles)):
        out = generalized_dot_product_attention(qg, kg, vg, off, ko, m, mk, activation=activation,
                                                backend="triton", **vis)
        grads = torch.autograd.grad(out, (qg, kg, vg), do)
    q32, k32, v32 = (x.float().requires_grad_() for x in (q, k, v))
    ref = generalized_dot_product_attention(q32, k32, v32, off, ko, m, mk, activation=activation,
                                            backend="reference", **vis)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), do.float())
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads)):
        scale = max(1.0, float(want.detach().abs().max()))
        torch.testing.assert_close(got.detach().float() / scale, want.detach() / scale, atol=atol, rtol=0, msg=lambda s: f"{name}: {s}")


@pytest.mark.skipif(not INTERPRET, reason="bounds check runs in Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_narrow_backward_in_bounds(bounds_checked: list[str], variant: str, activation: str) -> None:
    _gdpa_vs_reference(EDGE, activation=activation, h=2, d=16, dtype=torch.float32, atol=1e-4, **VARIANTS[variant])
    assert "atomic" not in bounds_checked and "store" in bounds_checked  # the checker saw the kernels


@pytest.mark.skipif(not INTERPRET, reason="bounds check runs in Triton's interpreter (TRITON_INTERPRET=1)")
def test_bounds_checker_can_fail(bounds_checked: list[str]) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def overread(x, y, N: tl.constexpr):  # type: ignore[no-untyped-def]
        i = tl.arange(0, N)
        tl.store(y + i, tl.load(x + i))

    with pytest.raises(Exception, match="out-of-bounds load"):
        overread[(1,)](torch.zeros(8), torch.zeros(64), N=16)


@pytest.mark.skipif(not INTERPRET, reason="bounds check runs in Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_jfa_and_block_in_bounds(bounds_checked: list[str], variant: str) -> None:
    lengths = [17, 0, 1, 16, 15, 33]
    off, m = _offsets(lengths), max(lengths)
    q, k, v = (torch.randn(sum(lengths), 2, 16, requires_grad=True) for _ in range(3))
    out = jagged_flash_attention(q, k, v, off, off, m, m, backend="triton", **VARIANTS[variant])  # type: ignore[arg-type]
    out.sum().backward()
    if variant == "full":  # BlockAttention has no variants; its kernels need D >= 32
        qb, kb, vb = (torch.randn(sum(lengths), 2, 32, requires_grad=True) for _ in range(3))
        block_attention(qb, kb, vb, off, m, block_size=16, backend="triton").sum().backward()
    assert "store" in bounds_checked


@pytest.mark.skipif(not INTERPRET, reason="bounds check runs in Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("variant", ["full", "causal_window"])
def test_jfa_one_pass_atomics_in_bounds(bounds_checked: list[str], variant: str) -> None:
    # The one-pass backward adds dQ with atomics per kv block; masked edge q blocks must not add
    # past a sample's rows (a zero added to the next sample is invisible in the values, one
    # past the last row is an illegal address on the GPU). Cross lengths, empty on each side.
    from gem_kernels._triton_jfa import JfaConfig, JfaTiles, force_config

    t = JfaTiles(block_m=16, block_n=32)
    lq, lk = [17, 0, 1, 16, 15, 33], [33, 15, 16, 0, 3, 17]
    qo, ko = _offsets(lq), _offsets(lk)
    q = torch.randn(sum(lq), 2, 16, requires_grad=True)
    k, v = (torch.randn(sum(lk), 2, 16, requires_grad=True) for _ in range(2))
    with force_config(JfaConfig(fwd=t, dkdv=t, dq=t, one_pass=True)):
        out = jagged_flash_attention(q, k, v, qo, ko, max(lq), max(lk), backend="triton",
                                     **VARIANTS[variant])  # type: ignore[arg-type]
        torch.autograd.grad(out.sum(), (q, k, v))
    assert "atomic" in bounds_checked


@pytest.mark.skipif(not INTERPRET, reason="bounds check runs in Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gdpa_one_pass_atomics_in_bounds(bounds_checked: list[str], variant: str) -> None:
    # GDPA's one-pass backward (the narrow dK/dV tiles adding dQ with atomics): cross lengths
    # on the 32- and 64-row edges, empty on each side, every access inside the arguments, and
    # the values the reference's.
    lk = [33, 64, 0, 1, 65, 31, 32, 63, 17, 129]
    tiles = dict(NARROW, dkdv=GdpaTiles(block_m=32, block_n=64, num_warps=4, num_stages=3, one_pass=True))
    _gdpa_vs_reference(EDGE, activation="silu", h=2, d=16, dtype=torch.float32, atol=1e-4, tiles=tiles, lk=lk,
                       **VARIANTS[variant])
    assert "atomic" in bounds_checked


@pytest.mark.skipif(not INTERPRET, reason="bounds check runs in Triton's interpreter (TRITON_INTERPRET=1)")
def test_jfa_one_pass_tma_loads_in_bounds(bounds_checked: list[str]) -> None:
    # `JfaConfig.tma_loads`: q and dO tiles through tensor descriptors over [T, H*D] (the
    # interpreter emulates them; `tma`'s bulk reduce falls back to atomics there). The last
    # sample's masked q tile reaches past T: the descriptor must clip it to the base tensor.
    from gem_kernels._triton_jfa import JfaConfig, JfaTiles, force_config

    t = JfaTiles(block_m=16, block_n=32)
    lq = [17, 0, 1, 16, 33]
    qo = _offsets(lq)
    q, k, v = (torch.randn(sum(lq), 2, 16, requires_grad=True) for _ in range(3))
    with force_config(JfaConfig(fwd=t, dkdv=t, dq=t, one_pass=True, tma=True, tma_loads=True)):
        out = jagged_flash_attention(q, k, v, qo, qo, max(lq), max(lq), backend="triton", causal=True)
        torch.autograd.grad(out.sum(), (q, k, v))
    assert "atomic" in bounds_checked and "load" in bounds_checked


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("variant", ["full", "causal"])
def test_gpu_narrow_tiles_real_size(variant: str, activation: str) -> None:
    g = torch.Generator().manual_seed(7)
    lq = torch.randint(0, 1200, (10,), generator=g).tolist() + [0, 1, 127, 128, 129]
    _gdpa_vs_reference(lq, activation=activation, h=4, d=128, dtype=torch.bfloat16, atol=3e-2, **VARIANTS[variant])
    torch.cuda.synchronize()


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("activation", ["silu", "gelu", "sigmoid"])
@pytest.mark.parametrize("tanh", [True, False])
def test_gpu_tanh_sigmoid_matches_reference(activation: str, tanh: bool) -> None:
    """The default bf16 GPU path computes sigmoid with PTX tanh.approx; both paths vs the reference."""
    import dataclasses

    from gem_kernels._gdpa import gdpa_tiles

    lq = [1000, 0, 1, 63, 64, 65, 700]
    tiles = {kind: dataclasses.replace(gdpa_tiles(max(lq), 128, kind=kind), tanh_sigmoid=tanh)
             for kind in ("fwd", "dq", "dkdv")}
    _gdpa_vs_reference(lq, activation=activation, h=2, d=128, dtype=torch.bfloat16, atol=3e-2, tiles=tiles,
                       causal=True)
