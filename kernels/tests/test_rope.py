"""rope_qkv_grad: Triton (CPU interpreter at small sizes, the GPU at real size) against the
plain-PyTorch reference and against autograd through the forward rotation."""
from __future__ import annotations

import os

import pytest
import torch

import gem_kernels
from gem_kernels._rope import rope_qkv_grad_reference, rope_qkv_grad_triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GPU = torch.cuda.is_available()


def _tables(pos: torch.Tensor, d: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    half = d // 2
    ang = pos.float()[:, None] * base ** (-torch.arange(half, dtype=torch.float32) / half)[None, :]
    return torch.cat((ang.cos(), ang.cos()), -1), torch.cat((-ang.sin(), ang.sin()), -1)


def _rotate(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """An independent forward: the four-product rotate-half form, fp32."""
    half = x.shape[-1] // 2
    ang = pos.float()[:, None, None] * base ** (-torch.arange(half, dtype=torch.float32) / half)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


def _grads(t: int, h: int, d: int, dtype: torch.dtype, device: str, seed: int, strided: bool = False):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(-3, 5000, (t,), generator=g)
    if strided:  # views with row/head strides (as out of a fused [T, 3, H, D] buffer)
        big = torch.randn(t, 3, h, d, generator=g)
        dq, dk, dv = (big[:, i] for i in range(3))
    else:
        dq, dk, dv = (torch.randn(t, h, d, generator=g) for _ in range(3))
    cos, sin = _tables(pos, d)
    to = lambda x: x.to(dtype).to(device)  # noqa: E731
    return pos, to(dq), to(dk), to(dv), cos.to(device), sin.to(device)


def test_reference_is_the_transpose_of_the_rotation() -> None:
    """autograd through an independent fp32 rotation of q and k (v passed through) = the
    reference's dqkv."""
    pos, dq, dk, dv, cos, sin = _grads(41, 3, 16, torch.float32, "cpu", 0)
    qkv = torch.randn(41, 3, 3, 16, requires_grad=True)
    q, k, v = _rotate(qkv[:, 0], pos), _rotate(qkv[:, 1], pos), qkv[:, 2]
    ((q * dq).sum() + (k * dk).sum() + (v * dv).sum()).backward()
    torch.testing.assert_close(rope_qkv_grad_reference(dq, dk, dv, cos, sin), qkv.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not INTERPRET and not GPU, reason="needs TRITON_INTERPRET=1 or a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_loop", [False, True])
@pytest.mark.parametrize("t,h,d,strided", [(1, 1, 2, False), (37, 3, 16, True), (16, 2, 32, False), (0, 2, 8, False)])
def test_triton_matches_the_reference(t: int, h: int, d: int, strided: bool, dtype: torch.dtype,
                                      head_loop: bool) -> None:
    dev = "cuda" if GPU and not INTERPRET else "cpu"
    _, dq, dk, dv, cos, sin = _grads(t, h, d, dtype, dev, t * 7 + d, strided)
    got = rope_qkv_grad_triton(dq, dk, dv, cos, sin, block_t=16, head_loop=head_loop)
    torch.testing.assert_close(got, gem_kernels.rope_qkv_grad(dq, dk, dv, cos, sin, backend="triton"), rtol=0, atol=0)
    want = rope_qkv_grad_reference(dq, dk, dv, cos, sin)
    assert got.shape == (t, 3, h, d) and got.dtype == dtype
    # The same roundings (tables to dtype, fp32 products, one rounding at the store); bf16 may
    # differ by an ulp or two (FMA contraction; the interpreter's fp32 -> bf16 conversion).
    tol = {torch.float32: 1e-6, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(got[:, 2], dv, rtol=0, atol=0)


@pytest.mark.skipif(not GPU, reason="needs a GPU")
def test_gpu_real_size_and_compiled() -> None:
    """The h200 trainer's size (263k rows, 8 heads of 128, bf16), eager and inside a compiled
    graph (the custom op), against the reference."""
    _, dq, dk, dv, cos, sin = _grads(263_661, 8, 128, torch.bfloat16, "cuda", 5)
    want = rope_qkv_grad_reference(dq, dk, dv, cos, sin)
    got = gem_kernels.rope_qkv_grad(dq, dk, dv, cos, sin)
    torch.testing.assert_close(got, want, rtol=8e-3, atol=8e-3)
    for loop in (False, True):  # both launch shapes, bitwise alike
        torch.testing.assert_close(rope_qkv_grad_triton(dq, dk, dv, cos, sin, head_loop=loop), got, rtol=0, atol=0)
    f = torch.compile(lambda *a: gem_kernels.rope_qkv_grad(*a) * 2, fullgraph=True)
    torch.testing.assert_close(f(dq, dk, dv, cos, sin), 2 * got, rtol=0, atol=0)


def test_bad_inputs_name_the_argument_and_rule() -> None:
    _, dq, dk, dv, cos, sin = _grads(9, 2, 8, torch.float32, "cpu", 1)
    with pytest.raises(ValueError, match=r"dk must have dq's shape"):
        gem_kernels.rope_qkv_grad(dq, dk[:, :1], dv, cos, sin)
    with pytest.raises(ValueError, match=r"cos must be \[T, D\]"):
        gem_kernels.rope_qkv_grad(dq, dk, dv, cos[:5], sin)
    with pytest.raises(ValueError, match=r"must share one floating dtype"):
        gem_kernels.rope_qkv_grad(dq, dk.double(), dv, cos, sin)
    with pytest.raises(ValueError, match=r"D=7 must be even"):
        gem_kernels.rope_qkv_grad(dq[..., :7], dk[..., :7], dv[..., :7], cos[:, :7], sin[:, :7])
    with pytest.raises(ValueError, match=r"backend='fast' must be"):
        gem_kernels.rope_qkv_grad(dq, dk, dv, cos, sin, backend="fast")
    if not INTERPRET:
        with pytest.raises(ValueError, match=r"backend='triton' needs CUDA tensors"):
            gem_kernels.rope_qkv_grad(dq, dk, dv, cos, sin, backend="triton")


def test_auto_takes_the_reference_where_the_kernels_rules_break() -> None:
    """backend='auto': an input the kernel refuses (D/2 not a power of two; a strided D) goes to
    the reference instead of failing (on a GPU, where auto would pick the kernel); backend='triton'
    still refuses it with the rule."""
    _, dq, dk, dv, cos, sin = _grads(11, 2, 12, torch.float32, "cuda" if GPU else "cpu", 4)
    want = rope_qkv_grad_reference(dq, dk, dv, cos, sin)
    torch.testing.assert_close(gem_kernels.rope_qkv_grad(dq, dk, dv, cos, sin), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"needs D/2 a power of two, got D=12"):
        rope_qkv_grad_triton(dq, dk, dv, cos, sin)
    wide = torch.randn(11, 2, 16, device=dq.device)[..., ::2]  # D=8 with a stride of 2
    with pytest.raises(ValueError, match=r"dq must have a unit stride on D"):
        rope_qkv_grad_triton(wide, dk[..., :8], dv[..., :8], cos[:, :8], sin[:, :8])


@pytest.mark.skipif(not INTERPRET and not GPU, reason="needs TRITON_INTERPRET=1 or a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_rot,copy", [(2, True), (2, False), (1, True), (1, False)])
@pytest.mark.parametrize("forward", [False, True])
def test_rotate_slots_in_place_and_out_of_place(n_rot: int, copy: bool, forward: bool, dtype: torch.dtype) -> None:
    """`rotate_slots_triton` into a fresh buffer, and in place (each source its own slot, a
    copied slot already in place left as is), equal each other bit for bit and the plain
    reference; `forward` is the rotation by +θ (autograd's transpose of it is the default)."""
    from gem_kernels._rope import rotate_slots, rotate_slots_reference, rotate_slots_triton

    dev = "cuda" if GPU and not INTERPRET else "cpu"
    t, h, d = 37, 3, 16
    pos, *_, cos, sin = _grads(t, h, d, dtype, dev, int(torch.randint(0, 10**6, ())))
    n = n_rot + int(copy)
    src = torch.randn(t, n, h, d).to(dtype).to(dev)
    rot = tuple(src[:, i] for i in range(n_rot))
    cp = src[:, n_rot] if copy else None
    fresh = rotate_slots_triton(rot, cp, cos, sin, torch.zeros_like(src), forward=forward)
    want = rotate_slots_reference(rot, cp, cos, sin, torch.zeros_like(src), forward=forward)
    tol = {torch.float32: 1e-6, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(fresh, want, rtol=tol, atol=tol)
    if forward and dtype == torch.float32:  # the rotation by +θ is the independent forward
        for i in range(n_rot):
            # (on the host: the tables were; a GPU's fp32 angles near 5,000 rad differ by an ulp)
            torch.testing.assert_close(fresh[:, i].cpu(), _rotate(src[:, i].cpu(), pos), rtol=1e-4, atol=1e-4)
    inplace = src.clone()
    got = rotate_slots(tuple(inplace[:, i] for i in range(n_rot)), inplace[:, n_rot] if copy else None, cos, sin,
                       inplace, forward=forward)
    assert got.data_ptr() == inplace.data_ptr()
    torch.testing.assert_close(inplace, fresh, rtol=0, atol=0)
