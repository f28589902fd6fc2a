"""Public MX cast: argument checks and the backend dispatch (reference | triton)."""

from __future__ import annotations

import os
from typing import Literal

import torch

from gem_precision._formats import (
    SUPPORTED_INPUT_DTYPES,
    MXTensor,
    ScaleMode,
    elem_format,
    to_mx_reference,
)

Backend = Literal["auto", "triton", "reference"]
_TRITON_BLOCKS = (16, 32, 64, 128)


def interpreting() -> bool:
    """True when Triton kernels run on the CPU through TRITON_INTERPRET=1."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_backend(backend: str, t: torch.Tensor) -> Literal["triton", "reference"]:
    """"auto" -> triton on CUDA tensors, reference elsewhere; checks an explicit choice."""
    if backend == "auto":
        return "triton" if t.is_cuda else "reference"
    if backend == "reference":
        return "reference"
    if backend == "triton":
        if not (t.is_cuda or interpreting()):
            raise ValueError(f"{backend=} needs a CUDA tensor or TRITON_INTERPRET=1 (got device {t.device})")
        return "triton"
    raise ValueError(f"{backend=} must be 'auto', 'triton' or 'reference'")


def check_mx_args(x: torch.Tensor, elem_dtype: torch.dtype, block_size: int, dim: int, scale_mode: str, pad: bool) -> int:
    """Validates to_mx's arguments; returns the non-negative dim."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"{x.dtype=} must be one of float32, bfloat16, float16")
    elem_format(elem_dtype)
    if scale_mode not in ("floor", "rceil"):
        raise ValueError(f"{scale_mode=} must be 'floor' (OCP MX spec) or 'rceil' (NVIDIA)")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"{block_size=} must be a positive int")
    if x.dim() == 0:
        raise ValueError(f"{x.shape=} must have at least one dim")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{dim=} out of range for {x.dim()}-d x")
    d = dim % x.dim()
    if x.shape[d] % block_size and not pad:
        raise ValueError(
            f"x.shape[{dim}]={x.shape[d]} must be a multiple of {block_size=} (or pass pad=True to zero-pad the last block)"
        )
    return d


def to_mx(
    x: torch.Tensor,
    *,
    elem_dtype: torch.dtype = torch.float8_e4m3fn,
    block_size: int = 32,
    dim: int = -1,
    scale_mode: ScaleMode = "floor",
    pad: bool = False,
    backend: Backend = "auto",
) -> MXTensor:
    """Quantize x to MX (OCP MX v1.0) along `dim`.

    Args:
        x: [..., n, ...] fp32 / bf16 / fp16 tensor.
        elem_dtype: torch.float8_e4m3fn (max 448) or torch.float8_e5m2 (max 57344).
        block_size: elements sharing one E8M0 scale (32 in the spec).
        dim: the blocked dimension; its size must be a multiple of block_size unless pad.
        scale_mode: "floor" (spec) or "rceil" (smallest power of two >= amax / max_elem).
        pad: zero-pad the last partial block (zeros never change a block's scale).
        backend: "auto" (Triton on CUDA, reference elsewhere), "triton" or "reference".

    Returns:
        MXTensor: data x.shape in elem_dtype, scale uint8 x.shape with n -> ceil(n/block).
    """
    d = check_mx_args(x, elem_dtype, block_size, dim, scale_mode, pad)
    be = resolve_backend(backend, x)
    if be == "reference" or block_size not in _TRITON_BLOCKS or x.numel() >= 2**31:
        return to_mx_reference(x, elem_dtype=elem_dtype, block_size=block_size, dim=d, scale_mode=scale_mode)
    from gem_precision._triton_quant import quantize_2d

    fmt = elem_format(elem_dtype)
    rceil = scale_mode == "rceil"
    if d == x.dim() - 1:
        x2 = x.reshape(-1, x.shape[-1])
        r, _ = quantize_2d(x2, fmt, block_size=block_size, rceil=rceil, row=True, col=None)
        assert r is not None
        return MXTensor(
            data=r.data.reshape(x.shape),
            scale=r.scale.reshape(*x.shape[:-1], r.scale.shape[-1]),
            dim=d, block_size=block_size, elem_dtype=elem_dtype,
        )
    if d == 0:
        x2 = x.reshape(x.shape[0], -1)
        _, c = quantize_2d(x2, fmt, block_size=block_size, rceil=rceil, row=False, col="same")
        assert c is not None
        return MXTensor(
            data=c.data.reshape(x.shape),
            scale=c.scale.reshape(c.scale.shape[0], *x.shape[1:]),
            dim=0, block_size=block_size, elem_dtype=elem_dtype,
        )
    # A middle dim: move it last, cast, move back.
    t = to_mx(x.movedim(d, -1).contiguous(), elem_dtype=elem_dtype, block_size=block_size,
              dim=-1, scale_mode=scale_mode, pad=pad, backend=be)
    return MXTensor(
        data=t.data.movedim(-1, d).contiguous(), scale=t.scale.movedim(-1, d).contiguous(),
        dim=d, block_size=block_size, elem_dtype=elem_dtype,
    )


def to_mx_2d_both(
    x: torch.Tensor,
    *,
    elem_dtype: torch.dtype = torch.float8_e4m3fn,
    scale_mode: ScaleMode = "floor",
    backend: Backend = "auto",
) -> tuple[MXTensor, MXTensor]:
    """From one read of x [R, C]: x blocked along C, and x.T [C, R] blocked along R.

    Both outputs are K-major GEMM operands (their blocked dim is the last, contiguous one):
    a weight W [N, K] gives the forward operand (along K) and W.T for the input gradient
    (along N). Partial last blocks are zero-padded (pad=True semantics).
    """
    if x.dim() != 2:
        raise ValueError(f"{x.shape=} must be 2-D [R, C]")
    check_mx_args(x, elem_dtype, 32, -1, scale_mode, True)
    be = resolve_backend(backend, x)
    if be == "reference":
        r = to_mx_reference(x, elem_dtype=elem_dtype, dim=1, scale_mode=scale_mode)
        c = to_mx_reference(x.t(), elem_dtype=elem_dtype, dim=1, scale_mode=scale_mode)
        return r, c
    from gem_precision._triton_quant import quantize_2d

    r2, c2 = quantize_2d(x, elem_format(elem_dtype), block_size=32, rceil=scale_mode == "rceil", row=True, col="t")
    assert r2 is not None and c2 is not None
    return r2, c2
