"""mx_mm: the MXFP8 GEMM (reference = dequantize, then fp32 matmul)."""

from __future__ import annotations

import torch

from gem_precision._formats import MXTensor
from gem_precision._quant import Backend, resolve_backend


def mx_mm_reference(a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype = torch.bfloat16,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize both operands (exact in fp32), fp32 a @ b.T (+ bias), cast to out_dtype."""
    y = a.dequantize(torch.float32) @ b.dequantize(torch.float32).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def mx_mm(
    a: MXTensor,
    b: MXTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """C = A . B^T for MX operands both blocked along their last (contraction) dim.

    Args:
        a: [M, K] MXTensor with dim=1.
        b: [N, K] MXTensor with dim=1 (e.g. a weight [out, in]).
        out_dtype: output dtype (bf16 default; fp32 accumulation inside).
        bias: optional [N], added in fp32 before the cast.
    Returns:
        [M, N] out_dtype.
    """
    if a.data.dim() != 2 or b.data.dim() != 2 or a.dim != 1 or b.dim != 1:
        raise ValueError(f"a {tuple(a.shape)} dim={a.dim} and b {tuple(b.shape)} dim={b.dim} must be 2-D, blocked along dim 1")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"contraction sizes differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.block_size != 32 or b.block_size != 32:
        raise ValueError(f"block sizes {a.block_size}, {b.block_size} must be 32 for mx_mm")
    if bias is not None and bias.shape != (b.shape[0],):
        raise ValueError(f"{bias.shape=} must be [{b.shape[0]}]")
    if resolve_backend(backend, a.data) == "reference":
        return mx_mm_reference(a, b, out_dtype=out_dtype, bias=bias)
    from gem_precision._triton_gemm import mx_gemm_triton

    return mx_gemm_triton(a, b, out_dtype, bias)
