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

    Runs the custom op `torch.ops.gem_precision.mx_mm`, so it traces under torch.compile.
    """
    if a.data.dim() != 2 or b.data.dim() != 2 or a.dim != 1 or b.dim != 1:
        raise ValueError(f"a {tuple(a.shape)} dim={a.dim} and b {tuple(b.shape)} dim={b.dim} must be 2-D, blocked along dim 1")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"contraction sizes differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.block_size != 32 or b.block_size != 32:
        raise ValueError(f"block sizes {a.block_size}, {b.block_size} must be 32 for mx_mm")
    if bias is not None and bias.shape != (b.shape[0],):
        raise ValueError(f"{bias.shape=} must be [{b.shape[0]}]")
    be = resolve_backend(backend, a.data)
    if not torch.compiler.is_compiling():  # eager: skip the op dispatch (~0.1 ms of host time)
        return _mx_mm_impl(a, b, out_dtype, bias, be)
    u8 = torch.uint8
    out: torch.Tensor = torch.ops.gem_precision.mx_mm(
        a.data.view(u8), a.scale, a.elem_dtype, b.data.view(u8), b.scale, b.elem_dtype, out_dtype, bias, be)
    return out


@torch.library.custom_op("gem_precision::mx_mm", mutates_args=())
def mx_mm_op(a_codes: torch.Tensor, a_scale: torch.Tensor, a_elem: torch.dtype, b_codes: torch.Tensor,
             b_scale: torch.Tensor, b_elem: torch.dtype, out_dtype: torch.dtype, bias: torch.Tensor | None,
             backend: str) -> torch.Tensor:
    """[M, N] = A . B^T from the fields of two MX operands blocked by 32 along K.

    a_codes [M, K] / b_codes [N, K]: FP8 element codes as uint8 (the elements are a_elem /
    b_elem; uint8 because torch's op checks cannot compare fp8 tensors); a_scale
    [M, ceil(K/32)] / b_scale [N, ceil(K/32)] E8M0 bytes. `backend`: "triton" =
    `mx_gemm_triton` (on CUDA the path `_triton_gemm.GEMM_PATH` selects), "reference" =
    dequantize, fp32 matmul. Arguments are checked by `mx_mm`.
    """
    a = MXTensor(data=a_codes.view(a_elem), scale=a_scale, dim=1, block_size=32, elem_dtype=a_elem)
    b = MXTensor(data=b_codes.view(b_elem), scale=b_scale, dim=1, block_size=32, elem_dtype=b_elem)
    return _mx_mm_impl(a, b, out_dtype, bias, backend)


def _mx_mm_impl(a: MXTensor, b: MXTensor, out_dtype: torch.dtype, bias: torch.Tensor | None,
                backend: str) -> torch.Tensor:
    """The op's body (eager calls come here directly): the reference or the CUDA/Triton path."""
    if backend == "reference":
        return mx_mm_reference(a, b, out_dtype=out_dtype, bias=bias)
    from gem_precision._triton_gemm import mx_gemm_triton

    return mx_gemm_triton(a, b, out_dtype, bias)


@mx_mm_op.register_fake
def _mx_mm_fake(a_codes: torch.Tensor, a_scale: torch.Tensor, a_elem: torch.dtype, b_codes: torch.Tensor,
                b_scale: torch.Tensor, b_elem: torch.dtype, out_dtype: torch.dtype, bias: torch.Tensor | None,
                backend: str) -> torch.Tensor:
    return a_codes.new_empty((a_codes.shape[0], b_codes.shape[0]), dtype=out_dtype)
