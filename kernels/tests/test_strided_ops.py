"""The attention ops on q/k/v that are strided views of one fused `[T, 3, H, D]` projection.

The model hands JFA the q/k/v of its fused qkv GEMM without copies (issue 16), and
torch.compile plans buffers from the ops' fake implementations: the fakes must promise the
real outputs' shapes and strides, and the Triton results must equal the contiguous inputs'.

CPU: Triton's interpreter (TRITON_INTERPRET=1, set by Bazel) at tiny sizes.
"""

from __future__ import annotations

import os

import pytest
import torch

from gem_kernels import generalized_dot_product_attention, jagged_flash_attention

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
DEVICE = "cuda" if CUDA else "cpu"


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lengths, device=DEVICE).cumsum(0)


def _fused(t: int, h: int = 2, d: int = 16) -> tuple[torch.Tensor, ...]:
    qkv = torch.randn(t, 3, h, d, device=DEVICE, requires_grad=True)
    q, k, v = qkv.unbind(1)
    assert q.stride(0) == 3 * h * d and not q.is_contiguous()
    return qkv, q, k, v


@needs_triton
@pytest.mark.parametrize("op", ["jfa", "gdpa"])
def test_strided_views_equal_contiguous_copies(op: str) -> None:
    torch.manual_seed(0)
    off = _offsets([5, 0, 1, 17])
    qkv, q, k, v = _fused(23)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if op == "jfa":
            return jagged_flash_attention(q, k, v, off, off, 17, 17, window=4, backend="triton")
        return generalized_dot_product_attention(q, k, v, off, off, 17, 17, activation="silu", backend="triton")

    out = f(q, k, v)
    assert out.is_contiguous()
    g = torch.randn_like(out)
    (gs,) = torch.autograd.grad(out, qkv, g)
    ref = f(q.detach().contiguous().requires_grad_(), k.detach().contiguous().requires_grad_(),
            v.detach().contiguous().requires_grad_())
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    gref = torch.autograd.grad(f(qc, kc, vc), (qc, kc, vc), g)
    torch.testing.assert_close(gs, torch.stack(gref, dim=1), rtol=0, atol=0)


@needs_triton
def test_opcheck_strided_inputs() -> None:
    off = _offsets([3, 0, 6])
    _, q, k, v = _fused(9)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.gem_kernels.jfa_fwd.default,
                          (q, k, v, off, off, 6, 6, False, None, 0.25), test_utils=utils)
    torch.library.opcheck(torch.ops.gem_kernels.gdpa_fwd.default,
                          (q, k, v, off, off, 6, 6, "silu", 0.25, 6.0, False, None), test_utils=utils)


@needs_triton
def test_compile_strided_fullgraph_dynamic() -> None:
    """fullgraph (no breaks) through the custom op; new token counts and max_len stop
    recompiling once they are dynamic (the first recompile makes them so)."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    # The counters are process-wide and survive reset(): count from here (run after other
    # compiling tests in one pytest process, the absolute count was one higher).
    base = counters["stats"]["unique_graphs"]

    def f(qkv: torch.Tensor, off: torch.Tensor, max_len: int) -> torch.Tensor:
        q, k, v = qkv.unbind(1)
        return jagged_flash_attention(q * 2.0, k, v, off, off, max_len, max_len, backend="triton").sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    graphs = []
    for lengths in ([3, 4], [6, 1, 5], [2, 9, 4, 7], [5, 3, 3]):
        off = _offsets(lengths)
        qkv = torch.randn(sum(lengths), 3, 1, 16, device=DEVICE, requires_grad=True)
        (g1,) = torch.autograd.grad(compiled(qkv, off, max(lengths)), (qkv,))
        (g2,) = torch.autograd.grad(f(qkv, off, max(lengths)), (qkv,))
        torch.testing.assert_close(g1, g2)
        graphs.append(counters["stats"]["unique_graphs"] - base)
    assert graphs == [1, 2, 2, 2], graphs
